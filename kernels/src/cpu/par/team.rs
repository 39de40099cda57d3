//! A team of threads that stay awake between the forward's regions.
//!
//! A SmolLM2 prefill opens about 270 regions, each a few hundred
//! microseconds on 16 threads; rayon's idle workers sleep a few
//! microseconds after their last job, so most regions start by waking them
//! one after another. A team's threads spin for [`SPIN`] after a region
//! before they sleep, so the next one starts with every thread at hand.
//!
//! A region of `n` tasks is cut into one contiguous range per thread (the
//! caller is one of them): each thread takes its own range from the front,
//! one task at a time, and when it is done takes tasks from the back of the
//! others' ranges. Neighbouring tasks (neighbouring output features of a
//! matmul, rows of a row pass) thus mostly run on the same thread, and the
//! only counter a thread touches per task is its own (each on its own cache
//! line). Which thread runs a task never changes what the task computes.
//!
//! There is one team per thread count (`rayon::current_num_threads()` where
//! the region starts, so `RAYON_NUM_THREADS` and a rayon pool's size both
//! set it); a region started while its team runs another (a task's own
//! region, or another thread's forward) goes to rayon.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::cpu::profile::Thread;

/// How long an idle team thread spins before it sleeps.
const SPIN: Duration = Duration::from_millis(1);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// What a panic carries (its message, for `panic!` with one).
type Payload = Box<dyn std::any::Any + Send>;

/// A value on its own cache lines (two, for the adjacent-line prefetcher).
#[repr(align(128))]
struct Line<T>(T);

struct Team {
    /// Threads besides the caller.
    helpers: usize,
    /// Held by the thread that runs a region on the team.
    busy: Mutex<()>,
    /// Bumped for every region; what idle threads spin on.
    gen: Line<AtomicUsize>,
    /// The region's task (a pointer to the caller's reference to it); read
    /// only by threads counted `active` while the region is `open`.
    task: Line<(AtomicPtr<Task<'static>>, AtomicBool)>,
    /// Team threads inside the current region.
    active: Line<AtomicUsize>,
    /// The payload of a task's panic on a team thread, the first of a
    /// region's: the caller raises it again when the region closes.
    panicked: Line<Mutex<Option<Payload>>>,
    /// Each thread's range of tasks, `next` in the low 32 bits, `end` in
    /// the high ones (slot 0 is the caller's).
    ranges: Box<[Line<AtomicU64>]>,
    /// Set by [`rest`]: idle threads sleep now rather than spin.
    rest: Line<AtomicBool>,
    sleepers: Line<AtomicUsize>,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Each thread besides the caller, as it registered when it started
    /// (for `TAPTREE_CPU_PROFILE`'s account of the threads' CPU time).
    threads: Box<[OnceLock<Thread>]>,
}

/// The team of `threads` threads (the caller and `threads - 1` others),
/// started on first use.
static TEAMS: OnceLock<Mutex<Vec<&'static Team>>> = OnceLock::new();

fn team(threads: usize) -> &'static Team {
    static LAST: AtomicPtr<Team> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: only leaked (never freed) teams are stored.
    if let Some(t) = unsafe { LAST.load(Acquire).as_ref() } {
        if t.helpers + 1 == threads {
            return t;
        }
    }
    let mut teams = TEAMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let t = match of(&teams, threads) {
        Some(t) => t,
        None => {
            let t = start(threads - 1);
            teams.push(t);
            t
        }
    };
    LAST.store(t as *const Team as *mut Team, Release);
    t
}

/// The team of `threads` threads among `teams`, if one was started.
fn of(teams: &[&'static Team], threads: usize) -> Option<&'static Team> {
    teams.iter().find(|t| t.helpers + 1 == threads).copied()
}

fn start(helpers: usize) -> &'static Team {
    let team: &'static Team = Box::leak(Box::new(Team {
        helpers,
        busy: Mutex::new(()),
        gen: Line(AtomicUsize::new(0)),
        task: Line((AtomicPtr::new(std::ptr::null_mut()), AtomicBool::new(false))),
        active: Line(AtomicUsize::new(0)),
        panicked: Line(Mutex::new(None)),
        ranges: (0..=helpers).map(|_| Line(AtomicU64::new(0))).collect(),
        rest: Line(AtomicBool::new(false)),
        sleepers: Line(AtomicUsize::new(0)),
        sleep: Mutex::new(()),
        wake: Condvar::new(),
        threads: (0..helpers).map(|_| OnceLock::new()).collect(),
    }));
    // The generation before any region: a helper that starts after the
    // first region opened still joins it (reading `gen` when it starts, it
    // would wait for the next one).
    let first = team.gen.0.load(SeqCst);
    let pin = super::pin::on();
    if pin {
        super::pin::init();
    }
    for me in 1..=helpers {
        std::thread::Builder::new()
            .name(format!("taptree-cpu-{me}"))
            .spawn(move || {
                if pin {
                    super::pin::helper(me);
                }
                if let Some(t) = Thread::current() {
                    let _ = team.threads[me - 1].set(t);
                }
                team.work(me, first)
            })
            .expect("spawning a CPU forward thread");
    }
    team
}

