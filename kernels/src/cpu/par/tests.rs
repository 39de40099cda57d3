//! The regions on the team: every task once, whatever the thread count;
//! the team's threads (not rayon's) run them; regions inside tasks and from
//! several threads at once; a task's panic, with its message.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// Runs a region of `n` tasks and returns how often each ran.
fn counts(n: usize) -> Vec<usize> {
    let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    for_each(n, &|i| {
        runs[i].fetch_add(1, Relaxed);
    });
    runs.into_iter().map(|c| c.into_inner()).collect()
}

#[test]
fn every_task_runs_once_on_1_to_5_threads() {
    for threads in 1..=5 {
        pool(threads).install(|| {
            for n in [0, 1, 2, 3, 7, 16, 37, 240, 1000] {
                for _ in 0..20 {
                    assert_eq!(counts(n), vec![1; n], "{threads} threads, {n} tasks");
                }
            }
        });
    }
}

/// A thread count no other test's pool has (they use 1 to 5 threads, or
/// the global pool's count: every core, or RAYON_NUM_THREADS), plus `k`:
/// its team is then this test's alone (a team busy with another test's
/// region sends this one's to rayon).
fn lone_team(k: usize) -> usize {
    let global = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    global.max(env).max(5) + 1 + k
}

/// Whether this thread is one of a team's (see `team::start`).
fn on_team_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("taptree-cpu-"))
}

#[test]
fn the_team_threads_run_tasks_unless_the_team_is_off() {
    // Tasks long enough (64 of 1 ms) that the helpers join the region
    // before the caller has taken them all, even on a loaded machine.
    // A team no other test uses, so none keeps it busy.
    let on = std::env::var("TAPTREE_CPU_TEAM").as_deref() != Ok("0");
    pool(lone_team(0)).install(|| {
        let team = AtomicUsize::new(0);
        for_each(64, &|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            if on_team_thread() {
                team.fetch_add(1, Relaxed);
            }
        });
        let team = team.into_inner();
        if on {
            assert!(
                team > 0,
                "no task ran on a team thread: the region went to rayon"
            );
        } else {
            assert_eq!(team, 0, "TAPTREE_CPU_TEAM=0, yet team threads ran tasks");
        }
    });
}

/// The profile's account of the threads' CPU time finds every helper of
/// the team that a region here runs on (Linux, where threads register).
#[test]
fn the_team_threads_are_known_to_the_profile() {
    let threads = lone_team(2);
    pool(threads).install(|| {
        assert!(team_threads().is_empty(), "a team no region has started");
        start();
        // A helper registers as it starts: wait for the last (a loaded
        // machine may start them late).
        let t = std::time::Instant::now();
        while team_threads().len() < threads - 1 && t.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let known = team_threads().len();
        match (team_on(), cfg!(target_os = "linux")) {
            (true, true) => assert_eq!(known, threads - 1),
            _ => assert_eq!(known, 0),
        }
    });
}

#[test]
fn a_region_inside_a_task_and_regions_from_two_threads_complete() {
    pool(3).install(|| {
        let inner = AtomicUsize::new(0);
        for_each(8, &|_| {
            // The team is busy with the outer region: this one goes to rayon.
            assert_eq!(counts(5), vec![1; 5]);
            inner.fetch_add(1, Relaxed);
        });
        assert_eq!(inner.into_inner(), 8);
    });
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                pool(3).install(|| {
                    for _ in 0..50 {
                        assert_eq!(counts(64), vec![1; 64]);
                    }
                })
            });
        }
    });
}

#[test]
fn a_task_that_panics_panics_the_region_and_the_team_goes_on() {
    pool(4).install(|| {
        for bad in [0, 99] {
            let r = std::panic::catch_unwind(|| {
                for_each(100, &|i| assert_ne!(i, bad, "task {i}"));
            });
            assert!(r.is_err(), "task {bad}'s panic was lost");
            assert_eq!(counts(100), vec![1; 100]);
        }
    });
}

#[test]
fn a_panic_on_a_team_thread_keeps_its_message() {
    if std::env::var("TAPTREE_CPU_TEAM").as_deref() == Ok("0") {
        eprintln!("skipped: TAPTREE_CPU_TEAM=0 sends every region to rayon");
        return;
    }
    // A team of its own (see above).
    pool(lone_team(1)).install(|| {
        let r = std::panic::catch_unwind(|| {
            for_each(64, &|i| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                if on_team_thread() {
                    panic!("task {i} broke here");
                }
            });
        });
        let p = r.expect_err("no task ran on a team thread, or its panic was lost");
        let msg = p.downcast_ref::<String>().map(String::as_str).unwrap_or("");
        assert!(msg.contains("broke here"), "the payload was lost: {msg:?}");
        assert_eq!(counts(16), vec![1; 16]);
    });
}

#[test]
fn fresh_rows_are_zeroed_before_each_task_sees_them() {
    pool(3).install(|| {
        // Memory of the new buffer's size freed dirty just before: the
        // allocator hands it out again, so a row not zeroed shows.
        drop(std::hint::black_box(vec![f32::NAN; 60]));
        let mut a = vec![1u32; 40];
        let (b, rs) = chunks_fresh_map(&mut a, 2, 3, |i, ai, bi: &mut [f32]| {
            assert_eq!(bi, &[0.0; 3]);
            bi[i % 3] = i as f32;
            ai[0] += 1;
            i
        });
        assert_eq!(rs, (0..20).collect::<Vec<_>>());
        assert_eq!(b.len(), 60);
        for (i, row) in b.chunks(3).enumerate() {
            let mut want = [0.0; 3];
            want[i % 3] = i as f32;
            assert_eq!(row, want);
        }
        assert!(a.chunks(2).all(|r| r == [2, 1]));
    });
}

#[test]
fn drop_rows_drops_each_row_once() {
    /// Counts its drops in `DROPS[i]`.
    struct Row(usize);
    static DROPS: [AtomicUsize; 40] = [const { AtomicUsize::new(0) }; 40];
    impl Drop for Row {
        fn drop(&mut self) {
            DROPS[self.0].fetch_add(1, Relaxed);
        }
    }
    pool(3).install(|| {
        // 37 rows of 576 (a prefill's: in parallel), then one (in place).
        for (n, width) in [(37, 576), (1, 576), (37, 4)] {
            DROPS.iter().for_each(|d| d.store(0, Relaxed));
            drop_rows((0..n).map(Row).collect(), width);
            let drops: Vec<usize> = DROPS[..n].iter().map(|d| d.load(Relaxed)).collect();
            assert_eq!(drops, vec![1; n], "{n} rows of {width}");
        }
    });
}

/// `TAPTREE_CPU_PIN=1`'s pinning of a forward's thread: one CPU of the
/// mask while the guard lives, the thread's own mask back after it; off,
/// nothing changes. (The variable is read once a process, so the test pins
/// through the module, on a thread of its own.)
#[cfg(target_os = "linux")]
#[test]
fn a_pinned_caller_runs_on_one_cpu_and_gets_its_mask_back() {
    std::thread::spawn(|| {
        let before = pin::allowed();
        {
            let _off = pin::caller(false);
            assert_eq!(pin::allowed(), before, "not pinned when off");
        }
        {
            let _on = pin::caller(true);
            assert_eq!(
                pin::allowed(),
                [before[0]],
                "pinned to the mask's first CPU"
            );
        }
        assert_eq!(pin::allowed(), before, "the mask given back");
        pin::helper(1);
        assert_eq!(pin::allowed(), [before[1 % before.len()]], "helper 1's CPU");
    })
    .join()
    .unwrap();
}
