//! The page every HTML report is drawn on: a headline, who the runs are, a
//! chart of error against depth with its marks, a layer × stage heatmap, the
//! red rows, every row (folded), and a panel that shows one row's
//! per-position values, inputs and details when a cell is clicked.
//!
//! A report builds a [`Page`] and calls [`Page::render`]: `taptree diff`
//! builds one from its [`crate::DiffReport`] ([`super::diff_page`]), `drift` from
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
        match self.layer {
            Some(l) => format!("L{l}/{}", self.stage),
            None => self.stage.clone(),
        }
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

const LEGEND: [(&str, Verdict, f64); 10] = [
    ("equal", Verdict::Equal, 0.0),
    ("< 1e-6", Verdict::Pass, 1e-7),
    ("< 1e-4", Verdict::Pass, 1e-5),
    ("< 1e-3", Verdict::Pass, 1e-4),
    ("< 1e-2", Verdict::Pass, 1e-3),
    ("< 0.1", Verdict::Pass, 1e-2),
    ("≥ 0.1", Verdict::Pass, 1.0),
    ("dtype/shape mismatch", Verdict::Mismatch, 0.0),
    ("degenerate", Verdict::Degenerate, 0.0),
    ("unreadable", Verdict::Unreadable, 0.0),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Page {
        let mut rows = vec![
            PageRow::new(None, "embedding", Verdict::Equal, 0.0),
            PageRow::new(Some(0), "attn", Verdict::Pass, 1e-5),
            PageRow::new(Some(0), "x</script><b>", Verdict::Fail, 0.2),
        ];
        rows[2].positions = vec![
            PosValue {
                pos: 0,
                slot: None,
                value: 1e-5,
                pass: true,
            },
            PosValue {
                pos: 1,
                slot: None,
                value: f64::NAN,
                pass: false,
            },
        ];
        rows[2].inputs = vec![1];
        rows[1].equal_runs = vec![(None, 0, 2)];
        Page {
            title: "t".into(),
            headline: "diverged".into(),
            red: true,
            value_name: "error".into(),
            rows,
            markers: vec![Marker {
                row: 2,
                kind: MarkerKind::FirstDivergence,
                label: "first diverging op".into(),
            }],
            ..Default::default()
        }
    }

    fn data(html: &str) -> Value {
        let tag = "id=\"taptree-data\">";
        let start = html.find(tag).unwrap() + tag.len();
        let end = start + html[start..].find("</script>").unwrap();
        serde_json::from_str(&html[start..end]).unwrap()
    }

    #[test]
    fn a_name_cannot_close_the_script_and_reads_back() {
        let html = page().render();
        assert_eq!(html.matches("</script>").count(), 2, "{html}");
        assert!(!html.contains("x</script><b>"));
        assert!(!html[..html.find("<script").unwrap()].contains("<b>"));
        let d = data(&html);
        assert_eq!(d["rows"][2]["n"], "L0/x</script><b>");
        // Not finite is null; failing positions by index; equal runs.
        assert_eq!(d["rows"][2]["y"], json!([1e-5, null]));
        assert_eq!(d["rows"][2]["f"], json!([1]));
        assert_eq!(d["rows"][2]["i"], json!([1]));
        assert_eq!(d["rows"][1]["e"], json!([[0, 2, null]]));
        assert!(d["rows"][0].get("f").is_none());
    }

    #[test]
    fn the_summary_reads_without_the_script() {
        let html = page().render();
        let body = &html[..html.find("<script").unwrap()];
        // The marker as a sentence and in the chart, the red row in its table.
        assert!(body.contains(
            "first diverging op: <a href=\"#row=L0/x&lt;/script&gt;&lt;b&gt;\" data-row=\"2\">"
        ));
        assert!(body.contains("first diverging op L0/x&lt;/script&gt;"));
        assert!(body.contains("<h2>Red rows (1)</h2>"));
        assert!(body.contains("<svg class=\"chart\""));
        let mut ok = page();
        ok.rows.truncate(2);
        ok.markers.clear();
        assert!(ok.render().contains("<p>No red rows.</p>"));
    }
}
