//! The notes under a diff, as values: how the trees were brought to one
//! frame (ranks unsharded, positions aligned, layouts reconciled) and what
//! the ranks say about the first diverging row. [`crate::render::note`]
//! words them, the same in the table, the JSON and the HTML.

use super::Side;
use capture::RowId;

/// One note under a diff: said, never silent.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A tree carries ranks: shards are compared as the full tensors they
    /// tile. Each side's `tp` as its manifest records it (none: one device).
    TensorParallel {
        /// A's `tp`.
        tp_a: Option<serde_json::Value>,
        /// B's `tp`.
        tp_b: Option<serde_json::Value>,
    },
    /// The per-rank partial sums were left out of the comparison.
    PartialsNotCompared {
        /// Why: only one tree has ranks, or they split over other ranks.
        why: PartialsLeftOut,
    },
    /// `--align`: position p of A is compared with position p + `shift` of B.
    Aligned {
        /// The shift, negative when A holds the extra leading tokens.
        shift: i64,
    },
    /// Declared layouts were reconciled: these stages are compared in
    /// interleaved rotary order.
    LayoutsReconciled {
        /// The stages.
        stages: Vec<String>,
    },
    /// The shards one tree holds of `row`: which rank's columns differ.
    Shards {
        /// The row.
        row: RowId,
        /// The tree whose shards these are.
        tree: Side,
        /// Per (rank, columns), the largest difference of the two full tensors there.
        shards: Vec<ShardDiff>,
    },
    /// An all-reduced tap of `row` in `tree` is not the rank-order sum of
    /// its partial sums.
    AllReduce {
        /// The row.
        row: RowId,
        /// The tree.
        tree: Side,
        /// How many of its taps are wrong that way.
        taps: usize,
        /// The first position of those taps.
        first: u32,
        /// One past their last position.
        end: u32,
        /// What is wrong with the sum.
        fault: ReduceFault,
    },
}

/// Why the per-rank partial sums were not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartialsLeftOut {
    /// Both trees have ranks, but not the same ones.
    OtherRanks,
    /// One tree has no ranks.
    NoRanks,
}

/// One rank's columns of a sharded row, against the other tree.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardDiff {
    /// The rank.
    pub rank: u32,
    /// Its first column.
    pub start: u32,
    /// One past its last column.
    pub end: u32,
    /// The largest |a - b| over those columns (infinite for a NaN); 0 is
    /// bitwise equal.
    pub max_abs: f64,
}

/// What is wrong with an all-reduced sum. Ordered as the notes list them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReduceFault {
    /// No single rank explains it.
    NotRankOrderSum {
        /// How many partial sums there are.
        partials: usize,
        /// Their stage (`ffn_down_partial`).
        partial_stage: String,
    },
    /// It is the sum of every partial sum but one rank's.
    MissingRank {
        /// The rank left out.
        rank: u32,
        /// The partial sums' stage.
        partial_stage: String,
    },
}
