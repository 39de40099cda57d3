//! JSON: the report serialized (schema in docs/GUIDE.md). Infinite and NaN
//! numbers (SQNR of identical tensors, undefined errors) become `null`. Rows
//! whose every position is bitwise equal carry no `positions` (they would be
//! the bulk of the output and say nothing); `total` still counts them.

use crate::report::{Report, Status};
use crate::stat::StatReport;

pub fn render(report: &Report) -> String {
    let mut report = report.clone();
    for row in report.rows.iter_mut().filter(|r| r.status == Status::Equal) {
        row.positions.clear();
        row.worst = 0;
    }
    let mut s = serde_json::to_string_pretty(&report).expect("a report always serializes");
    s.push('\n');
    s
}

pub fn render_stat(stat: &StatReport) -> String {
    let mut s = serde_json::to_string_pretty(stat).expect("a stat report always serializes");
    s.push('\n');
    s
}
