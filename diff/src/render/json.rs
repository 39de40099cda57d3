//! JSON: the report serialized (schema in docs/GUIDE.md), with its one-line
//! summary. Infinite and NaN numbers (SQNR of identical tensors, undefined
//! errors) become `null`. A row's `positions` lists only the positions that
//! are not bitwise equal (and always the worst one, which `worst` indexes):
//! equal positions would be the bulk of the output and say nothing; `total`
//! still counts them.

use crate::inputs::InputSplit;
use crate::report::{Control, Counts, DiffOutcome, DiffReport, Position, Row, TreeInfo};
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
    tolerance: &'r str,
    outcome: DiffOutcome,
    summary: String,
    rows: Vec<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_divergence: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_inexact: Option<usize>,
    common_only: bool,
    growth_ranking: &'r [usize],
    only_in_a: &'r [String],
    only_in_b: &'r [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    inputs_split: Option<&'r InputSplit>,
    counts: &'r Counts,
    controls: &'r [Control],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    notes: &'r [String],
}

/// `Row::reasons` in words (the schema's list of strings).
pub(crate) fn worded_reasons<S: serde::Serializer>(
    r: &[crate::report::Reason],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(r.iter().map(super::reason))
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
    // Cloned row by row, and only the positions that are kept: a full clone
    // of a large report is most of the time of a mostly-equal diff.
    let rows = report
        .rows
        .iter()
        .map(|row| {
            let keep = |(i, p): &(usize, &Position)| *i == row.worst || !p.metrics.bitwise();
            let kept: Vec<(usize, &Position)> =
                row.positions.iter().enumerate().filter(keep).collect();
            Row {
                layer: row.layer,
                stage: row.stage.clone(),
                status: row.status,
                reasons: row.reasons.clone(),
                cause: row.cause.clone(),
                worst: kept.iter().position(|(i, _)| *i == row.worst).unwrap_or(0),
                total: row.total.clone(),
                positions: kept.into_iter().map(|(_, p)| p.clone()).collect(),
                equal: Vec::new(),
                skipped: row.skipped,
                growth: row.growth.clone(),
                truth: row.truth.clone(),
                hint: row.hint.clone(),
                unreadable: row.unreadable.clone(),
            }
        })
        .collect();
    let json = Json {
        schema: report.schema,
        a: &report.a,
        b: &report.b,
        truth: report.truth.as_ref(),
        tolerance: &report.tolerance,
        outcome: report.outcome,
        summary: super::summary::summary(report),
        rows,
        first_divergence: report.first_divergence,
        first_inexact: report.first_inexact,
        common_only: report.common_only,
        growth_ranking: &report.growth_ranking,
        only_in_a: &report.only_in_a,
        only_in_b: &report.only_in_b,
        inputs_split: report.inputs_split.as_ref(),
        counts: &report.counts,
        controls: &report.controls,
        notes: &report.notes,
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
