//! Off the hot path: a byte-bounded queue feeding writer threads that hash
//! each tap with blake3, write it as one safetensors file and start its
//! writeback to disk at once (Linux: `sync_file_range`), so the data goes to
//! disk while the forward runs; [`make_durable`] then waits, at the end, for
//! what is still in flight.

use crate::dtype::DType;
use crate::error::Error;
use crate::key::{Key, Shard, TapId};
use crate::manifest::{self, Entry};
use crate::select::Selection;
use crate::tapfile;
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Nanoseconds the writer threads spent hashing, creating and writing
/// files, and starting their writeback, summed over threads: what
/// `TAPTREE_TIMING=1` reports at the end of a capture.
pub(crate) static WRITER_NANOS: [AtomicU64; 3] =
    [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

fn add_nanos(i: usize, since: std::time::Instant) {
    WRITER_NANOS[i].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// At most this many tap bytes wait in the queue; a tap beyond it blocks the
/// forward until a writer catches up (memory stays bounded on long runs).
pub const QUEUE_BYTES: u64 = 256 << 20;

struct Job {
    seq: u64,
    key: Key,
    dtype: DType,
    shape: Vec<usize>,
    data: Box<dyn TapBytes>,
}

/// A tap's bytes as the writers hold them: the capture's copy of the rows
/// selected, or the caller's own buffer handed over whole
/// ([`Active::tap_owned`]).
pub(crate) trait TapBytes: Send {
    /// The bytes hashed and written.
    fn bytes(&self) -> &[u8];
}

impl<T: bytemuck::Pod + Send> TapBytes for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
}

/// Bytes in flight between the forward and the writers.
struct Budget {
    used: Mutex<u64>,
    freed: Condvar,
    limit: u64,
}

impl Budget {
    fn acquire(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        // A tap larger than the whole budget still goes through, alone.
        while *used > 0 && *used + n > self.limit {
            used = self.freed.wait(used).unwrap_or_else(|p| p.into_inner());
        }
        *used += n;
    }

    fn release(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used -= n;
        self.freed.notify_all();
    }
}

/// An armed capture: what the hot path talks to.
pub(crate) struct Active {
    /// Where files are written (the tree, or its staging directory under --force).
    pub dir: PathBuf,
    pub selection: Selection,
    tx: Mutex<Option<Sender<Job>>>,
    budget: Arc<Budget>,
    seq: AtomicU64,
    /// The first broken tap contract, reported by `finish()`.
    misuse: Mutex<Option<Error>>,
}

/// What the writer threads hand back when joined.
pub(crate) struct Written {
    pub entries: Vec<(u64, Entry)>,
    pub errors: Vec<(u64, Error)>,
}

impl Active {
    /// Starts `threads` writers into `dir`; `fresh`: `dir` was created
    /// empty for this capture (not a recycled spare holding old files).
    pub fn start(
        dir: PathBuf,
        selection: Selection,
        threads: usize,
        fresh: bool,
    ) -> (Arc<Active>, Vec<JoinHandle<Written>>) {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let budget = Arc::new(Budget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            limit: QUEUE_BYTES,
        });
        let handles = (0..threads.max(1))
            .map(|i| {
                let rx = Arc::clone(&rx);
                let budget = Arc::clone(&budget);
                let dir = dir.clone();
                std::thread::Builder::new()
                    .name(format!("taptree-writer-{i}"))
                    .spawn(move || write_loop(&dir, &rx, &budget, fresh))
                    .expect("spawning a writer thread")
            })
            .collect();
        let active = Arc::new(Active {
            dir,
            selection,
            tx: Mutex::new(Some(tx)),
            budget,
            seq: AtomicU64::new(0),
            misuse: Mutex::new(None),
        });
        (active, handles)
    }

    /// Closes the queue: writers drain what is queued and exit.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    pub fn take_misuse(&self) -> Option<Error> {
        self.misuse.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn misuse(&self, key: &Key, reason: String) {
        let mut slot = self.misuse.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(Error::BadTap {
                path: self.dir.clone(),
                key: key.to_string(),
                reason,
            });
        }
    }

    /// Queues the selected runs of positions of one tap for the writers,
    /// each a copy of its rows; a tap that breaks the contract is kept as
    /// the capture's misuse.
    pub fn tap(&self, id: TapId<'_>, shape: &[usize], bytes: &[u8], dtype: DType) {
        let Some(runs) = self.selected(id, shape, bytes.len(), dtype) else {
            return;
        };
        self.queue_copies(id, shape, bytes, dtype, &runs);
    }

    /// [`Active::tap`] of a buffer the caller gives up: when the selection
    /// keeps all of its rows, the buffer itself is queued, not a copy (a
    /// prefill's logits, 7.3 MB for SmolLM2, were copied on the forward's
    /// clock); else the runs kept are copied as [`Active::tap`] does. The
    /// bytes written and hashed are the same either way.
    pub fn tap_owned(&self, id: TapId<'_>, shape: &[usize], data: Box<dyn TapBytes>, dtype: DType) {
        let Some(runs) = self.selected(id, shape, data.bytes().len(), dtype) else {
            return;
        };
        if let [run] = &runs[..] {
            if *run == id.pos() {
                return self.queue(id, run.clone(), shape, dtype, data);
            }
        }
        self.queue_copies(id, shape, data.bytes(), dtype, &runs);
    }

    /// The runs of positions of a tap of `len` bytes to keep; `None` when
    /// it is not selected or breaks the contract (then kept as the misuse).
    fn selected(
        &self,
        id: TapId<'_>,
        shape: &[usize],
        len: usize,
        dtype: DType,
    ) -> Option<Vec<Range<u32>>> {
        if !self.selection.matches_identity(id) {
            return None;
        }
        // Built only for a misuse report: each selected run gets its own key.
        let key = || id.to_key();
        let misuse = |reason: String| {
            self.misuse(&key(), reason);
            None
        };
        if !manifest::valid_stage_name(id.stage) {
            return misuse(format!("stage names are {}", manifest::STAGE_NAME_RULE));
        }
        let pos = id.pos();
        let rows = id.rows() as usize;
        if let Err(reason) = manifest::check_key_bounds(id.layer, &pos) {
            return misuse(reason);
        }
        if shape.first() != Some(&rows) {
            return misuse(format!(
                "shape {shape:?}: axis 0 must be the {rows} positions of {pos:?}"
            ));
        }
        if let Some(shard) = id.shard {
            if let Err(reason) = check_shard(shard, shape) {
                return misuse(reason);
            }
        }
        let elements = match tapfile::element_count(shape) {
            Ok(n) => n,
            Err(reason) => return misuse(reason),
        };
        if elements * dtype.size() != len {
            return misuse(format!(
                "shape {shape:?} holds {elements} elements, data has {}",
                len / dtype.size()
            ));
        }
        Some(self.selection.selected_runs(pos).collect())
    }

    /// Queues a copy of each run's rows of `bytes`.
    fn queue_copies(
        &self,
        id: TapId<'_>,
        shape: &[usize],
        bytes: &[u8],
        dtype: DType,
        runs: &[Range<u32>],
    ) {
        let start = id.pos().start;
        let row_bytes = bytes.len() / id.rows() as usize;
        for run in runs {
            let first = (run.start - start) as usize;
            let count = (run.end - run.start) as usize;
            let data = copy_out(&bytes[first * row_bytes..(first + count) * row_bytes]);
            self.queue(id, run.clone(), shape, dtype, Box::new(data));
        }
    }

    /// Queues the rows of positions `run` of a tap: `data`, of `shape` but
    /// for its first axis (`run`'s length).
    fn queue(
        &self,
        id: TapId<'_>,
        run: Range<u32>,
        shape: &[usize],
        dtype: DType,
        data: Box<dyn TapBytes>,
    ) {
        let mut shape = shape.to_vec();
        shape[0] = run.len();
        let job = Job {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            key: id.with_pos(run).to_key(),
            dtype,
            shape,
            data,
        };
        let len = job.data.bytes().len() as u64;
        self.budget.acquire(len);
        let sent = match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        };
        if !sent {
            self.budget.release(len);
        }
    }
}

