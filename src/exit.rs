//! Exit codes, documented in `taptree --help` and docs/GUIDE.md.
//!
//! A tool failure must never read as a model defect (1) nor as agreement (0).

/// Identical, or within tolerance; a command that did its job.
pub const OK: u8 = 0;
/// The trees diverge (diff, verify A B), or a bisect found its answer red.
pub const DIVERGED: u8 = 1;
/// Could not compare: missing or incomplete tree, corrupt file, bad input,
/// a failed control, an unsupported model. Never a verdict on the model.
pub const COULD_NOT_COMPARE: u8 = 2;

/// The exit code of a diff's outcome: 0 agreement, 1 diverged, 2 anything
/// that is not a verdict (inconclusive, a failed control, an unreadable tap).
pub fn of_outcome(outcome: diff::DiffOutcome) -> u8 {
    use diff::DiffOutcome::*;
    match outcome {
        Identical | WithinTolerance => OK,
        Diverged => DIVERGED,
        Inconclusive | ControlFailed | Unreadable => COULD_NOT_COMPARE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diff::DiffOutcome;

    #[test]
    fn only_agreement_is_0_and_only_divergence_is_1() {
        assert_eq!(of_outcome(DiffOutcome::Identical), OK);
        assert_eq!(of_outcome(DiffOutcome::WithinTolerance), OK);
        assert_eq!(of_outcome(DiffOutcome::Diverged), DIVERGED);
        for not_a_verdict in [
            DiffOutcome::Inconclusive,
            DiffOutcome::ControlFailed,
            DiffOutcome::Unreadable,
        ] {
            assert_eq!(of_outcome(not_a_verdict), COULD_NOT_COMPARE);
        }
    }
}
