//! The tree a `force` capture replaced, kept beside the path as the next
//! replacement's space (`.NAME.taptree-spare`) instead of being deleted.
//!
//! Why: on a filesystem mounted with `discard` (ext4 on a virtual disk, as
//! on GPU hosts) deleting a tree of thousands of files makes the journal's
//! next commits discard every freed extent, and the next capture's file
//! creations wait behind them: a capture replacing its previous tree with
//! `--force` took ×3.7 a logits-only run where captures into fresh
//! directories took ×1.05 to ×1.36. A replacement instead takes the spare
//! as its staging directory and writes each tap file over the old file of
//! the same name (same tap, usually the same size: no block is freed or
//! allocated), so a capture repeated with `--force` deletes nothing.
//!
//! The guarantees of [`crate::session`] hold: the spare is never a tree the
//! user has (its manifest is the replaced tree's, under a hidden name), a
//! capture takes it only while holding the path's lock, and it removes the
//! spare's manifest and index before writing anything into it, so a
//! capture killed part way leaves a staging directory that recovery
//! deletes. The cost is disk: one replaced tree per path stays on disk,
//! and only while the filesystem has at least as much free as it takes
//! (a larger one is deleted as before).
//! `TAPTREE_SPARE=0` deletes replaced trees instead (and a spare left from
//! before, at the next replacement). A spare whose tree is
//! gone (the user deleted the path) is deleted by the next capture to it.

use crate::error::{Error, Result};
use crate::index::INDEX_FILE;
use crate::manifest::MANIFEST_FILE;
use crate::tree_dir::{is_layer_dir, is_tree_dir, remove_tree, sibling_named, tree_remains};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Whether replaced trees are kept as spares: unless `TAPTREE_SPARE=0`.
pub(crate) fn enabled() -> bool {
    std::env::var("TAPTREE_SPARE").map_or(true, |v| v.trim() != "0")
}

/// `.NAME.taptree-spare` beside `out`.
pub(crate) fn path(out: &Path) -> PathBuf {
    sibling_named(out, "spare".into())
}

/// Moves `out`'s spare to `staging` (which must not exist) and makes it an
/// incomplete tree: its manifest first, then its index and any temporary
/// files go. False when there is no spare to take (or spares are off).
pub(crate) fn take(out: &Path, staging: &Path) -> Result<bool> {
    let spare = path(out);
    // Only a directory of tree-shaped files becomes a tree's space.
    let whole = std::fs::symlink_metadata(&spare).is_ok_and(|m| m.is_dir()) && tree_remains(&spare);
    if !enabled() || !whole {
        return Ok(false);
    }
    std::fs::rename(&spare, staging).map_err(|e| Error::io(&spare, e))?;
    let manifest = staging.join(MANIFEST_FILE);
    match std::fs::remove_file(&manifest) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&manifest, e)),
        _ => {}
    }
    let listing = std::fs::read_dir(staging).map_err(|e| Error::io(staging, e))?;
    for item in listing.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        if name.starts_with(MANIFEST_FILE) || name.starts_with(INDEX_FILE) {
            std::fs::remove_file(item.path()).map_err(|e| Error::io(item.path(), e))?;
        }
    }
    Ok(true)
}

/// After the swap: the replaced tree (`old`, renamed aside) becomes `out`'s
/// spare; when spares are off, it is deleted, and so is a spare left from
/// before.
pub(crate) fn keep(old: &Path, out: &Path) -> Result<()> {
    let spare = path(out);
    if is_tree_dir(&spare) {
        remove_tree(&spare).map_err(|e| Error::io(&spare, e))?;
    }
    if !enabled() || !room_beside(old) {
        return remove_tree(old).map_err(|e| Error::io(old, e));
    }
    std::fs::rename(old, &spare).map_err(|e| Error::io(old, e))
}

/// Whether the filesystem holding `tree` has at least as many bytes free
/// as the tree takes: a spare never takes the last of the disk (a replaced
/// tree larger than what is free is deleted, as without spares).
fn room_beside(tree: &Path) -> bool {
    match (tree_bytes(tree), free_bytes(tree)) {
        (Some(used), Some(free)) => free >= used,
        _ => false,
    }
}

/// The bytes of a tree's files (its top directory and its layer
/// directories), or None if it cannot be listed.
fn tree_bytes(tree: &Path) -> Option<u64> {
    let mut total = 0u64;
    for item in std::fs::read_dir(tree).ok()?.flatten() {
        let meta = item.metadata().ok()?;
        if meta.is_dir() {
            for f in std::fs::read_dir(item.path()).ok()?.flatten() {
                total = total.saturating_add(f.metadata().ok()?.len());
            }
        } else {
            total = total.saturating_add(meta.len());
        }
    }
    Some(total)
}

/// Bytes free to an unprivileged writer on the filesystem holding `path`.
#[cfg(unix)]
#[allow(clippy::useless_conversion)] // the field types are u32 on some targets
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes only into the zeroed struct we own, and `c` is
    // a NUL-terminated path that lives across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (r == 0).then(|| u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// Without `statvfs`, no spare is kept.
#[cfg(not(unix))]
fn free_bytes(_path: &Path) -> Option<u64> {
    None
}

/// Deletes the files of a taken spare (`staging`) that the new tree does
/// not name (`kept`, paths relative to it), and the layer directories left
/// empty: a tree holds only its manifest's files.
pub(crate) fn remove_stale(staging: &Path, kept: &HashSet<&str>) -> Result<()> {
    let listing = std::fs::read_dir(staging).map_err(|e| Error::io(staging, e))?;
    for item in listing.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !is_layer_dir(&name) {
            continue;
        }
        let dir = item.path();
        let mut left = 0usize;
        for f in std::fs::read_dir(&dir)
            .map_err(|e| Error::io(&dir, e))?
            .flatten()
        {
            let rel = format!("{name}/{}", f.file_name().to_string_lossy());
            if kept.contains(rel.as_str()) {
                left += 1;
            } else {
                std::fs::remove_file(f.path()).map_err(|e| Error::io(f.path(), e))?;
            }
        }
        if left == 0 {
            std::fs::remove_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        }
    }
    Ok(())
}

/// Deletes `out`'s spare when `out` itself is gone (the user deleted the
/// tree: its spare must not outlive it).
pub(crate) fn drop_orphan(out: &Path) -> Result<()> {
    let spare = path(out);
    if std::fs::symlink_metadata(out).is_err() && is_tree_dir(&spare) {
        remove_tree(&spare).map_err(|e| Error::io(&spare, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_tree_has_room_beside_it_and_a_missing_one_has_none() {
        let dir = std::env::temp_dir().join(format!("taptree-spare-room-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("L0")).unwrap();
        std::fs::write(dir.join("L0/a.safetensors"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.join(MANIFEST_FILE), b"{}").unwrap();
        assert_eq!(tree_bytes(&dir), Some(4098));
        assert!(free_bytes(&dir).is_some_and(|f| f > 0));
        assert!(room_beside(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        // Nothing to measure: no spare is kept.
        assert!(!room_beside(&dir));
    }
}
