//! The one-line summary of a report, for any outcome: what the table ends
//! with, the HTML opens with and the JSON carries as `summary`.

use crate::report::{DiffOutcome, DiffReport, Status};
use crate::tolerance::short;

/// `diverged: first diverging op L3/ffn_down@2 (cos 0.66, 4 of 120 rows red)`,
/// `bitwise identical: ...`, and so on: one line saying why.
pub fn summary(report: &DiffReport) -> String {
    let c = &report.counts;
    let mut missing = match (report.only_in_a.len(), report.only_in_b.len()) {
        (0, 0) => String::new(),
        (x, y) => format!(" ({x} positions only in A, {y} only in B, not compared)"),
    };
    if let Some(split) = report
        .inputs_split
        .as_ref()
        .filter(|_| c.positions_inputs_differ > 0)
    {
        missing.push_str(&format!(
            " (inputs differ from position {}: {} positions not compared)",
            split.pos, c.positions_inputs_differ
        ));
    }
    // Where the runs really start to differ, when that is before the
    // first op to leave tolerance.
    let inexact = match (report.first_inexact, report.first_divergence) {
        (Some(e), d) if d.is_none_or(|d| e < d) => {
            format!("; first op not bitwise equal: {}", report.rows[e].name())
        }
        _ => String::new(),
    };
    match report.outcome {
        DiffOutcome::Identical => format!(
            "bitwise identical: {} tensors, {} bytes, root {}",
            report.a.taps,
            report.a.bytes,
            super::short_hash(&report.a.root)
        ),
        DiffOutcome::Unreadable => {
            let first = report.rows.iter().find(|r| r.status == Status::Unreadable);
            format!(
                "could not read {} of {} rows (first {}: {}): a damaged tree is never agreement",
                c.rows_unreadable,
                report.rows.len(),
                first.map_or(String::new(), |r| r.name()),
                first
                    .and_then(|r| r.unreadable.as_ref())
                    .map_or("-".to_string(), |e| e.to_string()),
            )
        }
        DiffOutcome::ControlFailed => {
            let failed: Vec<&str> = report
                .controls
                .iter()
                .filter(|c| !c.passed())
                .map(|c| c.name().as_str())
                .collect();
            format!(
                "control {} failed: this comparison cannot be trusted",
                failed.join(", ")
            )
        }
        DiffOutcome::Diverged => match report.first_divergence {
            Some(i) => {
                let r = &report.rows[i];
                let w = r.worst();
                let first = r.first_failing().unwrap_or(w);
                let worst = if first.label() == w.label() {
                    String::new()
                } else {
                    format!("worst {}, ", w.label())
                };
                format!(
                    "diverged: first diverging op {}{} ({worst}cos {}, {} of {} rows red){inexact}{missing}",
                    r.name(),
                    first.label(),
                    short(w.metrics.cos),
                    c.rows_red,
                    report.rows.len()
                )
            }
            None => format!(
                "incomplete: the trees do not hold the same taps{missing}; what both hold agrees (--common-only compares only that){inexact}"
            ),
        },
        DiffOutcome::Inconclusive if c.positions == 0 => {
            format!("no tap in common: nothing was compared{missing}")
        }
        DiffOutcome::Inconclusive => format!(
            "inconclusive: {} rows agree only as degenerate tensors (all zero, all nonfinite or constant){missing}",
            c.rows_degenerate
        ),
        DiffOutcome::WithinTolerance if report.rows.iter().all(|r| r.status == Status::Equal) => {
            format!(
                "bitwise equal by content: {} positions in {} rows{missing}",
                c.positions,
                report.rows.len()
            )
        }
        DiffOutcome::WithinTolerance => format!(
            "within tolerance ({}): {} positions in {} rows{inexact}{missing}",
            report.tolerance,
            c.positions,
            report.rows.len()
        ),
    }
}
