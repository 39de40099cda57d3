//! A team of threads for the forward's many short parallel regions (a
//! prefill of SmolLM2 opens about 270, each tens of microseconds on 16
//! cores): between regions the team's threads spin for a while instead of
//! going to sleep, so a region starts without waking anyone, and its tasks
//! are claimed one index at a time from a shared counter. The calling
//! thread takes tasks too. rayon's workers instead sleep after a few
//! microseconds without work, and every region then pays their wake-ups.
//!
//! The team has `rayon::current_num_threads() - 1` threads besides the
//! caller, so `RAYON_NUM_THREADS` still sets the thread count. One region
//! runs on it at a time: a region started while another runs (or from one
//! of its tasks) goes to rayon instead. Which thread runs a task never
//! changes what the task computes, so neither does the team.
//! `TAPTREE_CPU_TEAM=0` starts no team: every region goes to rayon (so
//! one binary measures both).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle team thread spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

struct Team {
    threads: usize,
    /// Held by the thread that runs a region on the team.
    busy: Mutex<()>,
    /// Bumped for every region (its low bit unused).
    gen: AtomicUsize,
    /// The region's task (a pointer to the caller's reference to it); read
    /// only by team threads `active` in an `open` region.
    task: AtomicPtr<Task<'static>>,
    tasks: AtomicUsize,
    next: AtomicUsize,
    open: AtomicBool,
    /// Team threads inside the current region.
    active: AtomicUsize,
    sleepers: Mutex<usize>,
    wake: Condvar,
}

fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let team: &'static Team = Box::leak(Box::new(Team {
            threads: if std::env::var("TAPTREE_CPU_TEAM").as_deref() == Ok("0") {
                0
            } else {
                threads().max(1) - 1
            },
            busy: Mutex::new(()),
            gen: AtomicUsize::new(0),
            task: AtomicPtr::new(std::ptr::null_mut()),
            tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            open: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..team.threads {
            std::thread::Builder::new()
                .name(format!("taptree-cpu-{i}"))
                .spawn(move || team.work())
                .expect("spawning a CPU forward thread");
        }
        team
    })
}

impl Team {
    /// A team thread: waits for each region, joins it, takes tasks.
    fn work(&self) {
        let mut seen = self.gen.load(SeqCst);
        loop {
            seen = self.wait(seen);
            self.active.fetch_add(1, SeqCst);
            if self.open.load(SeqCst) && self.gen.load(SeqCst) == seen {
                let task = self.task.load(SeqCst);
                // SAFETY: set before `open`, and the caller's reference it
                // points to outlives the region, which waits for `active`.
                if let Some(task) = unsafe { task.as_ref() } {
                    self.claim(*task);
                }
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }

    /// Waits until `gen` moves past `seen`; spins first, then sleeps.
    fn wait(&self, seen: usize) -> usize {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = self.gen.load(SeqCst);
            if g != seen {
                return g;
            }
            spins += 1;
            if spins % 1024 != 0 {
                std::hint::spin_loop();
                continue;
            }
            if start.elapsed() < SPIN {
                std::thread::yield_now();
                continue;
            }
            let mut sleepers = self.sleepers.lock().unwrap_or_else(|p| p.into_inner());
            *sleepers += 1;
            while self.gen.load(SeqCst) == seen {
                sleepers = self.wake.wait(sleepers).unwrap_or_else(|p| p.into_inner());
            }
            *sleepers -= 1;
        }
    }

    /// Runs tasks until none is left.
    fn claim(&self, task: Task<'_>) {
        let n = self.tasks.load(SeqCst);
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= n {
                return;
            }
            task(i);
        }
    }
}

/// Runs `f(i)` for every `i` in `0..n`, each once, on the team (or on
/// rayon's threads when the team is taken), and returns when all are done.
pub(crate) fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    if n <= 1 {
        return (0..n).for_each(f);
    }
    let team = team();
    let guard = match team.busy.try_lock() {
        Ok(g) if team.threads > 0 => g,
        _ => {
            use rayon::prelude::*;
            return (0..n).into_par_iter().for_each(f);
        }
    };
    // SAFETY: team threads reach the task only while the region is open or
    // they are counted `active` in it; both end before this returns.
    let task: Task<'static> = unsafe { std::mem::transmute::<Task<'_>, Task<'static>>(f) };
    team.task
        .store(&task as *const Task<'static> as *mut _, SeqCst);
    team.tasks.store(n, SeqCst);
    team.next.store(0, SeqCst);
    team.open.store(true, SeqCst);
    team.gen.fetch_add(2, SeqCst);
    if *team.sleepers.lock().unwrap_or_else(|p| p.into_inner()) > 0 {
        team.wake.notify_all();
    }
    team.claim(f);
    team.open.store(false, SeqCst);
    let mut spins = 0u32;
    while team.active.load(SeqCst) != 0 {
        spins += 1;
        if spins % 1024 == 0 {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    team.task.store(std::ptr::null_mut(), SeqCst);
    drop(guard);
}

/// The global thread count, as rayon's global pool reads it:
/// `RAYON_NUM_THREADS` when set and positive, else the CPUs available.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A raw pointer that tasks use at disjoint offsets.
struct Ptr<T>(*mut T);
// SAFETY: every use below gives each task its own elements, and nothing
// reads them until `for_each` has returned.
unsafe impl<T: Send> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    /// The pointer (a method, so that closures capture the `Ptr`).
    fn at(&self, i: usize) -> *mut T {
        // SAFETY: callers stay within the allocation (see the uses).
        unsafe { self.0.add(i) }
    }
}

/// `f(i, row i of a, row i of b)` for every row (`a` in rows of `wa`, `b`
/// of `wb`, as many of each), on the team; the results in row order.
pub(crate) fn chunks2_map<A: Send, B: Send, R: Send>(
    a: &mut [A],
    wa: usize,
    b: &mut [B],
    wb: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) -> R + Sync,
) -> Vec<R> {
    let n = a.len() / wa.max(1);
    assert!(
        a.len() == n * wa && b.len() == n * wb,
        "rows of {wa} and {wb}"
    );
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    let (pa, pb, po) = (
        Ptr(a.as_mut_ptr()),
        Ptr(b.as_mut_ptr()),
        Ptr(out.as_mut_ptr()),
    );
    for_each(n, &|i| {
        // SAFETY: in bounds (i < n rows of each); task i alone touches
        // row i of a, b and out.
        let (ai, bi) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.at(i * wa), wa),
                std::slice::from_raw_parts_mut(pb.at(i * wb), wb),
            )
        };
        let r = f(i, ai, bi);
        // SAFETY: as above.
        unsafe { *po.at(i) = Some(r) };
    });
    out.into_iter().map(|r| r.expect("every row ran")).collect()
}

/// `f(i, row i of a)` for every row of `a` (rows of `w`), on the team; the
/// results in row order.
pub(crate) fn chunks_map<A: Send, R: Send>(
    a: &mut [A],
    w: usize,
    f: impl Fn(usize, &mut [A]) -> R + Sync,
) -> Vec<R> {
    let n = a.len() / w.max(1);
    let mut none: Vec<()> = vec![(); n];
    chunks2_map(a, w, &mut none, 1, |i, ai, _| f(i, ai))
}
