//! Starting and finishing a capture: the output directory, arming, the
//! manifest written last and atomically.
//!
//! Replacing an existing tree (`force`) never loses it if the new capture
//! dies: the new tree is written into a hidden sibling staging directory
//! (`.NAME.taptree-new-PID`), and only after its manifest is on disk is the
//! old tree renamed aside (`.NAME.taptree-old-PID`), the new one renamed into
//! place and the old one deleted. A crash before that leaves the old tree
//! untouched; a crash between the two renames leaves both trees complete
//! under their hidden names. The next capture to the same path cleans up
//! after a killed one: it puts the old tree back if the path is empty, and
//! deletes what is left of the staging.

use crate::arm;
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, RunInfo, FORMAT_VERSION, MANIFEST_FILE, MARKER_FILE};
use crate::select::Selection;
use crate::stage::StageSpec;
use crate::writer::{Active, Written};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The tree to write.
    pub out: PathBuf,
    pub selection: Selection,
    /// Replace an existing tree at `out` (never anything that is not a tree).
    pub force: bool,
    /// The stage vocabulary in forward order, recorded in the manifest.
    pub stages: Vec<StageSpec>,
    pub run: RunInfo,
}

/// What a finished capture wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub taps: usize,
    /// Tensor bytes (headers not counted).
    pub bytes: u64,
    pub root: String,
    pub path: PathBuf,
}

/// An armed capture. Taps go to it until [`Capture::finish`]; dropping it
/// without finishing disarms and leaves an incomplete tree (no manifest).
pub struct Capture {
    active: Arc<Active>,
    writers: Vec<JoinHandle<Written>>,
    out: PathBuf,
    /// Set when replacing an existing tree: where the new one is staged.
    staging: Option<PathBuf>,
    stages: Vec<StageSpec>,
    run: RunInfo,
    done: bool,
    /// Held from start to finish: one capture per path at a time.
    lock: Option<PathLock>,
}

