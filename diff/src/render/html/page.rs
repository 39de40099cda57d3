//! The page every HTML report is drawn on: a headline, who the runs are, a
//! chart of error against depth with its marks, a layer × stage heatmap, the
//! red rows, every row (folded), and a panel that shows one row's
//! per-position values, inputs and details when a cell is clicked.
//!
//! A report builds a [`Page`] and calls [`Page::render`]: `taptree diff`
//! builds one from its [`crate::Report`] ([`super::diff_page`]), `drift` from
//! its prompts, `replay` from its local errors. Everything the summary says
//! (chart, marks, red rows) is HTML and SVG written here, readable without
//! JavaScript; the per-position data is one compact JSON block that the
//! page's script turns into a panel only when a row is opened, so a report of
//! a large tree stays light to load.

use super::chart;
use serde_json::{json, Value};
use std::fmt::Write as _;

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
    /// A tap of the row could not be read.
    Unreadable,
}

impl Verdict {
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
    pub layer: Option<u32>,
    pub stage: String,
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
    /// `L3/ffn_down` or `logits`.
    pub fn name(&self) -> String {
        match self.layer {
            Some(l) => format!("L{l}/{}", self.stage),
            None => self.stage.clone(),
        }
    }
}

/// One position's value.
#[derive(Debug, Clone, Copy)]
pub struct PosValue {
    pub pos: u32,
    pub slot: Option<u32>,
    pub value: f64,
    pub pass: bool,
}

/// A titled block of lines in a row's panel.
#[derive(Debug, Clone)]
pub struct Detail {
    pub title: String,
    pub lines: Vec<String>,
}

/// A further value per row (`values[i]` for row `i`), drawn dashed.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
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
    pub row: usize,
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
        Verdict::Equal => "#e8f5e9",
        Verdict::Unreadable => "#616161",
        _ if !value.is_finite() || value >= 1e-1 => "#b71c1c",
        _ if value >= 1e-2 => "#e53935",
        _ if value >= 1e-3 => "#ff8a65",
        _ if value >= 1e-4 => "#ffe0b2",
        _ if value >= 1e-6 => "#c8e6c9",
        _ => "#a5d6a7",
    }
}

const LEGEND: [(&str, Verdict, f64); 9] = [
    ("equal", Verdict::Equal, 0.0),
    ("< 1e-6", Verdict::Pass, 1e-7),
    ("< 1e-4", Verdict::Pass, 1e-5),
    ("< 1e-3", Verdict::Pass, 1e-4),
    ("< 1e-2", Verdict::Pass, 1e-3),
    ("< 0.1", Verdict::Pass, 1e-2),
    ("≥ 0.1", Verdict::Pass, 1.0),
    ("dtype/shape mismatch", Verdict::Mismatch, 0.0),
    ("degenerate", Verdict::Degenerate, 0.0),
];