/// The pieces a large tap is copied in: a tap of two pieces or more is
/// copied on rayon's threads.
const PARALLEL_COPY: usize = 1 << 20;

/// The tap's bytes, copied for the writers. A large tap (a prefill's logits:
/// 7.3 MB for SmolLM2) lands in fresh pages, and faulting them in one by one
/// was most of the forward thread's time in a tap (about 5 ms of a 16-thread
/// prefill's 49); split in 1 MiB pieces over rayon's threads, the faults and
/// the copy are shared. The bytes are the same either way. (The CPU
/// forward's logits now come through [`Active::tap_owned`], uncopied where
/// every row is kept.)
fn copy_out(src: &[u8]) -> Vec<u8> {
    use rayon::prelude::*;
    if src.len() < 2 * PARALLEL_COPY || rayon::current_num_threads() < 2 {
        return src.to_vec();
    }
    let mut out = vec![0u8; src.len()];
    out.par_chunks_mut(PARALLEL_COPY)
        .zip(src.par_chunks(PARALLEL_COPY))
        .for_each(|(to, from)| to.copy_from_slice(from));
    out
}

/// Whether `shard` can place a tensor of `shape` in a full one.
pub(crate) fn check_shard(shard: Shard, shape: &[usize]) -> Result<(), String> {
    manifest::check_shard_bounds(shard, shape.len())?;
    let axis = shard.axis as usize;
    if (shard.end - shard.start) as usize != shape[axis] {
        return Err(format!(
            "shard {shard}: holds {} along axis {axis}, shape {shape:?} has {}",
            shard.end - shard.start,
            shape[axis]
        ));
    }
    Ok(())
}

