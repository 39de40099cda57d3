//! JSON: the report serialized (schema in docs/GUIDE.md). Infinite and NaN
//! numbers (SQNR of identical tensors, undefined errors) become `null`. A
//! row's `positions` lists only the positions that are not bitwise equal (and
//! always the worst one, which `worst` indexes): equal positions would be the
//! bulk of the output and say nothing; `total` still counts them.

use crate::report::{Position, Report, Row};
use crate::stat::StatReport;

pub fn render(report: &Report) -> String {
    let mut out = Vec::new();
    write(report, &mut out).expect("writing to memory does not fail");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// [`render`] written to `w` as it is serialized (a large report is never
/// held whole as text).
pub fn write(report: &Report, mut w: impl std::io::Write) -> std::io::Result<()> {
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
            }
        })
        .collect();
    let report = Report {
        rows,
        ..report.clone_without_rows()
    };
    serde_json::to_writer_pretty(&mut w, &report).map_err(std::io::Error::from)?;
    w.write_all(b"\n")
}

pub fn render_stat(stat: &StatReport) -> String {
    let mut s = serde_json::to_string_pretty(stat).expect("a stat report always serializes");
    s.push('\n');
    s
}
