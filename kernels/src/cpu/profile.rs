//! `TAPTREE_CPU_PROFILE=1`: a wall-clock account of the CPU forward by op
//! kind, printed to stderr after each forward of more than one row
//! (`TAPTREE_CPU_PROFILE=all`: after every forward).
//!
//! For each kind: its calls and wall time in the forward's thread (time in
//! a nested kind counts for the inner one only), the parallel regions it
//! opened and their wall time, the serial rest (wall minus regions), and
//! the tasks' own time summed over threads (`busy`), so that `busy / (region
//! wall × threads)` says how much of the threads' time in the regions went
//! to work rather than to forking, joining, stealing and waiting for the
//! last task. A second table splits the threads' time in the regions that
//! was not work: `join` (from the region's opening to each thread's first
//! task), `end` (from each thread's last task to the region's close),
//! `absent` (threads that ran none of its tasks, for the whole region) and
//! `between` (the rest: between one task and the next, claiming and
//! stealing). A last part ([`threads`]) says how much of the forward the
//! forward's thread and its team's spent on their CPUs, waiting for one,
//! and neither, up to the forward's last region (after it the team
//! sleeps). Off (the variable unset), every hook is one load of a flag
//! that is set once; nothing is timed. The CPU forward prints it; the CPU
//! tensor-parallel forward runs its ranks one after another without
//! printing.

mod threads;

pub(crate) use threads::Thread;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The op kinds accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Outside any op: the layer loop, the KV cache, what is not below.
    Other,
    /// Embedding lookup.
    Embed,
    /// RMSNorm (and what a fused row pass does with it).
    Norm,
    /// Activation quantization of the q8 path.
    Quantize,
    /// Matmuls of the layers.
    Matmul,
    /// The output (logits) matmul.
    Logits,
    /// RoPE.
    Rope,
    /// Attention.
    Attention,
    /// The gated FFN product.
    Gated,
    /// Residual adds on their own (the CPU forward adds them in its fused
    /// row pass, counted under `Norm`).
    Residual,
    /// Taps (copies and hashing when armed and selected).
    Tap,
}

/// How many kinds there are (`Tap` is the last).
const N: usize = Op::Tap as usize + 1;

const KINDS: [Op; N] = [
    Op::Other,
    Op::Embed,
    Op::Norm,
    Op::Quantize,
    Op::Matmul,
    Op::Logits,
    Op::Rope,
    Op::Attention,
    Op::Gated,
    Op::Residual,
    Op::Tap,
];

/// Per kind: calls, exclusive wall ns, regions, region wall ns, task ns,
/// and the threads' idle ns in the regions by where it fell.
struct Account {
    calls: [AtomicU64; N],
    wall: [AtomicU64; N],
    regions: [AtomicU64; N],
    region_wall: [AtomicU64; N],
    busy: [AtomicU64; N],
    join: [AtomicU64; N],
    end: [AtomicU64; N],
    absent: [AtomicU64; N],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static ACCOUNT: Account = Account {
    calls: [ZERO; N],
    wall: [ZERO; N],
    regions: [ZERO; N],
    region_wall: [ZERO; N],
    busy: [ZERO; N],
    join: [ZERO; N],
    end: [ZERO; N],
    absent: [ZERO; N],
};

/// Thread slots of the region's timeline: a thread's first task start and
/// last task end in the open region (ns since [`epoch`]). Threads beyond
/// this many share slots, which only blurs the split.
const SLOTS: usize = 128;

/// One thread's marks in the open region, on cache lines of its own: its
/// tasks' time is summed here, not in one counter that every thread
/// would write after every task (at 16 threads that line's traffic was
/// time between tasks).
#[repr(align(128))]
struct Marks {
    first: AtomicU64,
    last: AtomicU64,
    busy: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const MARKS: Marks = Marks {
    first: AtomicU64::new(u64::MAX),
    last: AtomicU64::new(0),
    busy: AtomicU64::new(0),
};
static TIMELINE: [Marks; SLOTS] = [MARKS; SLOTS];

/// The profile's clock origin.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// This thread's slot of [`TIMELINE`].
fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SLOT: usize = NEXT.fetch_add(1, Relaxed) % SLOTS);
    SLOT.with(|s| *s)
}