fn write_loop(dir: &Path, rx: &Mutex<Receiver<Job>>, budget: &Budget, fresh: bool) -> Written {
    let mut out = Written {
        entries: Vec::new(),
        errors: Vec::new(),
    };
    let mut made_dirs: HashSet<String> = HashSet::new();
    loop {
        // The lock is held only while waiting for one job.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return out,
        };
        let len = job.data.bytes().len() as u64;
        let seq = job.seq;
        match write_one(dir, &job, &mut made_dirs, fresh) {
            Ok(entry) => out.entries.push((seq, entry)),
            Err(e) => out.errors.push((seq, e)),
        }
        drop(job);
        budget.release(len);
    }
}

fn write_one(
    dir: &Path,
    job: &Job,
    made_dirs: &mut HashSet<String>,
    fresh: bool,
) -> Result<Entry, Error> {
    let rel = manifest::path_of(&job.key);
    // `path_of` is always `dir_of(key)/NAME`.
    let sub = rel.split_once('/').map_or("", |(d, _)| d);
    if !made_dirs.contains(sub) {
        let d = dir.join(sub);
        make_subdir(&d).map_err(|e| Error::io(&d, e))?;
        made_dirs.insert(sub.to_string());
    }
    let path = dir.join(&rel);
    let t = std::time::Instant::now();
    let data = job.data.bytes();
    let hash = blake3::hash(data).to_hex().to_string();
    let header = tapfile::encode_header(&job.key, job.dtype, &job.shape, data.len());
    add_nanos(0, t);
    let t = std::time::Instant::now();
    let opened = match fresh {
        true => create_new(&path),
        false => open_over(&path),
    };
    let (mut file, old_len) = opened.map_err(|e| Error::io(&path, e))?;
    let len = (header.len() + data.len()) as u64;
    file.write_all(&header)
        .and_then(|_| file.write_all(data))
        .and_then(|_| match old_len > len {
            true => file.set_len(len),
            false => Ok(()),
        })
        .map_err(|e| Error::io(&path, e))?;
    add_nanos(1, t);
    let t = std::time::Instant::now();
    start_writeback(&file);
    add_nanos(2, t);
    Ok(Entry {
        key: job.key.clone(),
        path: rel,
        dtype: job.dtype,
        shape: job.shape.clone(),
        blake3: hash,
        bytes: data.len() as u64,
        header_blake3: Some(blake3::hash(&header).to_hex().to_string()),
    })
}

/// Opens `path` to be written from its start, without truncating a file
/// already there (a replacement writing over its spare's files, the caller
/// shortening it after: truncating would free its blocks, and allocate new
/// ones, for nothing). Never through a symbolic link, and never into a file
/// with other names (it is unlinked and created afresh). Returns the file
/// and the length it had.
fn open_over(path: &Path) -> std::io::Result<(File, u64)> {
    let open = || {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.custom_flags(libc::O_NOFOLLOW);
        }
        o.open(path)
    };
    let file = open()?;
    let meta = file.metadata()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.nlink() > 1 {
            drop(file);
            std::fs::remove_file(path)?;
            return Ok((open()?, 0));
        }
    }
    Ok((file, meta.len()))
}

/// Creates `path` in a directory made empty for this capture: `O_EXCL`, so
/// no link is followed and no file already there is opened, and no `stat`
/// (what [`open_over`] pays per tap for a recycled spare's old files). A
/// file there after all is a tap written twice or another process's: it is
/// left alone and the capture fails, naming it.
fn create_new(path: &Path) -> std::io::Result<(File, u64)> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => Ok((file, 0)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(std::io::Error::new(
            e.kind(),
            "already there in a directory this capture made empty: its key was tapped twice, \
             or another process writes into the directory; the file was left alone",
        )),
        Err(e) => Err(e),
    }
}

