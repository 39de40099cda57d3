//! The result of a diff. It holds values only; the renderers in
//! [`crate::render`] format it (the summary line too) and never recompute a
//! metric.
//!
//! The JSON rendering is this structure serialized with its summary (schema
//! in docs/GUIDE.md); `schema` is bumped on any incompatible change.

use crate::metrics::{Degeneracy, Metrics};
use crate::tolerance::{Metric, Op};
use serde::{Deserialize, Serialize};

/// Version of the JSON schema of [`DiffReport`].
pub const SCHEMA: u32 = 1;

/// Everything a diff found.
#[derive(Debug, Clone)]
pub struct DiffReport {
    /// Version of this structure ([`SCHEMA`]).
    pub schema: u32,
    /// The reference tree.
    pub a: TreeInfo,
    /// The tree compared with it.
    pub b: TreeInfo,
    /// The truth, if one was given.
    pub truth: Option<TreeInfo>,
    /// The tolerance, as written (`cos>=0.999 & nmse<=1e-4`).
    pub tolerance: String,
    /// What the diff concluded.
    pub outcome: DiffOutcome,
    /// One row per (layer, stage), in forward order (empty when identical).
    pub rows: Vec<Row>,
    /// Index into `rows` of the first diverging op.
    pub first_divergence: Option<usize>,
    /// Index into `rows` of the first op that is not bitwise equal: where
    /// the two runs really start to differ, which may be ops before the
    /// first one to leave tolerance.
    pub first_inexact: Option<usize>,
    /// Taps present in one tree only were accepted (`--common-only`):
    /// they do not make the outcome diverged.
    pub common_only: bool,
    /// Rows ranked by error growth, largest jump first (indices into `rows`).
    pub growth_ranking: Vec<usize>,
    /// Keys (one per position) present in only one tree: never compared.
    pub only_in_a: Vec<String>,
    /// Keys (one per position) present in B only.
    pub only_in_b: Vec<String>,
    /// Where the two runs' input tokens part (greedy generation chose
    /// differently): positions from there on are not compared.
    pub inputs_split: Option<crate::inputs::InputSplit>,
    /// How much work the diff did, and what it found.
    pub counts: Counts,
    /// The controls run beside the diff (`--controls`), if any.
    pub controls: Vec<Control>,
    /// How the trees were brought to one frame before comparing (declared
    /// layouts reconciled, positions aligned): said, never silent.
    pub notes: Vec<String>,
}

/// What the diff concluded; maps to the exit code 0, 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffOutcome {
    /// Equal roots: every tensor bitwise identical (nothing was read).
    Identical,
    /// Every compared position within tolerance.
    WithinTolerance,
    /// At least one row fails tolerance (or mismatches in dtype/shape).
    Diverged,
    /// Nothing red, but a compared row is degenerate or nothing was comparable:
    /// agreement here proves nothing.
    Inconclusive,
    /// A control failed: the comparator itself cannot be trusted here.
    ControlFailed,
    /// A tap of a tree could not be read (a damaged tree): its row says
    /// which. Never agreement and never a verdict.
    Unreadable,
}

/// Who a tree is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TreeInfo {
    /// Where the tree is, as given.
    pub path: String,
    /// Its root hash.
    pub root: String,
    /// Its number of taps.
    pub taps: usize,
    /// Its tensor bytes.
    pub bytes: u64,
    /// The model its manifest names.
    pub model: String,
    /// The backend that captured it (`cpu`, `cuda`, ...).
    pub backend: String,
    /// Its precision mode (`f32`, `q8`, `f64`).
    pub precision: String,
}

