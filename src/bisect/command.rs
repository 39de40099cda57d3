//! Running the user's capture command, as `git bisect run` runs its script.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The exit status that means "this candidate cannot be tested" (as in
/// `git bisect run`): the commit does not build, the switch is unsupported.
pub const SKIP_STATUS: i32 = 125;

/// How much of a failed command's stderr a report quotes.
const STDERR_TAIL_LINES: usize = 20;

/// What one run of the capture command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Exit 0.
    Ok,
    /// Exit 125: skip this candidate.
    Skip,
    /// Any other exit (or a signal): stop, this is not a verdict.
    Failed {
        /// `exit status 3`, `killed by signal 9`.
        status: String,
        /// The last lines of its stderr.
        stderr_tail: String,
    },
}

/// Why the command could not even start.
#[derive(Debug, thiserror::Error)]
#[error("{cwd}: could not start `sh -c {cmd:?}`: {source}")]
pub struct SpawnError {
    pub cmd: String,
    pub cwd: PathBuf,
    pub source: std::io::Error,
}

/// A shell command line that writes a tree to `$TAPTREE_OUT`.
#[derive(Debug, Clone)]
pub struct CaptureCommand {
    pub line: String,
}

impl CaptureCommand {
    pub fn new(line: impl Into<String>) -> CaptureCommand {
        CaptureCommand { line: line.into() }
    }

    /// Runs `sh -c LINE` in `cwd` with `env` added and `TAPTREE_OUT=out`.
    /// Its output is kept, not shown: the bisect's own log says what each step
    /// did, and a failure quotes the tail of the command's stderr.
    pub fn run(
        &self,
        cwd: &Path,
        out: &Path,
        env: &BTreeMap<String, String>,
    ) -> Result<RunOutcome, SpawnError> {
        let output = Command::new("sh")
            .arg("-c")
            .arg(&self.line)
            .current_dir(cwd)
            .envs(env)
            .env("TAPTREE_OUT", out)
            // An armed selection inherited from the user's shell would make
            // every candidate's tree partial in the same silent way.
            .env_remove("TAPTREE_SELECT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|source| SpawnError {
                cmd: self.line.clone(),
                cwd: cwd.to_path_buf(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let status = output.status;
        if status.success() {
            return Ok(RunOutcome::Ok);
        }
        if status.code() == Some(SKIP_STATUS) {
            return Ok(RunOutcome::Skip);
        }
        let status = match status.code() {
            Some(code) => format!("exit status {code}"),
            None => {
                #[cfg(unix)]
                {
                    use std::os::unix::process::ExitStatusExt;
                    match status.signal() {
                        Some(sig) => format!("killed by signal {sig}"),
                        None => status.to_string(),
                    }
                }
                #[cfg(not(unix))]
                {
                    status.to_string()
                }
            }
        };
        Ok(RunOutcome::Failed {
            status,
            stderr_tail: tail(&stderr, STDERR_TAIL_LINES),
        })
    }
}

/// The last `n` lines of `text`, trimmed.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_map_to_outcomes() {
        let dir = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([("X".to_string(), "7".to_string())]);
        let out = dir.path().join("t");
        let run = |line: &str| {
            CaptureCommand::new(line)
                .run(dir.path(), &out, &env)
                .unwrap()
        };
        assert_eq!(
            run("test \"$X\" = 7 && test -n \"$TAPTREE_OUT\""),
            RunOutcome::Ok
        );
        assert_eq!(run("exit 125"), RunOutcome::Skip);
        assert_eq!(
            run("echo one >&2; echo two >&2; exit 3"),
            RunOutcome::Failed {
                status: "exit status 3".into(),
                stderr_tail: "one\ntwo".into()
            }
        );
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("", 2), "");
        assert_eq!(tail("a", 5), "a");
    }
}
