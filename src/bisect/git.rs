//! The few git operations a bisect needs, through the `git` command.
//!
//! Every candidate is checked out in a worktree of its own (`git worktree add
//! --detach`), so the user's checkout, index and branches are never touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Why a git operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// `git` itself could not be started.
    #[error("git: could not run `git {args}`: {source}")]
    Spawn {
        args: String,
        source: std::io::Error,
    },
    /// `git` ran and refused.
    #[error("git: `git {args}` failed: {stderr}")]
    Failed { args: String, stderr: String },
    /// A revision that does not name a commit.
    #[error("{rev}: not a commit in {repo}")]
    BadRevision { rev: String, repo: PathBuf },
    /// `--good` is not an ancestor of `--bad`.
    #[error("{good}: not an ancestor of {bad}; bisect needs --good to be an older commit on --bad's history")]
    NotAncestor { good: String, bad: String },
    /// Nothing between the endpoints.
    #[error("{good}..{bad}: no commits between the endpoints")]
    EmptyRange { good: String, bad: String },
}

/// One commit of the searched range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Full object id.
    pub id: String,
    /// First line of the message.
    pub subject: String,
}

impl Commit {
    /// The abbreviated id used in logs.
    pub fn short(&self) -> &str {
        &self.id[..self.id.len().min(10)]
    }
}

/// A repository found from a directory inside it.
#[derive(Debug, Clone)]
pub struct Repo {
    /// Top of the working tree the user runs in.
    pub toplevel: PathBuf,
    /// The git directory shared by all worktrees (`git rev-parse --git-common-dir`).
    pub common_dir: PathBuf,
}

impl Repo {
    /// Finds the repository that holds `dir`.
    pub fn discover(dir: &Path) -> Result<Repo, GitError> {
        let toplevel = git_in(dir, &["rev-parse", "--show-toplevel"])?;
        let common = git_in(dir, &["rev-parse", "--git-common-dir"])?;
        let toplevel = PathBuf::from(toplevel);
        let common = PathBuf::from(common);
        // --git-common-dir is relative to `dir` when git prints it relative.
        let common_dir = if common.is_absolute() {
            common
        } else {
            dir.join(common)
        };
        Ok(Repo {
            toplevel,
            common_dir,
        })
    }

    fn git(&self, args: &[&str]) -> Result<String, GitError> {
        git_in(&self.toplevel, args)
    }

    /// The commit id `rev` names.
    pub fn resolve(&self, rev: &str) -> Result<String, GitError> {
        let spec = format!("{rev}^{{commit}}");
        self.git(&["rev-parse", "--verify", "--quiet", &spec])
            .map_err(|_| GitError::BadRevision {
                rev: rev.to_string(),
                repo: self.toplevel.clone(),
            })
    }

    /// The first line of a commit's message.
    pub fn subject(&self, id: &str) -> Result<String, GitError> {
        self.git(&["log", "-1", "--format=%s", id])
    }

    /// `good` followed by the first-parent history from `good` (exclusive) to
    /// `bad` (inclusive), oldest first: index 0 is the good endpoint and the
    /// last index the bad one.
    pub fn first_parent_range(&self, good: &str, bad: &str) -> Result<Vec<Commit>, GitError> {
        let good_id = self.resolve(good)?;
        let bad_id = self.resolve(bad)?;
        let ancestor = Command::new("git")
            .current_dir(&self.toplevel)
            .args(["merge-base", "--is-ancestor", &good_id, &bad_id])
            .status()
            .map_err(|source| GitError::Spawn {
                args: "merge-base --is-ancestor".into(),
                source,
            })?;
        if !ancestor.success() {
            return Err(GitError::NotAncestor {
                good: good.to_string(),
                bad: bad.to_string(),
            });
        }
        let range = format!("{good_id}..{bad_id}");
        let listing = self.git(&[
            "log",
            "--first-parent",
            "--reverse",
            "--format=%H %s",
            &range,
        ])?;
        let mut commits = vec![Commit {
            subject: self.subject(&good_id)?,
            id: good_id,
        }];
        for line in listing.lines() {
            let (id, subject) = line.split_once(' ').unwrap_or((line, ""));
            commits.push(Commit {
                id: id.to_string(),
                subject: subject.to_string(),
            });
        }
        if commits.len() < 2 {
            return Err(GitError::EmptyRange {
                good: good.to_string(),
                bad: bad.to_string(),
            });
        }
        Ok(commits)
    }