/// How much work the diff did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Position pairs matched by key.
    pub positions: u64,
    /// Position pairs matched by key but not compared: their input tokens
    /// (or an earlier position's) differ.
    pub positions_inputs_differ: u64,
    /// Taps of A skipped as equal by hash, unread.
    pub taps_skipped: u64,
    /// Taps of A read and compared.
    pub taps_compared: u64,
    /// Tensor bytes read (A, B and truth).
    pub bytes_read: u64,
    /// Rows that fail tolerance or mismatch.
    pub rows_red: u64,
    /// Rows within tolerance only as degenerate tensors.
    pub rows_degenerate: u64,
    /// Rows with a tap that could not be read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_unreadable: u64,
    /// With a truth: rows where A is closer to it, B is, or neither clearly.
    #[serde(default)]
    pub truth_closer_a: u64,
    /// With a truth: rows where B is closer to it.
    #[serde(default)]
    pub truth_closer_b: u64,
    /// With a truth: rows where neither side is clearly closer.
    #[serde(default)]
    pub truth_neither: u64,
}

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every element bitwise equal.
    Equal,
    /// Within tolerance.
    Pass,
    /// Some position fails tolerance.
    Fail,
    /// dtype or shape differ: never green.
    Mismatch,
    /// Within tolerance, but a side is degenerate (all zero, all nonfinite,
    /// constant): not agreement.
    Degenerate,
    /// A tap of this row could not be read (`unreadable` says why).
    Unreadable,
}

impl Status {
    /// Whether the row leaves tolerance (fails, or cannot be compared element for element).
    pub fn is_red(self) -> bool {
        matches!(self, Status::Fail | Status::Mismatch)
    }
}

/// Why a red row is red.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Cause {
    /// Its inputs are bitwise equal: this op made the error.
    Origin,
    /// Its inputs are within tolerance but not bitwise equal (`from` names
    /// those): this op took a difference already there past tolerance, so
    /// it may be where the error grew or only where it showed.
    GrewFrom {
        /// The inputs within tolerance but not equal.
        from: Vec<capture::RowId>,
    },
    /// An input is already red (`from` names them, `L3/ffn_down`).
    Inherited {
        /// The red inputs.
        from: Vec<capture::RowId>,
    },
}

/// Why a row is not green, as values; [`crate::render::reason`] words it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// A and B rows have different shapes (each without its position axis).
    ShapeMismatch {
        /// A's row shape.
        a: Vec<usize>,
        /// B's row shape.
        b: Vec<usize>,
    },
    /// The dtypes differ, and are not both float.
    DtypeMismatch {
        /// A's dtype.
        a: capture::DType,
        /// B's dtype.
        b: capture::DType,
    },
    /// At the worst position, elements nonfinite on one side only.
    NonfiniteMismatch {
        /// How many.
        elements: u64,
    },
    /// The tolerance is `bitwise` and elements differ.
    NotBitwise {
        /// Elements not bitwise equal.
        differ: u64,
        /// Elements compared.
        of: u64,
    },
    /// A comparison of the tolerance whose metric is undefined (dtypes differ).
    Undefined {
        /// The metric.
        metric: Metric,
    },
    /// A comparison of the tolerance that fails at the worst position.
    Fails {
        /// The metric.
        metric: Metric,
        /// Its value there.
        value: f64,
        /// The comparison.
        op: Op,
        /// The bound it fails.
        bound: f64,
    },
    /// Within tolerance, but a side is degenerate at this position.
    Degenerate {
        /// The position.
        pos: u32,
        /// Its slot.
        slot: Option<u32>,
        /// How A is degenerate there, if it is.
        a: Option<Degeneracy>,
        /// How B is degenerate there, if it is.
        b: Option<Degeneracy>,
    },
}

/// One (layer, stage) of the forward.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The layer, or none for a stage outside the layers.
    pub layer: Option<u32>,
    /// The stage.
    pub stage: String,
    /// The verdict.
    pub status: Status,
    /// The failing comparisons at the worst position, or the mismatch (the
    /// JSON renderer words them: [`crate::render::reason`]).
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "crate::render::json::worded_reasons"
    )]
    pub reasons: Vec<Reason>,
    /// For a red row, whether it originated the divergence or inherited it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// Index into `positions` of the worst one: among failing positions (or
    /// all, if none fails) the lowest cosine, ties broken by the highest NMSE.
    pub worst: usize,
    /// All positions merged.
    pub total: Metrics,
    /// The positions that were read and compared. Positions equal by hash
    /// (never read) are in `equal` instead; a row equal by hash throughout
    /// has one position standing for them all.
    pub positions: Vec<Position>,
    /// Positions equal by hash, as runs: a mostly-equal diff would
    /// otherwise hold one full [`Position`] per position of every row that
    /// has one changed tap. Not in the JSON, which lists only positions
    /// that differ.
    #[serde(skip)]
    pub equal: Vec<EqualRun>,
    /// Whether every compared tap of this row was skipped as equal by hash.
    pub skipped: bool,
    /// How much error the op adds to its inputs'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// With a truth, which side is closer to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truth: Option<TruthVerdict>,
    /// A red row that looks like a layout difference ("layout?").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Why a tap of this row could not be read (status `unreadable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Positions `start..end` of one slot, equal by hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqualRun {
    /// Its slot, if any.
    pub slot: Option<u32>,
    /// The first position.
    pub start: u32,
    /// One past the last.
    pub end: u32,
}