/// Nanoseconds since [`epoch`].
fn now() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// The kind the forward's thread is in (what a region and its tasks count for).
static CURRENT: AtomicUsize = AtomicUsize::new(0);

/// 0: off, 1: forwards of more than one row, 2: every forward.
fn level() -> u8 {
    static LEVEL: OnceLock<u8> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("TAPTREE_CPU_PROFILE").as_deref() {
        Ok("1") => 1,
        Ok("all") => 2,
        Ok("") | Ok("0") | Err(_) => 0,
        Ok(other) => {
            eprintln!("taptree: TAPTREE_CPU_PROFILE={other:?}: expected 1 or all; not profiling");
            0
        }
    })
}

#[inline(always)]
fn on() -> bool {
    level() != 0
}

fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Times the forward's thread in `op` until dropped (see [`op`]).
pub(crate) struct OpGuard {
    start: Option<(Instant, usize)>,
    op: usize,
}

/// Counts the time until the guard drops for `op`, and not for the kind
/// it interrupts.
#[inline(always)]
pub(crate) fn op(op: Op) -> OpGuard {
    if !on() {
        return OpGuard { start: None, op: 0 };
    }
    // What the logits matmul calls (quantization, the matmul) is the logits'.
    let prev = CURRENT.load(Relaxed);
    let op = if prev == Op::Logits as usize {
        prev
    } else {
        op as usize
    };
    CURRENT.store(op, Relaxed);
    if prev != Op::Logits as usize {
        ACCOUNT.calls[op].fetch_add(1, Relaxed);
    }
    OpGuard {
        start: Some((Instant::now(), prev)),
        op,
    }
}

impl Drop for OpGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some((t, prev)) = self.start {
            let d = ns(t);
            ACCOUNT.wall[self.op].fetch_add(d, Relaxed);
            // Exclusive time: the interrupted kind gives this span back.
            ACCOUNT.wall[prev].fetch_sub(d, Relaxed);
            CURRENT.store(prev, Relaxed);
        }
    }
}

/// Runs the parallel region `f`, counting it for the current kind.
#[inline(always)]
pub(crate) fn region<R>(f: impl FnOnce() -> R) -> R {
    if !on() {
        return f();
    }
    for m in &TIMELINE {
        m.first.store(u64::MAX, Relaxed);
        m.last.store(0, Relaxed);
    }
    let open = now();
    let r = f();
    let close = now();
    let k = CURRENT.load(Relaxed);
    ACCOUNT.regions[k].fetch_add(1, Relaxed);
    ACCOUNT.region_wall[k].fetch_add(close - open, Relaxed);
    // The threads that ran a task: how long each took to join and how long
    // it waited at the end; the rest were absent throughout. (A region
    // nested in a task marks the same slots: its split is blurred.)
    // The tasks' time is taken out of every slot (none is lost: a task of
    // a region that encloses this one counts for whichever closes first).
    let (mut joined, mut join, mut end, mut busy) = (0u64, 0u64, 0u64, 0u64);
    for m in &TIMELINE {
        busy += m.busy.swap(0, Relaxed);
        let (first, last) = (m.first.load(Relaxed), m.last.load(Relaxed));
        if first != u64::MAX {
            joined += 1;
            join += first.saturating_sub(open);
            end += close.saturating_sub(last);
        }
    }
    ACCOUNT.busy[k].fetch_add(busy, Relaxed);
    let threads = rayon::current_num_threads() as u64;
    ACCOUNT.join[k].fetch_add(join, Relaxed);
    ACCOUNT.end[k].fetch_add(end, Relaxed);
    ACCOUNT.absent[k].fetch_add(threads.saturating_sub(joined) * (close - open), Relaxed);
    r
}