    /// Checks `commit` out, detached, in a new worktree at `path` (which must
    /// not exist yet). The worktree is removed when the guard drops.
    pub fn add_worktree(&self, commit: &str, path: &Path) -> Result<Worktree, GitError> {
        let path_str = path.to_string_lossy();
        self.git(&["worktree", "add", "--detach", "--quiet", &path_str, commit])?;
        Ok(Worktree {
            repo: self.toplevel.clone(),
            path: path.to_path_buf(),
        })
    }
}

/// A temporary checkout of one commit; removed (files and git's record of it)
/// on drop.
#[derive(Debug)]
pub struct Worktree {
    repo: PathBuf,
    path: PathBuf,
}

impl Worktree {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        // --force: a capture command may leave build outputs behind.
        let removed = Command::new("git")
            .current_dir(&self.repo)
            .args(["worktree", "remove", "--force"])
            .arg(&self.path)
            .output();
        if !matches!(removed, Ok(ref out) if out.status.success()) {
            let _ = std::fs::remove_dir_all(&self.path);
            let _ = Command::new("git")
                .current_dir(&self.repo)
                .args(["worktree", "prune"])
                .output();
        }
    }
}

fn git_in(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let out: Output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|source| GitError::Spawn {
            args: args.join(" "),
            source,
        })?;
    if !out.status.success() {
        return Err(GitError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .current_dir(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            // The host's git configuration (signing, hooks) is not the test's.
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn commit(dir: &Path, name: &str) -> String {
        std::fs::write(dir.join(name), name).unwrap();
        git(dir, &["add", name]);
        git(dir, &["commit", "-q", "-m", name]);
        git(dir, &["rev-parse", "HEAD"])
    }

    #[test]
    fn first_parent_range_skips_merged_side_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        git(dir, &["init", "-q", "-b", "main"]);
        let a = commit(dir, "a");
        let b = commit(dir, "b");
        git(dir, &["checkout", "-q", "-b", "side"]);
        let c = commit(dir, "c");
        git(dir, &["checkout", "-q", "main"]);
        let d = commit(dir, "d");
        git(dir, &["merge", "-q", "--no-ff", "-m", "merge side", "side"]);
        let m = git(dir, &["rev-parse", "HEAD"]);

        let repo = Repo::discover(dir).unwrap();
        let range = repo.first_parent_range(&a, "main").unwrap();
        let ids: Vec<&str> = range.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, [&a, &b, &d, &m]);
        assert!(!ids.contains(&c.as_str()));
        assert_eq!(range[3].subject, "merge side");
        assert_eq!(range[0].subject, "a");

        assert!(matches!(
            repo.first_parent_range(&d, &a),
            Err(GitError::NotAncestor { .. })
        ));
        assert!(matches!(
            repo.first_parent_range("main", "main"),
            Err(GitError::EmptyRange { .. })
        ));
        assert!(matches!(
            repo.resolve("nope"),
            Err(GitError::BadRevision { .. })
        ));
    }

    #[test]
    fn a_worktree_checks_out_the_commit_and_leaves_no_trace() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        std::fs::create_dir(&dir).unwrap();
        git(&dir, &["init", "-q", "-b", "main"]);
        let a = commit(&dir, "a");
        commit(&dir, "b");
        let repo = Repo::discover(&dir).unwrap();
        let path = tmp.path().join("wt");
        {
            let wt = repo.add_worktree(&a, &path).unwrap();
            assert!(wt.path().join("a").is_file());
            assert!(!wt.path().join("b").exists());
            // Build outputs left behind do not stop the removal.
            std::fs::write(wt.path().join("build.out"), "x").unwrap();
        }
        assert!(!path.exists());
        assert_eq!(git(&dir, &["worktree", "list"]).lines().count(), 1);
        assert_eq!(git(&dir, &["rev-parse", "--abbrev-ref", "HEAD"]), "main");
        assert_eq!(git(&dir, &["status", "--porcelain"]), "");
    }
}