impl Capture {
    /// Prepares `opts.out` and arms the capture. Only one capture may be
    /// armed per process.
    pub fn start(opts: CaptureOptions) -> Result<Capture> {
        if let Some(other) = arm::armed_capture() {
            return Err(Error::AlreadyArmed {
                path: opts.out,
                other: other.dir.clone(),
            });
        }
        let lock = PathLock::acquire(&opts.out)?;
        let staging = prepare_out(&opts.out, opts.force)?;
        let dir = staging.clone().unwrap_or_else(|| opts.out.clone());
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4);
        let (active, writers) = Active::start(dir, opts.selection, threads);
        let mut capture = Capture {
            active: Arc::clone(&active),
            writers,
            out: opts.out,
            staging,
            stages: opts.stages,
            run: opts.run,
            done: false,
            lock: Some(lock),
        };
        fill_run_defaults(&mut capture.run);
        if arm::arm(active).is_err() {
            let other = arm::armed_capture()
                .map(|a| a.dir.clone())
                .unwrap_or_default();
            capture.abandon();
            return Err(Error::AlreadyArmed {
                path: capture.out.clone(),
                other,
            });
        }
        Ok(capture)
    }

    /// Arms from the environment: `TAPTREE_OUT` (the tree; unset or empty:
    /// no capture), `TAPTREE_SELECT` (a selection), `TAPTREE_FORCE=1`.
    pub fn from_env(stages: Vec<StageSpec>, run: RunInfo) -> Result<Option<Capture>> {
        let out = match std::env::var_os("TAPTREE_OUT") {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => return Ok(None),
        };
        let selection = match std::env::var("TAPTREE_SELECT") {
            Ok(s) => Selection::parse(&s)?,
            Err(_) => Selection::all(),
        };
        let force = matches!(
            std::env::var("TAPTREE_FORCE").as_deref(),
            Ok("1") | Ok("true") | Ok("yes")
        );
        Capture::start(CaptureOptions {
            out,
            selection,
            force,
            stages,
            run,
        })
        .map(Some)
    }

    /// The run metadata, to complete before `finish` (prompt tokens, ...).
    pub fn run_mut(&mut self) -> &mut RunInfo {
        &mut self.run
    }

    /// The tree being written.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Disarms, waits for the writers, and writes the manifest. Any writer
    /// error (disk full, ...) or broken tap contract is returned here, and
    /// then no manifest is written: the tree stays incomplete.
    pub fn finish(mut self) -> Result<Summary> {
        self.done = true;
        arm::disarm(&self.active);
        self.active.close();
        let mut entries = Vec::new();
        let mut errors = Vec::new();
        let mut panicked = false;
        for handle in self.writers.drain(..) {
            match handle.join() {
                Ok(w) => {
                    entries.extend(w.entries);
                    errors.extend(w.errors);
                }
                Err(_) => panicked = true,
            }
        }
        if panicked {
            return Err(Error::WriterPanicked {
                path: self.active.dir.clone(),
            });
        }
        if let Some(misuse) = self.active.take_misuse() {
            return Err(misuse);
        }
        errors.sort_by_key(|(seq, _)| *seq);
        if let Some((_, err)) = errors.into_iter().next() {
            return Err(err);
        }
        entries.sort_by_key(|(seq, _)| *seq);
        let entries: Vec<_> = entries.into_iter().map(|(_, e)| e).collect();
        if entries.is_empty() && !self.active.selection.is_all() {
            // Not a tree of nothing: the selection was meant to keep
            // something. A misspelt stage is the likely cause: name them.
            match self.staging.take() {
                Some(staging) => {
                    let _ = remove_tree(&staging);
                }
                None => {
                    let _ = std::fs::remove_file(self.active.dir.join(MARKER_FILE));
                    let _ = std::fs::remove_dir(&self.active.dir);
                }
            }
            let names: Vec<&str> = self.stages.iter().map(|s| s.name.as_str()).collect();
            let unknown = self.active.selection.unmatched_stage_globs(&names);
            return Err(Error::SelectsNothing {
                path: self.out.clone(),
                selection: self.active.selection.to_string(),
                reason: match unknown.first() {
                    Some(glob) if !names.is_empty() => format!(
                        "matched no tap: stage {glob:?} is not one of {} (no tree written)",
                        names.join(", ")
                    ),
                    _ => "matched no tap of this run (no tree written)".into(),
                },
            });
        }
        let mut seen = HashSet::new();
        for e in &entries {
            if !seen.insert(&e.key) {
                return Err(Error::BadTap {
                    path: self.active.dir.clone(),
                    key: e.key.to_string(),
                    reason: "tapped twice in one capture".into(),
                });
            }
        }
        let mut manifest = Manifest {
            format: "taptree".into(),
            format_version: FORMAT_VERSION.into(),
            root: String::new(),
            manifest_blake3: None,
            run: std::mem::take(&mut self.run),
            selection: self.active.selection.to_string(),
            stages: std::mem::take(&mut self.stages),
            dirs: Default::default(),
            entries,
        };
        (manifest.dirs, manifest.root) = manifest.hashes();
        let root = manifest.root.clone();
        let dir = self.active.dir.clone();
        write_manifest(&dir, &manifest)?;
        if let Some(staging) = self.staging.take() {
            swap_into_place(&staging, &self.out)?;
        }
        self.lock.take();
        Ok(Summary {
            taps: manifest.entries.len(),
            bytes: manifest.bytes_of_entries(),
            root,
            path: self.out.clone(),
        })
    }

    fn abandon(&mut self) {
        self.done = true;
        arm::disarm(&self.active);
        self.active.close();
        for handle in self.writers.drain(..) {
            let _ = handle.join();
        }
        // An abandoned replacement leaves the old tree as it was and no
        // half-written staging directory beside it.
        if let Some(staging) = self.staging.take() {
            let _ = remove_tree(&staging);
        }
        self.lock.take();
    }
}

/// An advisory lock (`flock`) on a tree's path, held in a hidden sibling
/// file `.NAME.taptree-lock` that names its holder. Released (and the file
/// removed) on drop; a killed holder's lock is released by the kernel.
struct PathLock {
    path: PathBuf,
    file: std::fs::File,
}

