//! The outcome of a diff, from its rows, counts and controls. Saying it in
//! words is the renderers' ([`crate::render::summary`]); the exit code is
//! the CLI's.

use crate::report::{DiffOutcome, DiffReport};

/// Sets the outcome from the rows (again after controls are attached).
pub(crate) fn conclude(report: &mut DiffReport) {
    if report.counts.rows_unreadable > 0 {
        // A damaged tree: never identical, never agreement, never a verdict.
        report.outcome = DiffOutcome::Unreadable;
        return;
    }
    if report.controls.iter().any(|c| !c.passed()) {
        report.outcome = DiffOutcome::ControlFailed;
        return;
    }
    if report.outcome == DiffOutcome::Identical {
        return;
    }
    let one_sided = report.only_in_a.len() + report.only_in_b.len();
    report.outcome = if report.first_divergence.is_some() {
        DiffOutcome::Diverged
    } else if one_sided > 0 && !report.common_only && report.counts.positions > 0 {
        // Taps in one tree only: never agreement, unless asked for.
        DiffOutcome::Diverged
    } else if report.counts.positions == 0 || report.counts.rows_degenerate > 0 {
        DiffOutcome::Inconclusive
    } else {
        DiffOutcome::WithinTolerance
    };
}
