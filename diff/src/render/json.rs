//! JSON: the report serialized as is (schema in docs/GUIDE.md). Infinite and
//! NaN numbers (SQNR of identical tensors, undefined errors) become `null`.

use crate::report::Report;
use crate::stat::StatReport;

pub fn render(report: &Report) -> String {
    let mut s = serde_json::to_string_pretty(report).expect("a report always serializes");
    s.push('\n');
    s
}

pub fn render_stat(stat: &StatReport) -> String {
    let mut s = serde_json::to_string_pretty(stat).expect("a stat report always serializes");
    s.push('\n');
    s
}