impl PathLock {
    fn acquire(out: &Path) -> Result<PathLock> {
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
fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
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
fn try_lock(_file: &std::fs::File) -> std::io::Result<bool> {
    Ok(true)
}

#[cfg(unix)]
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &std::fs::File, path: &Path) -> bool {
    path.exists()
}

/// Deletes a tree (or a staging directory) so that, if killed part way,
/// what remains is still recognisably a tree: its marker goes last.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
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

/// What a tree killed while being deleted by an earlier taptree (which
/// deleted its marker and manifest first) leaves: only tree-shaped files.
fn tree_remains(dir: &Path) -> bool {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return false;
    };
    let is_layer_dir = |n: &str| {
        n == manifest::GLOBAL_DIR
            || n.strip_prefix('L')
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
    };
    listing.flatten().all(|item| {
        let name = item.file_name().to_string_lossy().into_owned();
        let Ok(kind) = item.file_type() else {
            return false;
        };
        if kind.is_file() {
            return name == MARKER_FILE
                || name.starts_with(MANIFEST_FILE)
                || name.starts_with(crate::index::INDEX_FILE);
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

impl Drop for Capture {
    fn drop(&mut self) {
        if !self.done {
            self.abandon();
        }
    }
}

/// Makes `out` ready; returns the staging directory when replacing a tree.
fn prepare_out(out: &Path, force: bool) -> Result<Option<PathBuf>> {
    recover_siblings(out)?;
    match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
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
            std::fs::create_dir(&staging).map_err(|e| Error::io(&staging, e))?;
            write_marker(&staging)?;
            Ok(Some(staging))
        }
    }
}

/// Deals with what a replacing capture that was killed left beside `out`
/// (a killed process cleans nothing up): the previous tree renamed aside is
/// put back when `out` is gone (killed between the two renames of
/// [`swap_into_place`]) and deleted when `out` holds its replacement; a
/// staging directory is deleted. Only siblings of processes that are no
/// longer running are touched, and only if they are trees.
fn recover_siblings(out: &Path) -> Result<()> {
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
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if pid == std::process::id()
            || running(pid)
            || !is_dir
            || !(is_tree(&path) || tree_remains(&path))
        {
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
    Ok(())
}

/// Whether process `pid` is running (or may be: anything unsure is yes).
#[cfg(unix)]
fn running(pid: u32) -> bool {
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
fn running(_pid: u32) -> bool {
    true
}

/// A tree, complete or not, carries the marker or a manifest.
fn is_tree(dir: &Path) -> bool {
    dir.join(MARKER_FILE).is_file() || dir.join(MANIFEST_FILE).is_file()
}

fn sibling(out: &Path, what: &str) -> PathBuf {
    sibling_named(out, format!("{what}-{}", std::process::id()))
}

/// `.NAME.taptree-{what}` beside `out`.
fn sibling_named(out: &Path, what: String) -> PathBuf {
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

fn write_marker(dir: &Path) -> Result<()> {
    let path = dir.join(MARKER_FILE);
    std::fs::write(
        &path,
        format!("taptree tree, format {FORMAT_VERSION}; complete once {MANIFEST_FILE} exists\n"),
    )
    .map_err(|e| Error::io(&path, e))
}

/// Temp file, fsync, rename: a reader sees no manifest or a whole one.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let path = dir.join(MANIFEST_FILE);
    let mut json = serde_json::to_vec(&manifest::ManifestOut::new(manifest))
        .expect("a manifest always serializes");
    json.push(b'\n');
    let sealed = manifest::seal(&mut json);
    debug_assert!(sealed, "ManifestOut writes a manifest_blake3");
    // The index first: a manifest of format 2.1 is never without one.
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

fn swap_into_place(staging: &Path, out: &Path) -> Result<()> {
    let old = sibling(out, "old");
    if old.exists() {
        remove_tree(&old).map_err(|e| Error::io(&old, e))?;
    }
    std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
    std::fs::rename(staging, out).map_err(|e| Error::io(staging, e))?;
    remove_tree(&old).map_err(|e| Error::io(&old, e))
}

fn fill_run_defaults(run: &mut RunInfo) {
    if run.time.is_empty() {
        run.time = utc_now();
    }
    if run.host.is_empty() {
        run.host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_default();
    }
    if run.argv.is_empty() {
        run.argv = std::env::args().collect();
    }
}

/// RFC 3339 UTC, seconds precision, from the system clock.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
    }
}
