//! Trees cached by what produced them, so a repeated or widened bisect
//! recaptures nothing it has seen.
//!
//! Layout: `ROOT/<key>/<command hash>/` is a complete tree; a sibling file
//! `<command hash>.skip` records that the command exited 125 there. The key is
//! a commit id (bisect commits) or the hash of an arm's switch assignments
//! (bisect switches); the command hash keeps two different capture commands
//! from sharing trees. A tree is captured into `ROOT/.staging/` and renamed
//! into place only once it is known complete, so an interrupted capture never
//! reads as cached.

use std::io;
use std::path::{Path, PathBuf};

/// Why the cache could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the cache knows about one (key, command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// A complete tree.
    Tree(PathBuf),
    /// The command exited 125 here before.
    Skip,
    /// Never captured.
    Missing,
}

/// A directory of cached trees for one capture command.
#[derive(Debug, Clone)]
pub struct TreeCache {
    root: PathBuf,
    command_hash: String,
}

impl TreeCache {
    /// A cache under `root` for trees written by `command` (the command line
    /// is part of the identity of a tree).
    pub fn new(root: impl Into<PathBuf>, command: &str) -> TreeCache {
        let hash = blake3::hash(command.as_bytes()).to_hex();
        TreeCache {
            root: root.into(),
            command_hash: hash[..16].to_string(),
        }
    }

    fn tree_path(&self, key: &str) -> PathBuf {
        self.root.join(key).join(&self.command_hash)
    }

    fn skip_path(&self, key: &str) -> PathBuf {
        self.root
            .join(key)
            .join(format!("{}.skip", self.command_hash))
    }

    pub fn lookup(&self, key: &str) -> Cached {
        let tree = self.tree_path(key);
        if tree.is_dir() {
            Cached::Tree(tree)
        } else if self.skip_path(key).is_file() {
            Cached::Skip
        } else {
            Cached::Missing
        }
    }

    /// A fresh, not yet existing path to capture `key` into.
    pub fn staging_path(&self, key: &str) -> Result<PathBuf, CacheError> {
        let staging = self.root.join(".staging");
        std::fs::create_dir_all(&staging).map_err(io_err(&staging))?;
        let path = staging.join(format!(
            "{key}-{}-{}",
            self.command_hash,
            std::process::id()
        ));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(io_err(&path))?;
        }
        Ok(path)
    }

    /// Moves a complete tree from its staging path into the cache; returns
    /// its cached path.
    pub fn store(&self, key: &str, staged: &Path) -> Result<PathBuf, CacheError> {
        let dest = self.tree_path(key);
        let parent = dest.parent().expect("tree path has a parent");
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        if dest.is_dir() {
            // Another bisect of the same command stored it first; same inputs,
            // same tree.
            std::fs::remove_dir_all(staged).map_err(io_err(staged))?;
        } else {
            std::fs::rename(staged, &dest).map_err(io_err(&dest))?;
        }
        Ok(dest)
    }

    /// Records that the command exited 125 for `key`.
    pub fn mark_skip(&self, key: &str) -> Result<(), CacheError> {
        let path = self.skip_path(key);
        let parent = path.parent().expect("skip path has a parent");
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        std::fs::write(&path, b"exit 125\n").map_err(io_err(&path))
    }

    /// Removes whatever a failed capture left at a staging path.
    pub fn discard(&self, staged: &Path) {
        if staged.exists() {
            let _ = std::fs::remove_dir_all(staged);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_lookup_and_skip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TreeCache::new(dir.path(), "make capture");
        assert_eq!(cache.lookup("abc"), Cached::Missing);

        let staged = cache.staging_path("abc").unwrap();
        assert!(!staged.exists());
        std::fs::create_dir_all(&staged).unwrap();
        std::fs::write(staged.join("manifest.json"), "{}").unwrap();
        let stored = cache.store("abc", &staged).unwrap();
        assert!(!staged.exists());
        assert_eq!(cache.lookup("abc"), Cached::Tree(stored.clone()));
        assert!(stored.join("manifest.json").is_file());

        cache.mark_skip("def").unwrap();
        assert_eq!(cache.lookup("def"), Cached::Skip);

        // Another command never sees the first one's trees.
        let other = TreeCache::new(dir.path(), "make capture2");
        assert_eq!(other.lookup("abc"), Cached::Missing);
        assert_eq!(other.lookup("def"), Cached::Missing);
    }
}