impl Row {
    /// Whether position `pos` of `slot` is equal by hash (never read).
    pub fn is_equal_at(&self, pos: u32, slot: Option<u32>) -> bool {
        self.equal
            .iter()
            .any(|r| r.slot == slot && (r.start..r.end).contains(&pos))
    }

    /// `L3/ffn_down` or `logits`.
    pub fn name(&self) -> String {
        self.id().to_string()
    }

    /// The row's (layer, stage).
    pub fn id(&self) -> capture::RowId {
        capture::RowId::new(self.layer, self.stage.as_str())
    }

    /// The worst position (see `worst`).
    pub fn worst(&self) -> &Position {
        &self.positions[self.worst]
    }

    /// The first failing position of a row (in position order): where a
    /// bug starts, which may be before the worst position.
    pub fn first_failing(&self) -> Option<&Position> {
        self.positions
            .iter()
            .filter(|p| !p.pass)
            .min_by_key(|p| (p.pos, p.slot))
    }
}

/// One position of a row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Position {
    /// The position.
    pub pos: u32,
    /// Its slot, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Within tolerance.
    pub pass: bool,
    /// A against B at this position.
    pub metrics: Metrics,
}

impl Position {
    /// `@3` or `@3 slot 1`.
    pub fn label(&self) -> String {
        at_label(self.pos, self.slot)
    }
}

/// `@3`, or `@3 slot 1`: a position as the renderers name it.
pub fn at_label(pos: u32, slot: Option<u32>) -> String {
    match slot {
        Some(s) => format!("@{pos} slot {s}"),
        None => format!("@{pos}"),
    }
}

/// How much error an op adds to what its inputs carry, at its worst position.
///
/// Error is the relative RMS error `sqrt(NMSE)`. `delta` is the output's
/// error minus the largest input error at the same position (an absolute
/// increase, so the first quantized matmul, whose inputs are exact, does not
/// dwarf a real jump later); `ratio` the same as a quotient.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Growth {
    /// The position.
    pub pos: u32,
    /// Its slot, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// The largest error of its inputs at that position.
    pub input_error: f64,
    /// The op's own error there.
    pub output_error: f64,
    /// `output_error - input_error`.
    pub delta: f64,
    /// `output_error / input_error` (infinite from exact inputs).
    pub ratio: f64,
}

/// Which side is wrong, against a higher-precision truth T.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TruthVerdict {
    /// The position.
    pub pos: u32,
    /// Its slot, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Relative RMS error of A against T (T is the reference).
    pub error_a: f64,
    /// Relative RMS error of B against T.
    pub error_b: f64,
    /// Largest absolute difference of A from T.
    pub max_abs_a: f64,
    /// Largest absolute difference of B from T.
    pub max_abs_b: f64,
    /// Which side is closer.
    pub closer: Closer,
}

/// Which side a truth finds closer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Closer {
    /// A is closer to T.
    A,
    /// B is closer to T.
    B,
    /// Within 10% of each other: neither is clearly the inaccurate side.
    Neither,
    /// T has no tap for this position.
    Unknown,
}

/// A check of the comparator itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Control {
    /// `SELF`, `PERTURBED` or `FIXTURE VALIDITY`.
    pub name: String,
    /// Whether the comparator passed it.
    pub passed: bool,
    /// What was checked and found.
    pub detail: String,
    /// Degenerate taps found (FIXTURE VALIDITY).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flagged: Vec<Flagged>,
}

/// A degenerate tap position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flagged {
    /// `A` or `B`.
    pub tree: String,
    /// The position (a one-position key).
    pub key: String,
    /// How it is degenerate.
    pub what: Degeneracy,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
