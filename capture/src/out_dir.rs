//! The output directory of a capture: its lock, the staging directory a
//! replacing capture writes into, the swap into place, and cleaning up after
//! a capture that was killed part way (see [`crate::session`]).

use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, FORMAT_VERSION, MANIFEST_FILE, MARKER_FILE};
use crate::tree_dir::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// An advisory lock (`flock`) on a tree's path, held in a hidden sibling
/// file `.NAME.taptree-lock` that names its holder. Released (and the file
/// removed) on drop; a killed holder's lock is released by the kernel.
pub(crate) struct PathLock {
    path: PathBuf,
    file: std::fs::File,
}

impl PathLock {
    pub(crate) fn acquire(out: &Path) -> Result<PathLock> {
        let path = sibling_named(out, "lock".into());
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            match try_lock(&file) {
                Ok(true) => {}
                Ok(false) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let holder = match holder.trim() {
                        "" => "its lock is held".to_string(),
                        h => h.to_string(),
                    };
                    return Err(Error::Locked {
                        path: out.to_path_buf(),
                        holder,
                    });
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
            // The holder before us removes the file while still holding it:
            // a lock taken on a file no longer at `path` is stale; retry.
            if !same_file(&file, &path) {
                continue;
            }
            let mut f = &file;
            let _ = f.set_len(0);
            let _ = writeln!(f, "held by process {}", std::process::id());
            return Ok(PathLock { path, file });
        }
    }
}

impl Drop for PathLock {
    fn drop(&mut self) {
        // Removed while held, so that no one takes a lock on it in between.
        let _ = std::fs::remove_file(&self.path);
        // Closing the file (dropping it, next) releases the lock.
        let _ = &self.file;
    }
}

/// An exclusive advisory lock without waiting: false when another holds it.
#[cfg(unix)]
pub(crate) fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor this process owns; no memory is shared.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// Without `flock`, captures to one path are not kept apart.
#[cfg(not(unix))]
pub(crate) fn try_lock(_file: &std::fs::File) -> std::io::Result<bool> {
    Ok(true)
}

#[cfg(unix)]
pub(crate) fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
pub(crate) fn same_file(_file: &std::fs::File, path: &Path) -> bool {
    path.exists()
}

/// Makes `out` ready; returns the staging directory when replacing a tree,
/// and whether it is the path's spare (`crate::spare`), holding the
/// replaced tree's files to be written over.
pub(crate) fn prepare_out(out: &Path, force: bool) -> Result<Option<(PathBuf, bool)>> {
    recover_siblings(out)?;
    match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The parents as needed, then `out` itself exclusively: a path
            // that appears meanwhile (a link, another process's directory)
            // fails the capture rather than being written into as fresh.
            if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            std::fs::create_dir(out).map_err(|e| Error::io(out, e))?;
            write_marker(out)?;
            Ok(None)
        }
        Err(e) => Err(Error::io(out, e)),
        Ok(meta) if !meta.is_dir() => Err(Error::NotATree {
            path: out.to_path_buf(),
        }),
        Ok(_) => {
            let mut listing = std::fs::read_dir(out).map_err(|e| Error::io(out, e))?;
            if listing.next().is_none() {
                write_marker(out)?;
                return Ok(None);
            }
            if !is_tree(out) {
                return Err(Error::NotATree {
                    path: out.to_path_buf(),
                });
            }
            if !force {
                return Err(Error::TreeExists {
                    path: out.to_path_buf(),
                });
            }
            let staging = sibling(out, "new");
            if staging.exists() {
                remove_tree(&staging).map_err(|e| Error::io(&staging, e))?;
            }
            let recycled = crate::spare::take(out, &staging)?;
            if !recycled {
                std::fs::create_dir(&staging).map_err(|e| Error::io(&staging, e))?;
            }
            write_marker(&staging)?;
            Ok(Some((staging, recycled)))
        }
    }
}

/// Deals with what a replacing capture that was killed left beside `out`
/// (a killed process cleans nothing up): the previous tree renamed aside is
/// put back when `out` is gone (killed between the two renames of
/// [`swap_into_place`]) and deleted when `out` holds its replacement; a
/// staging directory is deleted. Only siblings of processes that are no
/// longer running are touched, and only if they are trees.
pub(crate) fn recover_siblings(out: &Path) -> Result<()> {
    let Some(name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(());
    };
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(listing) = std::fs::read_dir(parent) else {
        return Ok(());
    };
    let prefix = format!(".{name}.taptree-");
    // (renamed aside, modified, path): trees set aside first, newest first.
    let mut stale: Vec<(bool, std::time::SystemTime, PathBuf)> = Vec::new();
    for item in listing.flatten() {
        let file = item.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((what, pid)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), true) = (pid.parse::<u32>(), matches!(what, "new" | "old")) else {
            continue;
        };
        let path = item.path();
        if pid == std::process::id() || running(pid) || !is_tree_dir(&path) {
            continue;
        }
        let modified = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or(std::time::UNIX_EPOCH);
        stale.push((what == "old", modified, path));
    }
    stale.sort_by_key(|s| std::cmp::Reverse((s.0, s.1)));
    for (aside, _, path) in stale {
        let out_exists = std::fs::symlink_metadata(out).is_ok();
        if aside && !out_exists && path.join(MANIFEST_FILE).is_file() {
            std::fs::rename(&path, out).map_err(|e| Error::io(&path, e))?;
        } else {
            remove_tree(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    crate::spare::drop_orphan(out)
}

/// Whether process `pid` is running (or may be: anything unsure is yes).
#[cfg(unix)]
pub(crate) fn running(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
pub(crate) fn running(_pid: u32) -> bool {
    true
}

pub(crate) fn write_marker(dir: &Path) -> Result<()> {
    let path = dir.join(MARKER_FILE);
    std::fs::write(
        &path,
        format!("taptree tree, format {FORMAT_VERSION}; complete once {MANIFEST_FILE} exists\n"),
    )
    .map_err(|e| Error::io(&path, e))
}

/// Temp file, fsync, rename: a reader sees no manifest or a whole one.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let path = dir.join(MANIFEST_FILE);
    let mut json = serde_json::to_vec(&manifest::ManifestOut::new(manifest))
        .expect("a manifest always serializes");
    json.push(b'\n');
    let sealed = manifest::seal(&mut json);
    debug_assert!(sealed, "ManifestOut writes a manifest_blake3");
    // The index first: a manifest of format 2.1 is never without one.
    if crate::index::has_index(&manifest.format_version) {
        let index = crate::index::build(&json, manifest).map_err(|reason| Error::BadManifest {
            path: path.clone(),
            reason,
        })?;
        let index_tmp = dir.join(format!("{}.tmp", crate::index::INDEX_FILE));
        let index_path = dir.join(crate::index::INDEX_FILE);
        let write_index = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&index_tmp)?;
            f.write_all(&index)?;
            f.sync_all()
        };
        write_index().map_err(|e| Error::io(&index_tmp, e))?;
        std::fs::rename(&index_tmp, &index_path).map_err(|e| Error::io(&index_path, e))?;
    }
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()
    };
    write().map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    // Persist the rename itself; failure to sync a directory is not fatal
    // on filesystems that do not support it.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
