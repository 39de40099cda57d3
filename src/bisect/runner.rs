//! One step of a bisect: the tree of a candidate, from the cache or from a
//! fresh run of the capture command.

use super::cache::{CacheError, Cached, TreeCache};
use super::command::{CaptureCommand, RunOutcome, SpawnError};
use super::git::{GitError, Worktree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a candidate has no verdict and the bisect must stop.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The capture command failed (not with 125): stop rather than guess.
    #[error("{what}: capture command failed ({status}); stopping rather than guessing{}", stderr_block(.stderr_tail))]
    Failed {
        what: String,
        status: String,
        stderr_tail: String,
    },
    /// The capture command exited 0 but `$TAPTREE_OUT` holds no complete tree.
    #[error(
        "{what}: capture command exited 0 but wrote no complete tree at $TAPTREE_OUT: {reason}"
    )]
    Incomplete { what: String, reason: String },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Git(#[from] GitError),
}

fn stderr_block(tail: &str) -> String {
    if tail.is_empty() {
        " (its stderr was empty)".to_string()
    } else {
        format!("; its stderr ended with:\n{tail}")
    }
}

/// Where a capture runs: a directory of the user's, or a worktree removed
/// after the run.
pub enum Workdir {
    Dir(PathBuf),
    Worktree(Worktree),
}

impl Workdir {
    fn path(&self) -> &Path {
        match self {
            Workdir::Dir(p) => p,
            Workdir::Worktree(w) => w.path(),
        }
    }
}

/// What a step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// A complete tree; `cached` when no command ran for it now.
    Tree { path: PathBuf, cached: bool },
    /// The command exits 125 here (now, or in an earlier run when `cached`).
    Skip { cached: bool },
}

/// Runs the capture command through a cache, counting what it ran.
pub struct Runner {
    pub cache: TreeCache,
    pub command: CaptureCommand,
    /// Capture commands actually run (skips included).
    pub runs: usize,
    /// Steps answered by the cache.
    pub hits: usize,
}

impl Runner {
    /// Runs `command` (the user's capture command) through a cache in
    /// `cache_dir`.
    pub fn new(cache_dir: &Path, command: &str) -> Runner {
        Runner {
            cache: TreeCache::new(cache_dir, command),
            command: CaptureCommand::new(command),
            runs: 0,
            hits: 0,
        }
    }

    /// The tree for `key`. `what` names the candidate in messages; `workdir`
    /// is called only when the command must run, `env` is added to its
    /// environment.
    pub fn get(
        &mut self,
        key: &str,
        what: &str,
        env: &BTreeMap<String, String>,
        workdir: impl FnOnce() -> Result<Workdir, StepError>,
    ) -> Result<Got, StepError> {
        match self.cache.lookup(key) {
            Cached::Tree(path) => {
                self.hits += 1;
                return Ok(Got::Tree { path, cached: true });
            }
            Cached::Skip => {
                self.hits += 1;
                return Ok(Got::Skip { cached: true });
            }
            Cached::Missing => {}
        }
        let dir = workdir()?;
        let staged = self.cache.staging_path(key)?;
        self.runs += 1;
        let outcome = self.command.run(dir.path(), &staged, env);
        drop(dir);
        match outcome? {
            RunOutcome::Ok => {
                if let Err(reason) = tree_is_complete(&staged) {
                    self.cache.discard(&staged);
                    return Err(StepError::Incomplete {
                        what: what.to_string(),
                        reason,
                    });
                }
                let path = self.cache.store(key, &staged)?;
                Ok(Got::Tree {
                    path,
                    cached: false,
                })
            }
            RunOutcome::Skip => {
                self.cache.discard(&staged);
                self.cache.mark_skip(key)?;
                Ok(Got::Skip { cached: false })
            }
            RunOutcome::Failed {
                status,
                stderr_tail,
            } => {
                self.cache.discard(&staged);
                Err(StepError::Failed {
                    what: what.to_string(),
                    status,
                    stderr_tail,
                })
            }
        }
    }
}

/// A capture counts only once its tree opens: manifest present and sound.
fn tree_is_complete(path: &Path) -> Result<(), String> {
    capture::TreeReader::open(path)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