impl Page {
    /// The whole file: inline CSS, SVG and script; nothing is fetched.
    pub fn render(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
            esc(&self.title),
            include_str!("report.css")
        );
        let _ = write!(
            h,
            "<h1>{}</h1><p class=\"headline {}\">{}</p><table class=\"facts\">",
            esc(&self.title),
            if self.red { "red" } else { "ok" },
            esc(&self.headline)
        );
        for (label, text) in &self.facts {
            let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(label), esc(text));
        }
        h.push_str("</table>");
        for n in &self.notes {
            let _ = write!(h, "<p class=\"note\">{}</p>", esc(n));
        }
        self.marks(&mut h);
        if !self.rows.is_empty() {
            let _ = write!(h, "<h2>Error against depth</h2>{}", chart::render(self));
            self.heatmap(&mut h);
            h.push_str("<div id=\"panel\" hidden></div>");
            self.tables(&mut h);
        }
        let _ = writeln!(
            h,
            "<script type=\"application/json\" id=\"taptree-data\">{}</script><script>{}</script></body></html>",
            self.data(),
            include_str!("report.js")
        );
        h
    }

    /// The markers as sentences: the summary without the chart.
    fn marks(&self, h: &mut String) {
        if self.markers.is_empty() {
            return;
        }
        h.push_str("<ul class=\"marks\">");
        for m in &self.markers {
            let r = &self.rows[m.row];
            let _ = write!(
                h,
                "<li><span class=\"swatch\" style=\"background:{}\"></span>{}: <a href=\"#row={}\" data-row=\"{}\">{}</a> ({} {})</li>",
                m.kind.color(),
                esc(&m.label),
                esc(&r.name()),
                m.row,
                esc(&r.name()),
                esc(&self.value_name),
                num(r.value)
            );
        }
        h.push_str("</ul>");
    }

    fn cell(&self, h: &mut String, i: usize) {
        let r = &self.rows[i];
        let marked = self.markers.iter().any(|m| m.row == i);
        let _ = write!(
            h,
            "<td{} data-row=\"{i}\" data-name=\"{}\" style=\"background:{}\" title=\"{} {} {}\"></td>",
            if marked { " class=\"mark\"" } else { "" },
            esc(&r.name()),
            color(r.verdict, r.value),
            esc(&r.name()),
            r.verdict.label(),
            num(r.value)
        );
    }

    /// Layers down, per-layer stages across; global rows in their own line.
    fn heatmap(&self, h: &mut String) {
        let mut stages: Vec<&str> = Vec::new();
        let mut layers: Vec<u32> = Vec::new();
        let mut at = std::collections::HashMap::new();
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(l) = r.layer {
                if !stages.contains(&r.stage.as_str()) {
                    stages.push(&r.stage);
                }
                if !layers.contains(&l) {
                    layers.push(l);
                }
                at.insert((l, r.stage.as_str()), i);
            }
        }
        h.push_str("<h2>Layer × stage</h2><p class=\"dim\">click a cell for its positions, inputs and statistics</p>");
        if !layers.is_empty() {
            h.push_str("<table class=\"heat\"><tr><th></th>");
            for s in &stages {
                let _ = write!(h, "<th class=\"s\">{}</th>", esc(s));
            }
            h.push_str("</tr>");
            for l in &layers {
                let _ = write!(h, "<tr><th>L{l}</th>");
                for s in &stages {
                    match at.get(&(*l, *s)) {
                        Some(&i) => self.cell(h, i),
                        None => h.push_str("<td class=\"none\"></td>"),
                    }
                }
                h.push_str("</tr>");
            }
            h.push_str("</table>");
        }
        h.push_str("<div class=\"globals\">");
        for (i, r) in self
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.layer.is_none())
        {
            h.push_str("<table class=\"heat\"><tr>");
            self.cell(h, i);
            let _ = write!(h, "<th>{}</th></tr></table>", esc(&r.stage));
        }
        let _ = write!(h, "</div><p class=\"dim\">{}: ", esc(&self.value_name));
        for (label, verdict, value) in LEGEND {
            let _ = write!(
                h,
                "<span class=\"swatch\" style=\"background:{}\"></span>{label} ",
                color(verdict, value)
            );
        }
        h.push_str("; outlined: a marked op</p>");
    }

    fn table(&self, h: &mut String, rows: impl Iterator<Item = usize>) {
        h.push_str("<table class=\"rows\"><tr><th>op</th><th>verdict</th>");
        for c in &self.columns {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr>");
        for i in rows {
            let r = &self.rows[i];
            let _ = write!(
                h,
                "<tr data-row=\"{i}\"><td>{}</td><td class=\"{}\">{}</td>",
                esc(&r.name()),
                if r.verdict.is_red() { "red" } else { "ok" },
                r.verdict.label()
            );
            for c in &r.cells {
                let _ = write!(h, "<td>{}</td>", esc(c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }

    fn tables(&self, h: &mut String) {
        let red: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].verdict.is_red())
            .collect();
        if red.is_empty() {
            h.push_str("<h2>Red rows</h2><p>No red rows.</p>");
        } else {
            let _ = write!(h, "<h2>Red rows ({})</h2>", red.len());
            self.table(h, red.into_iter());
        }
        let _ = write!(
            h,
            "<details><summary>All {} rows</summary>",
            self.rows.len()
        );
        self.table(h, 0..self.rows.len());
        h.push_str("</details>");
    }

    /// What the script needs to draw a panel, compactly: short keys,
    /// values to three significant digits, `null` for not finite.
    fn data(&self) -> String {
        let rows: Vec<Value> = self.rows.iter().map(row_data).collect();
        let v = json!({
            "value": self.value_name,
            "tokens": self.tokens,
            "prompt": self.prompt_len,
            "rows": rows,
        });
        // Nothing in the block may close the script element.
        v.to_string().replace('<', "\\u003c")
    }
}

fn short(x: f64) -> Value {
    if x.is_finite() {
        let r: f64 = format!("{x:.2e}").parse().unwrap_or(x);
        json!(r)
    } else {
        Value::Null
    }
}

fn row_data(r: &PageRow) -> Value {
    let mut o = json!({
        "n": r.name(),
        "v": r.verdict.label(),
        "x": short(r.value),
        "p": r.positions.iter().map(|p| p.pos).collect::<Vec<_>>(),
        "y": r.positions.iter().map(|p| short(p.value)).collect::<Vec<_>>(),
    });
    let failing: Vec<usize> = (0..r.positions.len())
        .filter(|&i| !r.positions[i].pass)
        .collect();
    if !failing.is_empty() {
        o["f"] = json!(failing);
    }
    if r.positions.iter().any(|p| p.slot.is_some()) {
        o["s"] = json!(r.positions.iter().map(|p| p.slot).collect::<Vec<_>>());
    }
    if !r.equal_runs.is_empty() {
        o["e"] = json!(r
            .equal_runs
            .iter()
            .map(|(s, a, b)| json!([a, b, s]))
            .collect::<Vec<_>>());
    }
    if !r.inputs.is_empty() {
        o["i"] = json!(r.inputs);
    }
    if !r.tokens.is_empty() {
        o["t"] = json!(r.tokens);
    }
    if !r.details.is_empty() {
        o["d"] = json!(r
            .details
            .iter()
            .map(|d| json!([d.title, d.lines]))
            .collect::<Vec<_>>());
    }
    o
}