impl Team {
    /// Team thread `me`: waits for each region after generation `seen`,
    /// joins it, takes tasks.
    fn work(&self, me: usize, mut seen: usize) {
        loop {
            seen = self.wait(seen);
            self.active.0.fetch_add(1, SeqCst);
            if self.task.0 .1.load(SeqCst) && self.gen.0.load(SeqCst) == seen {
                let task = self.task.0 .0.load(SeqCst);
                // SAFETY: set before the region opened, and the caller's
                // reference it points to outlives the region, which waits
                // for `active` to fall to zero.
                if let Some(task) = unsafe { task.as_ref() } {
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| self.claim(me, *task))) {
                        let mut first = self.panicked.0.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert(p);
                    }
                }
            }
            self.active.0.fetch_sub(1, SeqCst);
        }
    }

    /// Waits until `gen` moves past `seen`: spins for [`SPIN`], then sleeps.
    fn wait(&self, seen: usize) -> usize {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = self.gen.0.load(SeqCst);
            if g != seen {
                return g;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || (start.elapsed() < SPIN && !self.rest.0.load(Relaxed))
            {
                continue;
            }
            let mut guard = self.sleep.lock().unwrap_or_else(|p| p.into_inner());
            self.sleepers.0.fetch_add(1, SeqCst);
            while self.gen.0.load(SeqCst) == seen {
                guard = self.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
            self.sleepers.0.fetch_sub(1, SeqCst);
            return self.gen.0.load(SeqCst);
        }
    }

    /// Runs thread `me`'s range from its front, then the others' from
    /// their backs, until no task is left.
    fn claim(&self, me: usize, task: Task<'_>) {
        let own = &self.ranges[me].0;
        loop {
            let r = own.fetch_add(1, Relaxed);
            if (r as u32) >= (r >> 32) as u32 {
                break;
            }
            task(r as u32 as usize);
        }
        let parts = self.ranges.len();
        for k in 1..parts {
            let other = &self.ranges[(me + k) % parts].0;
            let mut r = other.load(Relaxed);
            loop {
                let (next, end) = (r as u32, (r >> 32) as u32);
                if next >= end {
                    break;
                }
                let taken = (r & 0xffff_ffff) | (u64::from(end - 1) << 32);
                match other.compare_exchange_weak(r, taken, Relaxed, Relaxed) {
                    Ok(_) => {
                        task((end - 1) as usize);
                        r = other.load(Relaxed);
                    }
                    Err(now) => r = now,
                }
            }
        }
    }
}

/// Starts the team of `threads` threads, if there is to be one.
pub(super) fn start_for(threads: usize) {
    if threads >= 2 {
        team(threads);
    }
}

/// Lets the idle threads of the teams sleep now: no region follows soon
/// (the forward is done), and spinning would keep cores from whatever runs
/// next (the capture's copies of the logits on rayon's threads).
pub(super) fn rest() {
    if let Some(teams) = TEAMS.get() {
        for t in teams.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.rest.0.store(true, Relaxed);
        }
    }
}

/// The threads of the team of `threads` threads besides the caller that
/// have registered (none when that team has not been started).
pub(super) fn threads_of(threads: usize) -> Vec<Thread> {
    let Some(teams) = TEAMS.get() else {
        return Vec::new();
    };
    let teams = teams.lock().unwrap_or_else(|p| p.into_inner());
    of(&teams, threads).map_or_else(Vec::new, |t| {
        t.threads.iter().filter_map(|t| t.get().copied()).collect()
    })
}

/// Runs `f(i)` for every `i` in `0..n` on the team of
/// `rayon::current_num_threads()` threads, and returns when all are done;
/// gives `f` back when that team is running another region.
pub(super) fn for_each<'a>(n: usize, f: Task<'a>) -> Result<(), Task<'a>> {
    let threads = rayon::current_num_threads();
    if threads < 2 || n >= u32::MAX as usize {
        return Err(f);
    }
    let team = team(threads);
    let Ok(guard) = team.busy.try_lock() else {
        return Err(f);
    };
    let parts = team.ranges.len();
    for (t, range) in team.ranges.iter().enumerate() {
        let (next, end) = (t * n / parts, (t + 1) * n / parts);
        range.0.store(next as u64 | (end as u64) << 32, Relaxed);
    }
    // SAFETY: team threads reach the task only while the region is open and
    // they are counted `active` in it; both end before this returns.
    let task: Task<'static> = unsafe { std::mem::transmute::<Task<'a>, Task<'static>>(f) };
    team.rest.0.store(false, Relaxed);
    team.task
        .0
         .0
        .store(&task as *const Task<'static> as *mut _, SeqCst);
    team.task.0 .1.store(true, SeqCst);
    team.gen.0.fetch_add(1, SeqCst);
    if team.sleepers.0.load(SeqCst) > 0 {
        let _g = team.sleep.lock().unwrap_or_else(|p| p.into_inner());
        team.wake.notify_all();
    }
    // The region must close before this frame (holding `task`) unwinds.
    let ran = catch_unwind(AssertUnwindSafe(|| team.claim(0, f)));
    team.task.0 .1.store(false, SeqCst);
    let mut spins = 0u32;
    while team.active.0.load(SeqCst) != 0 {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        }
    }
    team.task.0 .0.store(std::ptr::null_mut(), SeqCst);
    let theirs = team
        .panicked
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    drop(guard);
    // The caller's own panic first, else a team thread's, with its payload
    // (its message), as rayon raises a task's panic in the caller.
    if let Some(p) = ran.err().or(theirs) {
        resume_unwind(p);
    }
    Ok(())
}
