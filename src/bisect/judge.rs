//! Green or red: a candidate's tree against the reference, by the `diff`
//! crate (its tolerance, its first divergence, its logits metrics).

use serde::Serialize;
use std::path::{Path, PathBuf};

/// The op where a candidate first leaves tolerance.
#[derive(Debug, Clone, Serialize)]
pub struct FirstOp {
    /// `L3/ffn_down` or `logits`.
    pub op: String,
    /// The worst position, `@0` or `@2 slot 1`.
    pub at: String,
    /// `origin` or `inherited`.
    pub cause: String,
    /// Cosine at the worst position.
    pub cos: f64,
    /// The failing comparisons there (`cos 0.87 < 0.999`).
    pub reasons: Vec<String>,
    /// Its row in the diff, in forward order: trees with the same taps
    /// against one reference number their rows alike, so this orders the
    /// first divergences of different candidates.
    pub row: usize,
}

impl std::fmt::Display for FirstOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{} ({}, cos {:.6})",
            self.op, self.at, self.cause, self.cos
        )
    }
}

/// A candidate's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub red: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_op: Option<FirstOp>,
    /// The lowest cosine of the final logits over positions (1 when the
    /// trees are bitwise identical; none when no logits were tapped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logits_min_cos: Option<f64>,
    /// The first op, in forward order, that is not bitwise equal to the
    /// reference (`L0/ffn_down`): where a change enters, even when it leaves
    /// tolerance only later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_change: Option<String>,
    /// The diff's one-line summary.
    pub summary: String,
}

/// Why a tree could not be judged: never a verdict.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("{tree}: could not compare with the reference: {reason}")]
    Diff { tree: PathBuf, reason: String },
    /// The diff ran, but its outcome is not green or red (inconclusive, a
    /// failed control).
    #[error("{tree}: the diff against the reference is not a verdict ({outcome}): {summary}")]
    NoVerdict {
        tree: PathBuf,
        outcome: String,
        summary: String,
    },
}

/// Compares trees against one reference with one tolerance.
#[derive(Debug, Clone)]
pub struct Judge {
    pub reference: PathBuf,
    pub tolerance: diff::Tolerance,
}

impl Judge {
    pub fn judge(&self, tree: &Path) -> Result<Verdict, JudgeError> {
        let fail = |reason: String| JudgeError::Diff {
            tree: tree.to_path_buf(),
            reason,
        };
        let reference =
            capture::TreeReader::open(&self.reference).map_err(|e| fail(e.to_string()))?;
        let candidate = capture::TreeReader::open(tree).map_err(|e| fail(e.to_string()))?;
        let opts = diff::Options {
            tolerance: self.tolerance.clone(),
            ..Default::default()
        };
        let report =
            diff::diff(&reference, &candidate, None, &opts).map_err(|e| fail(e.to_string()))?;
        verdict(tree, &report)
    }
}

fn verdict(tree: &Path, report: &diff::DiffReport) -> Result<Verdict, JudgeError> {
    use diff::DiffOutcome;
    let red = match report.outcome {
        DiffOutcome::Identical | DiffOutcome::WithinTolerance => false,
        DiffOutcome::Diverged => true,
        other => {
            return Err(JudgeError::NoVerdict {
                tree: tree.to_path_buf(),
                outcome: format!("{other:?}").to_lowercase(),
                summary: diff::render::summary(report),
            })
        }
    };
    let first_op = report.first_divergence.map(|i| {
        let row = &report.rows[i];
        let worst = row.worst();
        FirstOp {
            op: row.name(),
            at: worst.label(),
            cause: match &row.cause {
                Some(diff::report::Cause::Inherited { .. }) => "inherited".into(),
                Some(diff::report::Cause::GrewFrom { .. }) => "grew past tolerance".into(),
                _ => "origin".into(),
            },
            cos: worst.metrics.cos,
            reasons: row.reasons.iter().map(diff::render::reason).collect(),
            row: i,
        }
    });
    let logits_min_cos = if report.outcome == DiffOutcome::Identical {
        Some(1.0)
    } else {
        report
            .rows
            .iter()
            .filter(|r| r.layer.is_none() && r.stage == "logits")
            .flat_map(|r| r.positions.iter().map(|p| p.metrics.cos))
            .reduce(f64::min)
    };
    let first_change = report
        .rows
        .iter()
        .find(|r| r.status != diff::report::Status::Equal)
        .map(|r| r.name());
    Ok(Verdict {
        red,
        first_op,
        logits_min_cos,
        first_change,
        summary: diff::render::summary(report),
    })
}