/// Makes a tap directory (`global`, `L007`, ...) in the tree being written:
/// one already there (another writer thread's, or a recycled spare's) is
/// used only if it is a real directory, never through a symbolic link.
fn make_subdir(d: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(d) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(d)?.is_dir() {
                true => Ok(()),
                false => Err(std::io::Error::new(
                    e.kind(),
                    "not a directory (a link or a file is there); it was left alone",
                )),
            }
        }
        other => other,
    }
}

/// Starts writing `file`'s dirty pages to disk now, without waiting for
/// them (Linux; elsewhere the kernel's own writeback does it later).
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; the call only schedules I/O. A
        // failure here is not an error: `make_durable` reports what counts.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// How many threads write a capture's taps: `TAPTREE_CAPTURE_WRITERS` when
/// it is a positive number, else the cores, at least one and at most four
/// (each hashes and writes whole taps; the forward keeps the cores busy).
pub(crate) fn writer_threads() -> usize {
    positive_env("TAPTREE_CAPTURE_WRITERS").unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4)
    })
}

/// A positive whole number from the environment variable `name`, if set
/// to one.
fn positive_env(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
}

/// How many threads [`make_durable`] syncs from: `TAPTREE_SYNC_THREADS`
/// when it is a positive number, else [`SYNC_THREADS`] whatever the cores.
/// A thread waiting in `fdatasync` costs no CPU; more of them let a
/// journaling filesystem commit more files per journal flush.
pub(crate) fn sync_threads() -> usize {
    positive_env("TAPTREE_SYNC_THREADS").unwrap_or(SYNC_THREADS)
}

/// The syncing threads by default: not tied to the cores, since they wait
/// rather than compute (on two cores, two threads left a capture's end
/// three times longer than sixteen; docs/PERFORMANCE.md).
const SYNC_THREADS: usize = 16;

/// Makes the tap files `files` (relative to `dir`) durable, with their
/// names: each file `fdatasync`ed (its writeback, started when it was
/// written, is mostly done by now; a few threads wait on the rest at once,
/// which a journaling filesystem commits together), then each directory
/// fsynced. Only this capture's files are waited for, never the rest of
/// the filesystem. The first failure is returned: then no manifest may be
/// written.
pub(crate) fn make_durable<'a>(
    dir: &Path,
    files: impl Iterator<Item = &'a str>,
) -> Result<(), Error> {
    let paths: Vec<PathBuf> = files.map(|rel| dir.join(rel)).collect();
    let threads = sync_threads();
    let chunk = paths.len().div_ceil(threads).max(1);
    let first = std::thread::scope(|s| {
        let handles: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    for path in part {
                        File::open(path)
                            .and_then(|f| f.sync_data())
                            .map_err(|e| Error::io(path, e))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::WriterPanicked {
                        path: dir.to_path_buf(),
                    })
                })
            })
            .find(|r: &Result<(), Error>| r.is_err())
    });
    if let Some(err) = first {
        return err;
    }
    let dirs: std::collections::BTreeSet<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
    for d in dirs {
        // A filesystem that cannot sync a directory is not an error.
        if let Ok(f) = File::open(d) {
            let _ = f.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_tap_is_copied_byte_for_byte() {
        // On four threads whatever the host, so the parallel path runs; at
        // the threshold, either side of it, and with a ragged last piece.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let n = 3 * PARALLEL_COPY + 12_345;
        let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        pool.install(|| {
            for len in [
                100,
                2 * PARALLEL_COPY - 1,
                2 * PARALLEL_COPY,
                2 * PARALLEL_COPY + 1,
                n,
            ] {
                assert_eq!(copy_out(&src[..len]), &src[..len], "{len} bytes");
            }
            let mut other = src.clone();
            other[2 * PARALLEL_COPY + 1] ^= 1;
            assert_ne!(copy_out(&other), src, "a changed byte must show");
        });
    }

    #[test]
    fn a_file_in_a_fresh_directory_is_never_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        std::fs::write(&path, b"someone else's").unwrap();
        let err = create_new(&path).unwrap_err();
        assert!(err.to_string().contains("left alone"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        assert!(create_new(&dir.path().join("new.safetensors")).is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn a_tap_directory_is_never_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("L000")).unwrap();
        let err = make_subdir(&dir.path().join("L000")).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        std::fs::create_dir(dir.path().join("L001")).unwrap();
        make_subdir(&dir.path().join("L001")).unwrap();
        make_subdir(&dir.path().join("global")).unwrap();
        assert!(dir.path().join("global").is_dir());
    }
}
