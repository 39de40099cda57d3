//! The thread pool every step of a diff shares (rayon's global pool), and
//! a diff run on one of its threads.
//!
//! A step shared by every core, started from a thread outside the pool,
//! is queued for the pool and waited for (the caller sleeps, then is woken);
//! started from one of its threads, it is handed to the other threads
//! directly and the caller takes part. A diff has some thirty such steps,
//! so on many cores it runs faster whole on the pool ([`run_on`]).

/// Runs `f` on a thread of the pool and returns what it returns (on the
/// calling thread where that is one of the pool's).
pub fn run_on<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Runs `first` and `second` side by side on the pool and returns what
/// each returns: a check, and the work that need not wait for it.
pub fn side_by_side<A: Send, B: Send>(
    first: impl FnOnce() -> A + Send,
    second: impl FnOnce() -> B + Send,
) -> (A, B) {
    rayon::join(first, second)
}

#[cfg(test)]
mod tests {
    /// What is run goes on a thread of the pool, and its value comes back.
    #[test]
    fn what_is_run_runs_on_the_pool() {
        assert_eq!(rayon::current_thread_index(), None);
        let (on, value) = super::run_on(|| (rayon::current_thread_index(), 42));
        assert!(on.is_some());
        assert_eq!(value, 42);
    }
}
