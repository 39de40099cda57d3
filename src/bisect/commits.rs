//! `bisect commits`: the first commit whose tree leaves tolerance of the
//! reference, with the op where it shows.

use super::git::{Commit, GitError, Repo};
use super::judge::{FirstOp, Judge, JudgeError};
use super::runner::{Got, Runner, StepError, Workdir};
use super::search::{self, Probe, SearchOutcome};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to bisect.
#[derive(Debug, Clone)]
pub struct Request {
    pub repo: Repo,
    pub good: String,
    pub bad: String,
    pub judge: Judge,
    pub command: String,
    /// Default: `<git common dir>/taptree/trees`.
    pub cache: Option<PathBuf>,
    /// Capture both endpoints before searching, instead of only when the
    /// answer rests on them.
    pub check_endpoints: bool,
    /// Give every step one build directory (`CARGO_TARGET_DIR` and
    /// `TAPTREE_BUILD_DIR`), so that a step costs an incremental build
    /// rather than a cold one.
    pub shared_build: bool,
}

/// The environment every step's capture command gets: with a shared build,
/// `TAPTREE_BUILD_DIR` set to `dir`, and `CARGO_TARGET_DIR` too unless the
/// user's environment already names one (theirs is shared already).
fn step_env(shared_build: bool, dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if shared_build {
        let dir = dir.to_string_lossy().into_owned();
        if std::env::var_os("CARGO_TARGET_DIR").is_none() {
            env.insert("CARGO_TARGET_DIR".to_string(), dir.clone());
        }
        env.insert("TAPTREE_BUILD_DIR".to_string(), dir);
    }
    env
}

/// Why a bisect stopped without an answer.
#[derive(Debug, thiserror::Error)]
pub enum BisectError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Judge(#[from] JudgeError),
    #[error("{path}: could not create a directory for worktrees: {source}")]
    Tempdir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The verdict of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepVerdict {
    Green,
    Red,
    Skip,
}

/// One probed commit, in the order probed.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub commit: String,
    pub subject: String,
    pub verdict: StepVerdict,
    /// No command ran for it in this bisect.
    pub cached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_op: Option<FirstOp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logits_min_cos: Option<f64>,
    /// The first op not bitwise equal to the reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_change: Option<String>,
}

/// A commit named in an answer.
#[derive(Debug, Clone, Serialize)]
pub struct Named {
    pub commit: String,
    pub subject: String,
}

impl From<&Commit> for Named {
    fn from(c: &Commit) -> Named {
        Named {
            commit: c.id.clone(),
            subject: c.subject.clone(),
        }
    }
}

/// The answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Answer {
    /// The first bad commit: red, its first-parent predecessor green.
    FirstBad {
        #[serde(flatten)]
        commit: Named,
        first_op: Option<FirstOp>,
        /// The first op not bitwise equal to the reference.
        first_change: Option<String>,
    },
    /// Skipped commits hide the boundary: the first bad commit is one of these.
    Ambiguous { candidates: Vec<Named> },
    /// --good diverges from the reference already.
    GoodIsRed {
        #[serde(flatten)]
        commit: Named,
        first_op: Option<FirstOp>,
    },
    /// --bad is within tolerance of the reference.
    BadIsGreen {
        #[serde(flatten)]
        commit: Named,
    },
    /// An endpoint the answer rests on exits 125.
    EndpointSkipped {
        #[serde(flatten)]
        commit: Named,
    },
}

/// Everything a bisect over commits found.
#[derive(Debug, Clone, Serialize)]
pub struct CommitsReport {
    pub good: Named,
    pub bad: Named,
    pub reference: PathBuf,
    pub tolerance: String,
    /// Commits in the first-parent range, endpoints included.
    pub range: usize,
    pub steps: Vec<Step>,
    pub answer: Answer,
    /// Capture commands run now (skips included).
    pub captures_run: usize,
    /// Steps answered from the cache.
    pub cache_hits: usize,
    pub cache: PathBuf,
}