/// Runs one task of a region, counting its time as work.
#[inline(always)]
pub(crate) fn task<R>(f: impl FnOnce() -> R) -> R {
    if !on() {
        return f();
    }
    let start = now();
    let r = f();
    let stop = now();
    let m = &TIMELINE[slot()];
    m.first.fetch_min(start, Relaxed);
    m.last.fetch_max(stop, Relaxed);
    m.busy.fetch_add(stop - start, Relaxed);
    r
}

/// The threads' window of the forward being profiled.
static WINDOW: Mutex<Option<threads::Window>> = Mutex::new(None);

fn window() -> std::sync::MutexGuard<'static, Option<threads::Window>> {
    WINDOW.lock().unwrap_or_else(|p| p.into_inner())
}

/// The forward's last region is done (`par::rest`, before the team is
/// told to sleep): the threads' window closes here.
pub(crate) fn regions_done() {
    if on() {
        if let Some(w) = window().as_mut() {
            w.close();
        }
    }
}

/// Whether the account of a forward of `rows` rows is printed.
fn printed(rows: usize) -> bool {
    rows > 1 || level() == 2
}

/// Starts the account of one forward of `rows` rows: call [`Forward::done`].
pub(crate) struct Forward {
    start: Option<Instant>,
    rows: usize,
    /// The process's page faults (minor, major) when the forward started.
    faults: Option<(u64, u64)>,
}

impl Forward {
    /// Clears the account and starts the forward's clock; `team` gives the
    /// threads besides this one that the forward's regions run on.
    pub(crate) fn start(rows: usize, team: impl FnOnce() -> Vec<Thread>) -> Forward {
        if !on() {
            return Forward {
                start: None,
                rows,
                faults: None,
            };
        }
        let a = &ACCOUNT;
        let all = [&a.calls, &a.wall, &a.regions, &a.region_wall, &a.busy];
        for v in all.into_iter().chain([&a.join, &a.end, &a.absent]) {
            v.iter().for_each(|x| x.store(0, Relaxed));
        }
        TIMELINE.iter().for_each(|m| m.busy.store(0, Relaxed));
        CURRENT.store(Op::Other as usize, Relaxed);
        // The window opens before the forward's clock starts: its reads
        // (two files a thread) are not the forward's time.
        *window() = printed(rows)
            .then(|| {
                let me = Thread::current().into_iter();
                threads::Window::open(me.chain(team()).collect())
            })
            .flatten();
        Forward {
            faults: page_faults(),
            start: Some(Instant::now()),
            rows,
        }
    }

    /// Prints the account (when asked for one of this many rows).
    pub(crate) fn done(self) {
        let Some(t) = self.start else { return };
        let total = ns(t);
        // `Other` holds the forward's wall minus every op's.
        ACCOUNT.wall[Op::Other as usize].fetch_add(total, Relaxed);
        if printed(self.rows) {
            let mut s = report(total, self.rows);
            if let (Some((min0, maj0)), Some((min1, maj1))) = (self.faults, page_faults()) {
                s += &format!(
                    "page faults in the forward (all threads): {} minor, {} major\n",
                    min1 - min0,
                    maj1 - maj0
                );
            }
            s += &match window().take() {
                Some(mut w) => w.report(),
                None => "threads on their cpus: not known here (Linux's /proc/self/task)\n".into(),
            };
            eprint!("{s}");
        }
    }
}

/// The process's minor and major page faults so far (Linux's
/// `/proc/self/stat`; `None` elsewhere): a first touch of the weights'
/// mapping or of a fresh buffer is a fault, kernel time that the forward's
/// threads contend for.
fn page_faults() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis: state is the first,
    // minflt the eighth, majflt the tenth (proc(5)'s fields 3, 10 and 12).
    let mut f = stat.rsplit_once(')')?.1.split_whitespace();
    let minor = f.nth(7)?.parse().ok()?;
    let major = f.nth(1)?.parse().ok()?;
    Some((minor, major))
}

