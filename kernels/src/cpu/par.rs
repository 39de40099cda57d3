//! The forward's parallel regions over rows or tasks by index, on rayon's
//! threads: each task writes its own rows of the outputs (through raw
//! pointers at disjoint offsets) and returns a value, collected in order.
//! Which thread runs a task never changes what it computes.
//!
//! Regions run on a [`team`] of threads that stay awake between them;
//! `TAPTREE_CPU_TEAM=0` sends every region to rayon instead (so one binary
//! measures both). `TAPTREE_CPU_PIN=1` pins the team's threads to CPUs of
//! their own ([`pin`], an experiment).

mod pin;
mod team;
#[cfg(test)]
mod tests;

use super::{profile, Real};

/// Below this many elements (a decode step's rows) a row pass stays in
/// the calling thread: a region would cost more than the work.
const PAR_MIN: usize = 4096;

/// Whether a pass over `elements` elements in `rows` independent rows (or
/// blocks) is worth a parallel region: more than one row, and at least
/// [`PAR_MIN`] elements (a prefill's rows, not a decode step's). Both ways
/// compute every row alike, so the answer changes no bit.
pub(crate) fn worth(elements: usize, rows: usize) -> bool {
    rows > 1 && elements >= PAR_MIN
}

/// Runs `f(i)` for every `i` in `0..n`, each once, on the team of threads
/// (on rayon's when the team is off or busy; in this thread when there is
/// one), and returns when all are done. Every region of the forward comes
/// here, and `TAPTREE_CPU_PROFILE` times it and its tasks here.
pub(crate) fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    use rayon::prelude::*;
    if n <= 1 {
        return (0..n).for_each(f);
    }
    let timed = |i: usize| profile::task(|| f(i));
    let f: &(dyn Fn(usize) + Sync) = &timed;
    profile::region(|| {
        let f = if team_on() {
            match team::for_each(n, f) {
                Ok(()) => return,
                Err(f) => f,
            }
        } else {
            f
        };
        (0..n).into_par_iter().for_each(f)
    })
}

/// Starts the team of `rayon::current_num_threads()` threads now (a
/// forward calls it when it opens), so that the first region does not.
pub(crate) fn start() {
    if team_on() {
        team::start_for(rayon::current_num_threads());
    }
}

/// While the guard lives, the calling thread (a forward's) is pinned to a
/// CPU of its own when `TAPTREE_CPU_PIN=1` and regions run on a team.
pub(crate) fn pin_caller() -> pin::CallerPin {
    pin::caller(pin::on() && team_on() && rayon::current_num_threads() >= 2)
}

/// The threads of the team that regions started here would run on,
/// besides the calling thread (none before that team has started, or
/// with the team off).
pub(crate) fn team_threads() -> Vec<profile::Thread> {
    if team_on() {
        team::threads_of(rayon::current_num_threads())
    } else {
        Vec::new()
    }
}

/// Tells the team's idle threads to sleep now rather than spin: the
/// forward's last region is done (where the profile's account of the
/// threads' CPU time ends).
pub(crate) fn rest() {
    profile::regions_done();
    team::rest();
}

/// Whether regions go to the team (`TAPTREE_CPU_TEAM` is not `0`).
fn team_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TAPTREE_CPU_TEAM").as_deref() != Ok("0"))
}

/// Drops `rows` (each of about `width` elements), one task per row where
/// [`worth`] says so: a row pass's quantized rows, allocated on the team's
/// threads, are then freed on them (mostly each on the thread that
/// allocated it), not all in the forward's thread (for `q8`, some 4,500
/// rows of three vectors each in a prefill's serial time).
pub(crate) fn drop_rows<R: Send>(mut rows: Vec<R>, width: usize) {
    let n = rows.len();
    if !worth(n * width, n) {
        return;
    }
    let p = Ptr(rows.as_mut_ptr());
    // SAFETY: the vector forgets its rows before the tasks drop them; each
    // task drops its own row once, and `for_each` returns when all are
    // done. A panicking drop may leak rows not yet dropped; none is dropped
    // twice.
    unsafe { rows.set_len(0) };
    for_each(n, &|i| unsafe { std::ptr::drop_in_place(p.at(i)) });
}

/// A raw pointer that tasks use at disjoint offsets.
pub(crate) struct Ptr<T>(pub(crate) *mut T);
// SAFETY: every user (here, `matmul::run_jobs`, `ffn`, `drop_rows`) gives each task its own
// elements, and nothing reads them until `for_each` has returned.
unsafe impl<T: Send> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    /// The pointer plus `i` (a method, so that closures capture the `Ptr`).
    ///
    /// # Safety
    /// `i` must stay within the allocation.
    pub(crate) unsafe fn at(&self, i: usize) -> *mut T {
        // SAFETY: the caller's promise.
        unsafe { self.0.add(i) }
    }
}

/// `f(i, row i of a, row i of b)` for every row (`a` in rows of `wa`, `b`
/// of `wb`, as many of each), in parallel; the results in row order.
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

/// `f(i, row i of a, row i of b)` for every row of `a` (rows of `wa`), in
/// parallel, where `b` is a new buffer of as many rows of `wb`, each zeroed
/// by its own task just before `f` sees it (zeroing the whole buffer first
/// was serial time in the forward's thread); returns `b` and the results
/// in row order.
pub(crate) fn chunks_fresh_map<A: Send, T: Real, R: Send>(
    a: &mut [A],
    wa: usize,
    wb: usize,
    f: impl Fn(usize, &mut [A], &mut [T]) -> R + Sync,
) -> (Vec<T>, Vec<R>) {
    let n = a.len() / wa.max(1);
    let mut b: Vec<T> = Vec::with_capacity(n * wb);
    let pb = Ptr(b.as_mut_ptr());
    let rs = chunks_map(a, wa, |i, ai| {
        // SAFETY: row i of `b`'s capacity (i < n), which task i alone
        // touches; every element is written before the slice is made.
        let bi = unsafe {
            let row = pb.at(i * wb);
            for j in 0..wb {
                row.add(j).write(T::ZERO);
            }
            std::slice::from_raw_parts_mut(row, wb)
        };
        f(i, ai, bi)
    });
    // SAFETY: `chunks_map` ran every row (it panics otherwise), and each
    // wrote its `wb` elements.
    unsafe { b.set_len(n * wb) };
    (b, rs)
}

/// `f(i, row i of a)` for every row of `a` (rows of `w`), in parallel; the
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