/// Runs the bisect; `on_step` sees each step as it completes (the log).
pub fn bisect(req: &Request, mut on_step: impl FnMut(&Step)) -> Result<CommitsReport, BisectError> {
    let commits = req.repo.first_parent_range(&req.good, &req.bad)?;
    let cache_dir = req
        .cache
        .clone()
        .unwrap_or_else(|| req.repo.common_dir.join("taptree").join("trees"));
    let mut runner = Runner::new(&cache_dir, &req.command);
    // Worktrees live outside the repository so that no tool run inside the
    // user's checkout ever sees them.
    let tmp = std::env::temp_dir();
    let worktrees = tempfile::Builder::new()
        .prefix("taptree-bisect-")
        .tempdir()
        .map_err(|source| BisectError::Tempdir { path: tmp, source })?;
    let mut steps: Vec<Step> = Vec::new();
    // One build directory for the whole run, removed with the worktrees.
    let env = step_env(req.shared_build, &worktrees.path().join("build"));

    let outcome = search::first_bad(
        commits.len(),
        req.check_endpoints,
        |i| -> Result<Probe, BisectError> {
            let commit = &commits[i];
            // One path for every checkout (each removed before the next):
            // build tools that key their outputs by source path reuse them.
            let wt_path = worktrees.path().join("checkout");
            let repo = &req.repo;
            let got = runner.get(&commit.id, &describe(commit), &env, || {
                Ok(Workdir::Worktree(repo.add_worktree(&commit.id, &wt_path)?))
            })?;
            let step = match got {
                Got::Skip { cached } => Step {
                    commit: commit.id.clone(),
                    subject: commit.subject.clone(),
                    verdict: StepVerdict::Skip,
                    cached,
                    first_op: None,
                    logits_min_cos: None,
                    first_change: None,
                },
                Got::Tree { path, cached } => {
                    let v = req.judge.judge(&path)?;
                    Step {
                        commit: commit.id.clone(),
                        subject: commit.subject.clone(),
                        verdict: if v.red {
                            StepVerdict::Red
                        } else {
                            StepVerdict::Green
                        },
                        cached,
                        first_op: v.first_op,
                        logits_min_cos: v.logits_min_cos,
                        first_change: v.first_change,
                    }
                }
            };
            on_step(&step);
            let probe = match step.verdict {
                StepVerdict::Green => Probe::Green,
                StepVerdict::Red => Probe::Red,
                StepVerdict::Skip => Probe::Skip,
            };
            steps.push(step);
            Ok(probe)
        },
    )?;

    let first_op_of = |id: &str| {
        steps
            .iter()
            .find(|s| s.commit == id)
            .and_then(|s| s.first_op.clone())
    };
    let answer = match outcome {
        SearchOutcome::FirstBad { index } => Answer::FirstBad {
            commit: (&commits[index]).into(),
            first_op: first_op_of(&commits[index].id),
            first_change: steps
                .iter()
                .find(|s| s.commit == commits[index].id)
                .and_then(|s| s.first_change.clone()),
        },
        SearchOutcome::Ambiguous { candidates } => Answer::Ambiguous {
            candidates: candidates.iter().map(|&i| (&commits[i]).into()).collect(),
        },
        SearchOutcome::GoodIsRed => Answer::GoodIsRed {
            commit: (&commits[0]).into(),
            first_op: first_op_of(&commits[0].id),
        },
        SearchOutcome::BadIsGreen => Answer::BadIsGreen {
            commit: commits.last().expect("range has endpoints").into(),
        },
        SearchOutcome::EndpointSkipped { index } => Answer::EndpointSkipped {
            commit: (&commits[index]).into(),
        },
    };
    Ok(CommitsReport {
        good: (&commits[0]).into(),
        bad: commits.last().expect("range has endpoints").into(),
        reference: req.judge.reference.clone(),
        tolerance: req.judge.tolerance.to_string(),
        range: commits.len(),
        steps,
        answer,
        captures_run: runner.runs,
        cache_hits: runner.hits,
        cache: cache_dir,
    })
}

fn describe(c: &Commit) -> String {
    format!("commit {} ({})", c.short(), c.subject)
}