fn report(total: u64, rows: usize) -> String {
    let threads = rayon::current_num_threads();
    let ms = |v: u64| v as f64 / 1e6;
    let get = |v: &[AtomicU64; N], k: usize| v[k].load(Relaxed);
    let mut s = format!(
        "cpu profile: forward of {rows} rows on {threads} threads, {:.3} ms\n\
         {:<10} {:>6} {:>9} {:>9} {:>7} {:>9} {:>9} {:>6}\n",
        ms(total),
        "op",
        "calls",
        "wall ms",
        "serial ms",
        "regions",
        "region ms",
        "busy ms",
        "util"
    );
    let (mut serial, mut regions, mut region_wall, mut busy) = (0u64, 0u64, 0u64, 0u64);
    for (k, op) in KINDS.iter().enumerate() {
        let (w, rw, b) = (
            get(&ACCOUNT.wall, k),
            get(&ACCOUNT.region_wall, k),
            get(&ACCOUNT.busy, k),
        );
        let r = get(&ACCOUNT.regions, k);
        let ser = w.saturating_sub(rw);
        serial += ser;
        regions += r;
        region_wall += rw;
        busy += b;
        s += &format!(
            "{:<10} {:>6} {:>9.3} {:>9.3} {:>7} {:>9.3} {:>9.3} {:>5.0}%\n",
            format!("{op:?}").to_lowercase(),
            get(&ACCOUNT.calls, k),
            ms(w),
            ms(ser),
            r,
            ms(rw),
            ms(b),
            util(b, rw, threads)
        );
    }
    s += &format!(
        "{:<10} {:>6} {:>9.3} {:>9.3} {:>7} {:>9.3} {:>9.3} {:>5.0}%\n",
        "total",
        "",
        ms(total),
        ms(serial),
        regions,
        ms(region_wall),
        ms(busy),
        util(busy, region_wall, threads)
    );
    s + &idle(threads)
}

/// The second table: where the threads' time in each kind's regions went,
/// in percent of it (region wall × threads), and the mean join and end
/// wait of a thread in one region.
fn idle(threads: usize) -> String {
    let get = |v: &[AtomicU64; N], k: usize| v[k].load(Relaxed) as f64;
    let mut s = format!(
        "{:<10} {:>6} {:>6} {:>6} {:>7} {:>8} {:>8} {:>8}\n",
        "regions", "work", "join", "end", "absent", "between", "join us", "end us"
    );
    for (k, op) in KINDS.iter().enumerate() {
        let regions = get(&ACCOUNT.regions, k);
        if regions == 0.0 {
            continue;
        }
        let all = get(&ACCOUNT.region_wall, k) * threads as f64;
        let parts =
            [&ACCOUNT.busy, &ACCOUNT.join, &ACCOUNT.end, &ACCOUNT.absent].map(|v| get(v, k));
        let between = (all - parts.iter().sum::<f64>()).max(0.0);
        let pc = |v: f64| if all > 0.0 { 100.0 * v / all } else { 0.0 };
        let per = |v: f64| v / 1e3 / (regions * threads as f64);
        s += &format!(
            "{:<10} {:>5.0}% {:>5.0}% {:>5.0}% {:>6.0}% {:>7.0}% {:>8.1} {:>8.1}\n",
            format!("{op:?}").to_lowercase(),
            pc(parts[0]),
            pc(parts[1]),
            pc(parts[2]),
            pc(parts[3]),
            pc(between),
            per(parts[1]),
            per(parts[2])
        );
    }
    s
}

fn util(busy: u64, wall: u64, threads: usize) -> f64 {
    if wall == 0 {
        return 0.0;
    }
    100.0 * busy as f64 / (wall as f64 * threads as f64)
}
