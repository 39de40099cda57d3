//! JSON: the report serialized (schema in docs/GUIDE.md), with its one-line
//! summary. Infinite and NaN numbers (SQNR of identical tensors, undefined
//! errors) become `null`. A row's `positions` lists only the positions that
//! are not bitwise equal (and always the worst one, which `worst` indexes):
//! equal positions would be the bulk of the output and say nothing; `total`
//! still counts them.

use crate::inputs::InputSplit;
use crate::metrics::Metrics;
use crate::report::{
    Cause, Control, Counts, DiffOutcome, DiffReport, Flagged, Growth, Position, Row, Status,
    TreeInfo, TruthVerdict,
};
use crate::stat::StatReport;
use serde::Serialize;

/// The report as JSON: its fields in order, the summary after the outcome.
#[derive(Serialize)]
struct Json<'r> {
    schema: u32,
    a: &'r TreeInfo,
    b: &'r TreeInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    truth: Option<&'r TreeInfo>,
    tolerance: String,
    outcome: DiffOutcome,
    summary: String,
    rows: Vec<JsonRow<'r>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_divergence: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_inexact: Option<usize>,
    common_only: bool,
    growth_ranking: &'r [usize],
    only_in_a: Vec<String>,
    only_in_b: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inputs_split: Option<&'r InputSplit>,
    counts: &'r Counts,
    controls: Vec<JsonControl<'r>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// A [`Row`] as the schema has it: its reasons, hint and unreadable tap in
/// words, and only the positions that are not bitwise equal (and the worst).
#[derive(Serialize)]
struct JsonRow<'r> {
    layer: Option<u32>,
    stage: &'r str,
    status: Status,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'r Cause>,
    worst: usize,
    total: &'r Metrics,
    positions: Vec<&'r Position>,
    skipped: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    growth: Option<&'r Growth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truth: Option<&'r TruthVerdict>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
}

impl<'r> JsonRow<'r> {
    fn new(row: &'r Row) -> JsonRow<'r> {
        let keep = |(i, p): &(usize, &Position)| *i == row.worst || !p.metrics.bitwise();
        let kept: Vec<(usize, &Position)> = row.positions.iter().enumerate().filter(keep).collect();
        JsonRow {
            layer: row.layer,
            stage: &row.stage,
            status: row.status,
            reasons: row.reasons.iter().map(super::reason).collect(),
            cause: row.cause.as_ref(),
            worst: kept.iter().position(|(i, _)| *i == row.worst).unwrap_or(0),
            total: &row.total,
            positions: kept.into_iter().map(|(_, p)| p).collect(),
            skipped: row.skipped,
            growth: row.growth.as_ref(),
            truth: row.truth.as_ref(),
            hint: row.hint.as_ref().map(super::hint),
            unreadable: row.unreadable.as_ref().map(|e| e.to_string()),
        }
    }
}

/// A [`Control`]: its name, verdict and flagged positions, and its
/// finding in words (`detail`).
#[derive(Serialize)]
struct JsonControl<'r> {
    name: &'static str,
    passed: bool,
    detail: String,
    #[serde(skip_serializing_if = "<[Flagged]>::is_empty")]
    flagged: &'r [Flagged],
}

impl<'r> JsonControl<'r> {
    fn new(c: &'r Control) -> JsonControl<'r> {
        JsonControl {
            name: c.name().as_str(),
            passed: c.passed(),
            detail: super::finding(&c.finding),
            flagged: c.flagged(),
        }
    }
}

/// Keys as the schema writes them: `L1/ffn_gate@3`.
fn keys(keys: &[capture::Key]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// The report as JSON text.
pub fn render(report: &DiffReport) -> String {
    let mut out = Vec::new();
    write(report, &mut out).expect("writing to memory does not fail");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// [`render`] written to `w` as it is serialized (a large report is never
/// held whole as text).
pub fn write(report: &DiffReport, mut w: impl std::io::Write) -> std::io::Result<()> {
    // Borrowed row by row, with only the positions that are kept: a clone
    // of a large report is most of the time of a mostly-equal diff.
    let rows = report.rows.iter().map(JsonRow::new).collect();
    let json = Json {
        schema: report.schema,
        a: &report.a,
        b: &report.b,
        truth: report.truth.as_ref(),
        tolerance: report.tolerance.to_string(),
        outcome: report.outcome,
        summary: super::summary::summary(report),
        rows,
        first_divergence: report.first_divergence,
        first_inexact: report.first_inexact,
        common_only: report.common_only,
        growth_ranking: &report.growth_ranking,
        only_in_a: keys(&report.only_in_a),
        only_in_b: keys(&report.only_in_b),
        inputs_split: report.inputs_split.as_ref(),
        counts: &report.counts,
        controls: report.controls.iter().map(JsonControl::new).collect(),
        notes: report.notes.iter().map(super::note).collect(),
    };
    serde_json::to_writer_pretty(&mut w, &json).map_err(std::io::Error::from)?;
    w.write_all(b"\n")
}

/// A stat report as JSON text.
pub fn render_stat(stat: &StatReport) -> String {
    let mut s = serde_json::to_string_pretty(stat).expect("a stat report always serializes");
    s.push('\n');
    s
}
