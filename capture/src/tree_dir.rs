//! What a tree's directory on disk is: recognising one (complete, or the
//! remains of one killed part way), deleting one so that what is left stays
//! recognisable, and the names of the directories kept beside it
//! (`.NAME.taptree-{what}`). Shared by the output directory's preparation
//! ([`crate::out_dir`]) and its spare ([`crate::spare`]).

use crate::index::INDEX_FILE;
use crate::manifest::{GLOBAL_DIR, MANIFEST_FILE, MARKER_FILE};
use std::path::{Path, PathBuf};

/// A tree, complete or not, carries the marker or a manifest.
pub(crate) fn is_tree(dir: &Path) -> bool {
    dir.join(MARKER_FILE).is_file() || dir.join(MANIFEST_FILE).is_file()
}

/// A directory (not a link to one) that is a tree or what is left of one.
pub(crate) fn is_tree_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) && (is_tree(dir) || tree_remains(dir))
}

/// Whether a tree's subdirectory of this name holds tap files: `global`
/// or `L` and a layer number.
pub(crate) fn is_layer_dir(name: &str) -> bool {
    name == GLOBAL_DIR
        || name
            .strip_prefix('L')
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
}

/// What a tree killed while being deleted by an earlier taptree (which
/// deleted its marker and manifest first) leaves: only tree-shaped files.
pub(crate) fn tree_remains(dir: &Path) -> bool {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return false;
    };
    listing.flatten().all(|item| {
        let name = item.file_name().to_string_lossy().into_owned();
        let Ok(kind) = item.file_type() else {
            return false;
        };
        if kind.is_file() {
            return name == MARKER_FILE
                || name.starts_with(MANIFEST_FILE)
                || name.starts_with(INDEX_FILE);
        }
        kind.is_dir()
            && is_layer_dir(&name)
            && std::fs::read_dir(item.path()).is_ok_and(|files| {
                files.flatten().all(|f| {
                    f.file_type().is_ok_and(|k| k.is_file())
                        && f.file_name().to_string_lossy().ends_with(".safetensors")
                })
            })
    })
}

/// Deletes a tree (or a staging directory) so that, if killed part way,
/// what remains is still recognisably a tree: its marker goes last.
pub(crate) fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for item in std::fs::read_dir(dir)? {
        let item = item?;
        if item.file_name() == MARKER_FILE {
            continue;
        }
        if item.file_type()?.is_dir() {
            std::fs::remove_dir_all(item.path())?;
        } else {
            std::fs::remove_file(item.path())?;
        }
    }
    let marker = dir.join(MARKER_FILE);
    match std::fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::remove_dir(dir)
}

/// `.NAME.taptree-{what}-{pid}` beside `out`: this process's own.
pub(crate) fn sibling(out: &Path, what: &str) -> PathBuf {
    sibling_named(out, format!("{what}-{}", std::process::id()))
}

/// `.NAME.taptree-{what}` beside `out`.
pub(crate) fn sibling_named(out: &Path, what: String) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tree".into());
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    let file = format!(".{name}.taptree-{what}");
    match parent {
        Some(p) => p.join(file),
        None => PathBuf::from(file),
    }
}
