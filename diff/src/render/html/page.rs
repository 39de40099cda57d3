//! The page every HTML report is drawn on: a headline, who the runs are, a
//! chart of error against depth with its marks, a layer × stage heatmap, the
//! red rows, every row (folded), and a panel that shows one row's
//! per-position values, inputs and details when a cell is clicked.
//!
//! A report builds a [`Page`] and calls [`Page::render`] (module `draw`): `taptree diff`
//! builds one from its [`crate::DiffReport`] ([`super::diff_page`]), `drift` from
//! its prompts, `replay` from its local errors. This module holds what a
//! page says; the module `draw` writes it out.

/// A row's verdict: its color, and whether it is red.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every element bitwise equal (value 0).
    Equal,
    /// Within tolerance.
    Pass,
    /// Out of tolerance.
    Fail,
    /// dtype or shape differ.
    Mismatch,
    /// Within tolerance, but a side is degenerate: not agreement.
    Degenerate,
    /// A tap could not be read: no verdict.
    Unreadable,
}

impl Verdict {
    /// The word the table and page show for it (`ok`, `FAIL`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Equal => "equal",
            Verdict::Pass => "ok",
            Verdict::Fail => "FAIL",
            Verdict::Mismatch => "MISMATCH",
            Verdict::Degenerate => "DEGENERATE",
            Verdict::Unreadable => "UNREADABLE",
        }
    }

    /// Whether it makes the diff exit 1: out of tolerance, or dtype or shape differ.
    pub fn is_red(self) -> bool {
        matches!(self, Verdict::Fail | Verdict::Mismatch)
    }
}

/// One self-contained HTML report.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// `taptree diff`, `taptree replay`, ...
    pub title: String,
    /// The outcome in one line.
    pub headline: String,
    /// Whether the outcome is bad (the headline is shown red).
    pub red: bool,
    /// Who the runs are: `(label, text)`, one line each.
    pub facts: Vec<(String, String)>,
    /// Further lines under the facts (controls, alignment notes).
    pub notes: Vec<String>,
    /// What a row's value is: the chart's y axis and the cells' color.
    pub value_name: String,
    /// Headers of [`PageRow::cells`], shown after the op and its verdict.
    pub columns: Vec<String>,
    /// The rows in forward order.
    pub rows: Vec<PageRow>,
    /// Other values per row, drawn in the chart as dashed lines.
    pub series: Vec<Series>,
    /// Rows the chart and the summary point at.
    pub markers: Vec<Marker>,
    /// Each position's token as text (index = position), where known.
    pub tokens: Vec<String>,
    /// Positions below this one are the prompt (prefill), the rest decode.
    pub prompt_len: Option<u32>,
}

/// One (layer, stage) row, or one global row (`layer: None`).
#[derive(Debug, Clone)]
pub struct PageRow {
    /// The row's layer, `None` for a global stage.
    pub layer: Option<u32>,
    /// The stage name.
    pub stage: String,
    /// How the row compares.
    pub verdict: Verdict,
    /// The row's value (its worst position's): 0 is exact; not finite is
    /// drawn at the top of the chart.
    pub value: f64,
    /// Table cells, one per [`Page::columns`].
    pub cells: Vec<String>,
    /// Per-position values: the strip shown when the row is opened.
    pub positions: Vec<PosValue>,
    /// `(slot, start, end)`: positions `start..end` whose value is 0 without
    /// having been listed in `positions` (equal by hash, never read).
    pub equal_runs: Vec<(Option<u32>, u32, u32)>,
    /// Indices of the rows this row reads (the stage graph).
    pub inputs: Vec<usize>,
    /// Further sections of the row's panel (statistics, causes).
    pub details: Vec<Detail>,
    /// This row's own tokens by position, where its positions are not the
    /// page's (one prompt of many); empty: [`Page::tokens`].
    pub tokens: Vec<String>,
}

impl PageRow {
    /// A row with its verdict and value only; fill in what it has
    /// (`positions`, `inputs`, `cells`, `details`) after.
    pub fn new(layer: Option<u32>, stage: &str, verdict: Verdict, value: f64) -> PageRow {
        PageRow {
            layer,
            stage: stage.to_string(),
            verdict,
            value,
            cells: Vec::new(),
            positions: Vec::new(),
            equal_runs: Vec::new(),
            inputs: Vec::new(),
            details: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// `L3/ffn_down` or `logits`.
    pub fn name(&self) -> String {
        capture::RowId::new(self.layer, self.stage.as_str()).to_string()
    }
}

/// One position's value.
#[derive(Debug, Clone, Copy)]
pub struct PosValue {
    /// The token position.
    pub pos: u32,
    /// The slot, `None` in a single-sequence tree.
    pub slot: Option<u32>,
    /// The position's value (as [`PageRow::value`]).
    pub value: f64,
    /// Whether the position is within tolerance.
    pub pass: bool,
}

/// A titled block of lines in a row's panel.
#[derive(Debug, Clone)]
pub struct Detail {
    /// The section's heading.
    pub title: String,
    /// Its lines, shown as preformatted text.
    pub lines: Vec<String>,
}

/// A further value per row (`values[i]` for row `i`), drawn dashed.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its name in the chart's legend.
    pub name: String,
    /// The value of each row, `None` where it has none.
    pub values: Vec<Option<f64>>,
}

/// What a marker points out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// The first op out of tolerance.
    FirstDivergence,
    /// The largest increase of error over an op's inputs.
    LargestGrowth,
    /// The largest error of an op recomputed from its own inputs (replay).
    LargestLocal,
    /// Anything else (the first inexact op, where answers part).
    Note,
}

impl MarkerKind {
    pub(super) fn color(self) -> &'static str {
        match self {
            MarkerKind::FirstDivergence => "#b71c1c",
            MarkerKind::LargestGrowth => "#ef6c00",
            MarkerKind::LargestLocal => "#6a1b9a",
            MarkerKind::Note => "#546e7a",
        }
    }
}

/// A row pointed out, with what to say about it.
#[derive(Debug, Clone)]
pub struct Marker {
    /// The index of the row in [`Page::rows`].
    pub row: usize,
    /// What kind of point it is (sets its color).
    pub kind: MarkerKind,
    /// `first diverging op`, `largest error growth (+3.1e-2)`.
    pub label: String,
}

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `1.23e-4`, `0`, `inf`, `NaN`.
pub fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

/// Cell background: the verdict first (mismatch, degenerate), then the value.
pub(super) fn color(verdict: Verdict, value: f64) -> &'static str {
    match verdict {
        Verdict::Mismatch => "#7b1fa2",
        Verdict::Degenerate => "#f9a825",
        Verdict::Unreadable => "#616161",
        Verdict::Equal => "#e8f5e9",
        _ if !value.is_finite() || value >= 1e-1 => "#b71c1c",
        _ if value >= 1e-2 => "#e53935",
        _ if value >= 1e-3 => "#ff8a65",
        _ if value >= 1e-4 => "#ffe0b2",
        _ if value >= 1e-6 => "#c8e6c9",
        _ => "#a5d6a7",
    }
}
