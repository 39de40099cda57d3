//! The result of a diff. It holds values only; the renderers in
//! [`crate::render`] format it (the summary line too) and never recompute a
//! metric.
//!
//! The JSON rendering is this structure serialized with its summary (schema
//! in docs/GUIDE.md); `schema` is bumped on any incompatible change.

use crate::metrics::Metrics;
pub use crate::tolerance::Reason;
use serde::{Deserialize, Serialize};

mod control;
mod notes;

pub(crate) use control::KeyText;
pub use control::{Control, ControlName, Finding, Flagged};
pub use notes::{Note, PartialsLeftOut, ReduceFault, ShardDiff};

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
    /// The tolerance (shown as written: `cos>=0.999 & nmse<=1e-4`).
    pub tolerance: crate::tolerance::Tolerance,
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
    pub only_in_a: Vec<capture::Key>,
    /// Keys (one per position) present in B only.
    pub only_in_b: Vec<capture::Key>,
    /// Where the two runs' input tokens part (greedy generation chose
    /// differently): positions from there on are not compared.
    pub inputs_split: Option<crate::inputs::InputSplit>,
    /// How much work the diff did, and what it found.
    pub counts: Counts,
    /// The controls run beside the diff (`--controls`), if any.
    pub controls: Vec<Control>,
    /// How the trees were brought to one frame before comparing (declared
    /// layouts reconciled, positions aligned, ranks unsharded) and what the
    /// ranks say: said, never silent.
    pub notes: Vec<Note>,
}

/// Which tree: A or B (serialized as `A` or `B`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Side {
    /// The reference.
    A,
    /// The tree compared with it.
    B,
}

impl Side {
    /// `A` or `B`, as every renderer names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
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

/// One (layer, stage) of the forward.
#[derive(Debug, Clone)]
pub struct Row {
    /// The layer, or none for a stage outside the layers.
    pub layer: Option<u32>,
    /// The stage.
    pub stage: String,
    /// The verdict.
    pub status: Status,
    /// The failing comparisons at the worst position, or the mismatch (the
    /// renderers word them: [`crate::render::reason`]).
    pub reasons: Vec<Reason>,
    /// For a red row, whether it originated the divergence or inherited it.
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
    pub equal: Vec<EqualRun>,
    /// Whether every compared tap of this row was skipped as equal by hash.
    pub skipped: bool,
    /// How much error the op adds to its inputs'.
    pub growth: Option<Growth>,
    /// With a truth, which side is closer to it.
    pub truth: Option<TruthVerdict>,
    /// A red row that looks like a layout difference ("layout?").
    pub hint: Option<LayoutHint>,
    /// Why a tap of this row could not be read (status `unreadable`).
    pub unreadable: Option<Unreadable>,
}

/// A near-zero red row whose reader agrees: the engines may order the
/// tensor's width differently ([`crate::hints`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutHint {
    /// The row's cosine at its worst position.
    pub cos: f64,
    /// The green row that reads it.
    pub reader: capture::RowId,
}

/// Why a tap could not be read: the error itself, shared (rows are cloned
/// for the renderers, and an io error is not `Clone`).
pub type Unreadable = std::sync::Arc<capture::Error>;

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

fn is_zero(n: &u64) -> bool {
    *n == 0
}
