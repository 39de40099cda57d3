//! Starting and finishing a capture: the output directory, arming, the
//! manifest written last and atomically.
//!
//! Replacing an existing tree (`force`) never loses it if the new capture
//! dies: the new tree is written into a hidden sibling staging directory
//! (`.NAME.taptree-new-PID`), and only after its manifest is on disk is the
//! old tree renamed aside (`.NAME.taptree-old-PID`), the new one renamed into
//! place and the old one kept as the path's spare (`crate::spare`: the next
//! replacement writes over its files rather than deleting them), or deleted
//! with `TAPTREE_SPARE=0`. A crash before that leaves the old tree
//! untouched; a crash between the two renames leaves both trees complete
//! under their hidden names. The next capture to the same path cleans up
//! after a killed one: it puts the old tree back if the path is empty, and
//! deletes what is left of the staging.

use crate::arm;
use crate::error::{Error, Result};
use crate::manifest::{Manifest, RunInfo, FORMAT_VERSION, MARKER_FILE};
use crate::out_dir::*;
use crate::select::Selection;
use crate::stage::StageSpec;
use crate::tree_dir::{remove_tree, sibling};
use crate::writer::{writer_threads, Active, Written};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The tree to write.
    pub out: PathBuf,
    /// Which taps (and positions) to write; the rest are not copied.
    pub selection: Selection,
    /// Replace an existing tree at `out` (never anything that is not a tree).
    pub force: bool,
    /// The stage vocabulary in forward order, recorded in the manifest.
    pub stages: Vec<StageSpec>,
    /// How the run was made; empty `host`, `argv` and `time` are filled in.
    pub run: RunInfo,
}

/// What a finished capture wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Taps written.
    pub taps: usize,
    /// Tensor bytes (headers not counted).
    pub bytes: u64,
    /// The root hash, lowercase hex.
    pub root: String,
    /// The tree's directory.
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
    /// The staging directory is the path's spare, holding the replaced
    /// tree's files (`crate::spare`).
    recycled: bool,
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
        let (staging, recycled) = match prepare_out(&opts.out, opts.force)? {
            Some((dir, recycled)) => (Some(dir), recycled),
            None => (None, false),
        };
        let dir = staging.clone().unwrap_or_else(|| opts.out.clone());
        let (active, writers) = Active::start(dir, opts.selection, writer_threads(), !recycled);
        let mut capture = Capture {
            active: Arc::clone(&active),
            writers,
            out: opts.out,
            staging,
            recycled,
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
        let force = std::env::var("TAPTREE_FORCE").is_ok_and(|v| force_is_set(&v));
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
        let mut timing = Timing::start();
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
        timing.mark("writers joined");
        if self.recycled {
            // The spare's files that this tree does not rewrite.
            let kept: HashSet<&str> = entries.iter().map(|(_, e)| e.path.as_str()).collect();
            crate::spare::remove_stale(&self.active.dir, &kept)?;
        }
        // Every tap file durable before the manifest that names it exists.
        crate::writer::make_durable(
            &self.active.dir,
            entries.iter().map(|(_, e)| e.path.as_str()),
        )?;
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
        let ranked = entries.iter().any(|e| e.key.rank.is_some());
        let mut manifest = Manifest {
            format: "taptree".into(),
            format_version: if ranked {
                crate::manifest::FORMAT_VERSION_RANKED
            } else {
                FORMAT_VERSION
            }
            .into(),
            root: String::new(),
            manifest_blake3: None,
            run: std::mem::take(&mut self.run),
            selection: self.active.selection.to_string(),
            stages: std::mem::take(&mut self.stages),
            dirs: Default::default(),
            entries,
        };
        (manifest.dirs, manifest.root) = manifest.hashes();
        timing.mark("tap files durable");
        let root = manifest.root.clone();
        let dir = self.active.dir.clone();
        write_manifest(&dir, &manifest)?;
        timing.mark("manifest written");
        if let Some(staging) = self.staging.take() {
            swap_into_place(&staging, &self.out)?;
            timing.mark("old tree replaced");
        }
        timing.report();
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

impl Drop for Capture {
    fn drop(&mut self) {
        if !self.done {
            self.abandon();
        }
    }
}

/// The phases of [`Capture::finish`], printed to stderr when
/// `TAPTREE_TIMING=1` (with the writer threads' own time, summed over
/// threads): where the end of a capture goes.
struct Timing {
    on: bool,
    last: std::time::Instant,
    phases: Vec<(&'static str, f64)>,
}

impl Timing {
    fn start() -> Timing {
        Timing {
            on: std::env::var_os("TAPTREE_TIMING").is_some_and(|v| v == "1"),
            last: std::time::Instant::now(),
            phases: Vec::new(),
        }
    }

    fn mark(&mut self, what: &'static str) {
        let now = std::time::Instant::now();
        self.phases.push((what, (now - self.last).as_secs_f64()));
        self.last = now;
    }

    fn report(&self) {
        if !self.on {
            return;
        }
        let w = |i: usize| {
            crate::writer::WRITER_NANOS[i].load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9
        };
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(what, s)| format!("{what} +{s:.3} s"))
            .collect();
        eprintln!(
            "capture finish: {}; writer threads: hash {:.3} s, create+write {:.3} s, writeback start {:.3} s",
            phases.join(", "),
            w(0),
            w(1),
            w(2)
        );
    }
}

fn swap_into_place(staging: &Path, out: &Path) -> Result<()> {
    let old = sibling(out, "old");
    if old.exists() {
        remove_tree(&old).map_err(|e| Error::io(&old, e))?;
    }
    std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
    std::fs::rename(staging, out).map_err(|e| Error::io(staging, e))?;
    crate::spare::keep(&old, out)
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

/// Whether a `TAPTREE_FORCE` value asks to replace an existing tree: `1`,
/// `true` or `yes`; anything else (empty too) does not.
pub fn force_is_set(value: &str) -> bool {
    matches!(value, "1" | "true" | "yes")
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
