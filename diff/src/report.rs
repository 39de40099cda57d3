//! The result of a diff. It holds values only; the renderers in
//! [`crate::render`] format it and never recompute a metric.
//!
//! The JSON rendering is this structure serialized (schema in docs/GUIDE.md);
//! `schema` is bumped on any incompatible change.

use crate::metrics::{Degeneracy, Metrics};
use serde::{Deserialize, Serialize};

/// Version of the JSON schema of [`Report`].
pub const SCHEMA: u32 = 1;

/// Everything a diff found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub a: TreeInfo,
    pub b: TreeInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truth: Option<TreeInfo>,
    pub tolerance: String,
    pub outcome: Outcome,
    /// One line saying why, for any outcome.
    pub summary: String,
    /// One row per (layer, stage), in forward order (empty when identical).
    pub rows: Vec<Row>,
    /// Index into `rows` of the first diverging op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_divergence: Option<usize>,
    /// Index into `rows` of the first op that is not bitwise equal: where
    /// the two runs really start to differ, which may be ops before the
    /// first one to leave tolerance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_inexact: Option<usize>,
    /// Taps present in one tree only were accepted (`--common-only`):
    /// they do not make the outcome diverged.
    #[serde(default)]
    pub common_only: bool,
    /// Rows ranked by error growth, largest jump first (indices into `rows`).
    pub growth_ranking: Vec<usize>,
    /// Keys (one per position) present in only one tree: never compared.
    pub only_in_a: Vec<String>,
    pub only_in_b: Vec<String>,
    /// Where the two runs' input tokens part (greedy generation chose
    /// differently): positions from there on are not compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs_split: Option<crate::inputs::InputSplit>,
    pub counts: Counts,
    pub controls: Vec<Control>,
    /// How the trees were brought to one frame before comparing (declared
    /// layouts reconciled, positions aligned): said, never silent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Report {
    /// Everything but the rows (renderers rebuild those as they need).
    pub fn clone_without_rows(&self) -> Report {
        Report {
            schema: self.schema,
            a: self.a.clone(),
            b: self.b.clone(),
            truth: self.truth.clone(),
            tolerance: self.tolerance.clone(),
            outcome: self.outcome,
            summary: self.summary.clone(),
            rows: Vec::new(),
            first_divergence: self.first_divergence,
            first_inexact: self.first_inexact,
            common_only: self.common_only,
            growth_ranking: self.growth_ranking.clone(),
            only_in_a: self.only_in_a.clone(),
            only_in_b: self.only_in_b.clone(),
            inputs_split: self.inputs_split.clone(),
            counts: self.counts.clone(),
            controls: self.controls.clone(),
            notes: self.notes.clone(),
        }
    }
}

/// What the diff concluded; maps to the exit code 0, 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
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
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Identical | Outcome::WithinTolerance => 0,
            Outcome::Diverged => 1,
            Outcome::Inconclusive | Outcome::ControlFailed => 2,
        }
    }
}

/// Who a tree is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TreeInfo {
    pub path: String,
    pub root: String,
    pub taps: usize,
    pub bytes: u64,
    pub model: String,
    pub backend: String,
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
    pub rows_red: u64,
    pub rows_degenerate: u64,
    /// With a truth: rows where A is closer to it, B is, or neither clearly.
    #[serde(default)]
    pub truth_closer_a: u64,
    #[serde(default)]
    pub truth_closer_b: u64,
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
}

impl Status {
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
    GrewFrom { from: Vec<String> },
    /// An input is already red (`from` names them, `L3/ffn_down`).
    Inherited { from: Vec<String> },
}

/// One (layer, stage) of the forward.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub layer: Option<u32>,
    pub stage: String,
    pub status: Status,
    /// The failing comparisons at the worst position, or the mismatch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truth: Option<TruthVerdict>,
    /// A red row that looks like a layout difference ("layout?").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// Positions `start..end` of one slot, equal by hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqualRun {
    pub slot: Option<u32>,
    pub start: u32,
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
        match self.layer {
            Some(l) => format!("L{l}/{}", self.stage),
            None => self.stage.clone(),
        }
    }

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
    pub pos: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    pub pass: bool,
    pub metrics: Metrics,
}

impl Position {
    /// `@3` or `@3 slot 1`.
    pub fn label(&self) -> String {
        match self.slot {
            Some(s) => format!("@{} slot {s}", self.pos),
            None => format!("@{}", self.pos),
        }
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
    pub pos: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    pub input_error: f64,
    pub output_error: f64,
    pub delta: f64,
    pub ratio: f64,
}

/// Which side is wrong, against a higher-precision truth T.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TruthVerdict {
    pub pos: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Relative RMS error of A against T (T is the reference).
    pub error_a: f64,
    pub error_b: f64,
    pub max_abs_a: f64,
    pub max_abs_b: f64,
    pub closer: Closer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Closer {
    A,
    B,
    /// Within 10% of each other: neither is clearly the inaccurate side.
    Neither,
    /// T has no tap for this position.
    Unknown,
}

/// A check of the comparator itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Control {
    pub name: String,
    pub passed: bool,
    pub detail: String,
    /// Degenerate taps found (FIXTURE VALIDITY).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flagged: Vec<Flagged>,
}

/// A degenerate tap position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flagged {
    pub tree: String,
    pub key: String,
    pub what: Degeneracy,
}
