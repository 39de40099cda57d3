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
    only_in_a: Keys<'r>,
    only_in_b: Keys<'r>,
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

/// Keys as the schema writes them (`L1/ffn_gate@3`), each written
/// straight into the output rather than first into a `String` of its own.
struct Keys<'r>(&'r [capture::Key]);

impl Serialize for Keys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(crate::report::KeyText))
    }
}

/// The report as JSON text.
pub fn render(report: &DiffReport) -> String {
    let mut out = Vec::new();
    write(report, &mut out).expect("writing to memory does not fail");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// [`render`] written to `w` as it is serialized (a large report is never
/// held whole as text). The rows, most of a report's text, are written on
/// every core, a batch of `ROWS_AT_ONCE` (64) at a time, each at the depth it
/// has in the document, and put in place of the empty list that the rest of
/// the document is written with: the same bytes as one pass.
pub fn write(report: &DiffReport, mut w: impl std::io::Write) -> std::io::Result<()> {
    let json = document(report);
    let mut doc = Vec::new();
    serde_json::to_writer_pretty(&mut doc, &json).map_err(std::io::Error::from)?;
    // The first field at the top level named `rows` (a string's newlines
    // are escaped, so no string holds this text).
    const EMPTY: &[u8] = b"\n  \"rows\": []";
    let at = doc
        .windows(EMPTY.len())
        .position(|t| t == EMPTY)
        .filter(|_| !report.rows.is_empty());
    let Some(at) = at else {
        w.write_all(&doc)?;
        return w.write_all(b"\n");
    };
    w.write_all(&doc[..at])?;
    w.write_all(b"\n  \"rows\": [")?;
    for (n, batch) in report.rows.chunks(ROWS_AT_ONCE).enumerate() {
        use rayon::prelude::*;
        let texts = batch
            .par_iter()
            .map(row_text)
            .collect::<std::io::Result<Vec<Vec<u8>>>>()?;
        for (i, text) in texts.iter().enumerate() {
            w.write_all(if n == 0 && i == 0 { b"\n" } else { b",\n" })?;
            w.write_all(text)?;
        }
    }
    w.write_all(b"\n  ]")?;
    w.write_all(&doc[at + EMPTY.len()..])?;
    w.write_all(b"\n")
}

/// The report's document with its rows left out (an empty list).
fn document(report: &DiffReport) -> Json<'_> {
    Json {
        schema: report.schema,
        a: &report.a,
        b: &report.b,
        truth: report.truth.as_ref(),
        tolerance: report.tolerance.to_string(),
        outcome: report.outcome,
        summary: super::summary::summary(report),
        rows: Vec::new(),
        first_divergence: report.first_divergence,
        first_inexact: report.first_inexact,
        common_only: report.common_only,
        growth_ranking: &report.growth_ranking,
        only_in_a: Keys(&report.only_in_a),
        only_in_b: Keys(&report.only_in_b),
        inputs_split: report.inputs_split.as_ref(),
        counts: &report.counts,
        controls: report.controls.iter().map(JsonControl::new).collect(),
        notes: report.notes.iter().map(super::note).collect(),
    }
}

/// How many rows are written on every core at once: enough to share, few
/// enough that a batch of rows listing every position stays small.
const ROWS_AT_ONCE: usize = 64;

/// One row as the document holds it: pretty-printed, every line indented
/// by the two levels of the `rows` list (4 spaces).
fn row_text(row: &Row) -> std::io::Result<Vec<u8>> {
    let mut flat = Vec::new();
    serde_json::to_writer_pretty(&mut flat, &JsonRow::new(row)).map_err(std::io::Error::from)?;
    let mut out = Vec::with_capacity(flat.len() + flat.len() / 4);
    for line in flat.split(|&c| c == b'\n') {
        out.extend_from_slice(b"    ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.pop();
    Ok(out)
}

/// A stat report as JSON text.
pub fn render_stat(stat: &StatReport) -> String {
    let mut s = serde_json::to_string_pretty(stat).expect("a stat report always serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Acc;
    use crate::report::{Counts, Position};

    fn info(path: &str) -> TreeInfo {
        TreeInfo {
            path: path.into(),
            root: "r".repeat(64),
            taps: 3,
            bytes: 24,
            model: "m".into(),
            backend: String::new(),
            precision: "f32".into(),
        }
    }

    /// A report of `n` rows of one to three positions each, a stage name
    /// with a quote and a newline among them.
    fn report(n: usize) -> DiffReport {
        let rows = (0..n)
            .map(|i| Row {
                layer: (i % 3 != 0).then_some(i as u32),
                stage: if i == 1 {
                    "odd\"name\nhere".into()
                } else {
                    format!("s{i}")
                },
                status: Status::Pass,
                reasons: Vec::new(),
                cause: None,
                worst: 0,
                total: Acc::identical(8, 2).metrics(),
                positions: (0..1 + i % 3)
                    .map(|p| Position {
                        pos: p as u32,
                        slot: (p == 1).then_some(2),
                        pass: true,
                        metrics: if p == 0 {
                            Acc::default()
                        } else {
                            Acc::identical(4, 1)
                        }
                        .metrics(),
                    })
                    .collect(),
                equal: Vec::new(),
                skipped: i % 2 == 0,
                growth: None,
                truth: None,
                hint: None,
                unreadable: None,
            })
            .collect();
        DiffReport {
            schema: crate::report::SCHEMA,
            a: info("a\n\"rows\": []"),
            b: info("b"),
            truth: None,
            tolerance: crate::tolerance::Tolerance::parse("cos>=0.999").unwrap(),
            outcome: DiffOutcome::WithinTolerance,
            rows,
            first_divergence: None,
            first_inexact: None,
            common_only: false,
            growth_ranking: Vec::new(),
            only_in_a: vec!["L1/x@0".parse().unwrap()],
            only_in_b: Vec::new(),
            inputs_split: None,
            counts: Counts::default(),
            controls: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The document serialized in one pass, rows included.
    fn one_pass(report: &DiffReport) -> String {
        let mut json = document(report);
        json.rows = report.rows.iter().map(JsonRow::new).collect();
        let mut s = serde_json::to_string_pretty(&json).unwrap();
        s.push('\n');
        s
    }

    /// Rows written a batch at a time on every core and put in place are
    /// the bytes of the one-pass document: no rows, one, a batch, a batch
    /// and one, several batches.
    #[test]
    fn rows_written_on_every_core_are_the_one_pass_bytes() {
        for n in [
            0,
            1,
            2,
            ROWS_AT_ONCE,
            ROWS_AT_ONCE + 1,
            3 * ROWS_AT_ONCE + 7,
        ] {
            let r = report(n);
            let text = render(&r);
            assert_eq!(text, one_pass(&r), "{n} rows");
            let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed["rows"].as_array().unwrap().len(), n);
        }
    }
}
