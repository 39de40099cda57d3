//! JSON: the report serialized (schema in docs/GUIDE.md). Infinite and NaN
//! numbers (SQNR of identical tensors, undefined errors) become `null`. A
//! row's `positions` lists only the positions that are not bitwise equal (and
//! always the worst one, which `worst` indexes): equal positions would be the
//! bulk of the output and say nothing; `total` still counts them.

use crate::report::Report;
use crate::stat::StatReport;

pub fn render(report: &Report) -> String {
    let mut report = report.clone();
    for row in &mut report.rows {
        let worst = row.worst;
        let mut kept = 0;
        let mut new_worst = 0;
        let positions = std::mem::take(&mut row.positions);
        for (i, p) in positions.into_iter().enumerate() {
            if i == worst || !p.metrics.bitwise() {
                if i == worst {
                    new_worst = kept;
                }
                kept += 1;
                row.positions.push(p);
            }
        }
        row.worst = new_worst;
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
