//! The format 2.3 checksums of trusted `verify A B`, shared by a few
//! threads: every 1 MiB chunk of a tree's mapped manifest and index body is
//! hashed on whichever thread is free (and its pages are faulted in there:
//! the files are not mapped populated, which the kernel would do on one
//! core; reading them into buffers instead cost more here).

use super::head::{fold_chunks, xxh3, CHUNK};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most threads one call uses by default: 33 MB of checksum is
/// memory-bound beyond a few cores, and each thread costs its start.
const MAX_THREADS: usize = 4;

/// How many threads one tree's checksums use: `TAPTREE_VERIFY_THREADS`
/// when it is a positive number, else half the cores (trusted `verify A B`
/// checks its two trees at once), at least 1 and at most [`MAX_THREADS`].
/// On two cores one thread per tree was the fastest (docs/PERFORMANCE.md).
pub(crate) fn threads() -> usize {
    std::env::var("TAPTREE_VERIFY_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2).min(MAX_THREADS))
        })
}

/// The checksums of `parts` (mapped files), in order, by up to
/// [`threads`] threads.
pub(crate) fn checksums_of(parts: &[&[u8]]) -> Vec<[u8; 16]> {
    let mut jobs: Vec<&[u8]> = Vec::new();
    for p in parts {
        jobs.extend(p.chunks(CHUNK));
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let j = next.fetch_add(1, Ordering::Relaxed);
            let Some(b) = jobs.get(j) else {
                return done;
            };
            done.push((j, xxh3(b)));
        }
    };
    let threads = threads().min(jobs.len().max(1));
    let mut digests = vec![[0u8; 16]; jobs.len()];
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = vec![Some(work())];
        all.extend(helpers.into_iter().map(|h| h.join().ok()));
        for part in all.into_iter().flatten() {
            for (j, d) in part {
                digests[j] = d;
            }
        }
    });
    let mut out = Vec::with_capacity(parts.len());
    let mut at = 0;
    for p in parts {
        let n = p.len().div_ceil(CHUNK);
        out.push(fold_chunks(&digests[at..at + n]));
        at += n;
    }
    out
}
