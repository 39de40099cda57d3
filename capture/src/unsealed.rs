//! A tree opened with its last check still to make, so that work on the
//! tree can start while that check runs beside it.
//!
//! Opening a tree from its index's records proves them sound as records,
//! then recomputes every directory's hash and the root from them: only
//! that last check makes them this tree's records. It is most of opening
//! a tree, and nothing else waits on it but the answer: a diff can index,
//! read and compare its taps while it runs, provided nothing of what it
//! computed leaves the process before the check has passed.

use crate::error::Result;
use crate::manifest_file::read_manifest;
use crate::reader::{open_by_views, open_each, TreeReader};
use std::path::Path;

/// A tree opened as [`TreeReader::open`] opens it but for one check left
/// to [`Unsealed::check`]: for a tree opened from its index's records,
/// their directory hashes and root against the manifest's.
///
/// Until that check passes, what is computed from [`Unsealed::tree`] may
/// come from records that are not the tree's: keep it from leaving the
/// process. Where the check fails, throw it away and open the tree with
/// [`TreeReader::open`], which opens it the owned way and names what is
/// wrong.
#[derive(Debug)]
pub struct Unsealed {
    tree: TreeReader,
    /// Whether the check is still to make (not for a tree opened the owned
    /// way: its entries' checks made it).
    pending: bool,
}

impl Unsealed {
    pub(crate) fn pending(tree: TreeReader) -> Unsealed {
        Unsealed {
            tree,
            pending: true,
        }
    }

    pub(crate) fn checked(tree: TreeReader) -> Unsealed {
        Unsealed {
            tree,
            pending: false,
        }
    }

    /// The tree, its last check perhaps not yet made.
    pub fn tree(&self) -> &TreeReader {
        &self.tree
    }

    /// Whether the tree passes its last check: the directory hashes and
    /// root recomputed from its records are the ones its manifest records.
    /// Where it does, the tree is what [`TreeReader::open`] would have
    /// opened.
    pub fn check(&self) -> bool {
        !self.pending || self.tree.records_hold()
    }

    /// Whether every one of `trees` passes its last check, the trees
    /// checked side by side on the thread pool.
    pub fn check_all(trees: &[Unsealed]) -> bool {
        use rayon::prelude::*;
        trees.par_iter().with_max_len(1).all(Unsealed::check)
    }
}

impl TreeReader {
    /// Opens the tree at `path` as [`TreeReader::open`] does but for one
    /// check, left to [`Unsealed::check`]: of a tree opened from its
    /// index's records, their directory hashes and root against the
    /// manifest's. An error is the one [`TreeReader::open`] gives.
    pub fn open_unsealed(path: impl AsRef<Path>) -> Result<Unsealed> {
        let path = path.as_ref().to_path_buf();
        let bytes = read_manifest(&path, None)?;
        let views = open_by_views(&path, &bytes, crate::index::open_views_unsealed);
        if let Some((manifest, records)) = views {
            return Ok(Unsealed::pending(TreeReader::of_records(
                path, manifest, records,
            )));
        }
        TreeReader::open_from(path, &bytes).map(Unsealed::checked)
    }

    /// Opens the trees at `paths` at once as [`TreeReader::open_unsealed`]
    /// does, each outcome in the order of `paths` (on the thread pool, as
    /// [`TreeReader::open_all`]).
    pub fn open_all_unsealed(paths: &[&Path]) -> Vec<Result<Unsealed>> {
        open_each(paths, |p| TreeReader::open_unsealed(p))
    }
}
