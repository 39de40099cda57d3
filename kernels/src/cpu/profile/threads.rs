//! The forward's threads on their CPUs: for the forward's own thread and
//! its team's, how much of a window each spent on a CPU, waiting in a run
//! queue for one, and neither (asleep, or its CPU taken by an interrupt or
//! by the hypervisor: a virtual machine's "steal"), and how often each was
//! switched out. A forward whose tasks run longer on 16 threads than on 2
//! tells here whether its threads were running all that time.
//!
//! Linux only: the CPU time is each thread's own CPU clock
//! (`pthread_getcpuclockid`, exact to the read, steal left out where the
//! kernel accounts it), the run queue's wait is `schedstat`'s second field
//! and the switches are `status`'s, both from `/proc/self/task/TID/`.
//! Elsewhere, or where those files are missing, the table says it has
//! nothing to show.

use std::time::Instant;

/// A thread whose times any thread of the process can read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Thread {
    #[cfg(target_os = "linux")]
    tid: libc::pid_t,
    #[cfg(target_os = "linux")]
    clock: libc::clockid_t,
}

impl Thread {
    /// The calling thread, where its times can be read.
    pub(crate) fn current() -> Option<Thread> {
        #[cfg(target_os = "linux")]
        {
            let mut clock: libc::clockid_t = 0;
            // SAFETY: `pthread_self` is the calling thread, alive for the
            // call; the call writes one clockid_t.
            let ok = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0;
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            ok.then_some(Thread { tid, clock })
        }
        #[cfg(not(target_os = "linux"))]
        None
    }
}

/// One thread's counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Nanoseconds on a CPU (user and kernel).
    pub(crate) cpu: u64,
    /// Nanoseconds waiting in a run queue for a CPU.
    pub(crate) queued: u64,
    /// Switches out of the CPU that the thread asked for (a sleep, a lock).
    pub(crate) voluntary: u64,
    /// Switches out that it did not (another task took the CPU).
    pub(crate) involuntary: u64,
}

impl Reading {
    fn since(self, before: Reading) -> Reading {
        Reading {
            cpu: self.cpu.saturating_sub(before.cpu),
            queued: self.queued.saturating_sub(before.queued),
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            involuntary: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}

/// `t`'s counters now, or `None` where they cannot be read.
pub(crate) fn read(t: &Thread) -> Option<Reading> {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: the call writes one timespec; a clock of a thread that
        // has ended gives an error, not undefined behaviour.
        if unsafe { libc::clock_gettime(t.clock, &mut ts) } != 0 {
            return None;
        }
        let cpu =
            u64::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u64::try_from(ts.tv_nsec).ok()?;
        let dir = format!("/proc/self/task/{}", t.tid);
        let sched = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        parse(cpu, &sched, &status)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = t;
        None
    }
}

/// A reading from the CPU clock and the texts of `schedstat` (run time,
/// run-queue wait, time slices) and `status`.
fn parse(cpu: u64, schedstat: &str, status: &str) -> Option<Reading> {
    let queued = schedstat.split_whitespace().nth(1)?.parse().ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.strip_prefix(':')?.trim().parse().ok()
    };
    Some(Reading {
        cpu,
        queued,
        voluntary: field("voluntary_ctxt_switches")?,
        involuntary: field("nonvoluntary_ctxt_switches")?,
    })
}

/// The threads' counters from a window's opening to its close.
pub(crate) struct Window {
    opened: Instant,
    threads: Vec<(Thread, Reading)>,
    /// The window's length and each thread's counts over it, once closed.
    closed: Option<(u64, Vec<Reading>)>,
}

impl Window {
    /// Opens a window over `threads` (the first is the forward's own);
    /// `None` when any of them cannot be read.
    pub(crate) fn open(threads: Vec<Thread>) -> Option<Window> {
        let read: Option<Vec<(Thread, Reading)>> =
            threads.into_iter().map(|t| Some((t, read(&t)?))).collect();
        Some(Window {
            threads: read?,
            opened: Instant::now(),
            closed: None,
        })
    }

    /// Closes the window now, unless it is closed already.
    pub(crate) fn close(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let counts: Option<Vec<Reading>> = (self.threads.iter())
            .map(|(t, before)| Some(read(t)?.since(*before)))
            .collect();
        // The clock stops after the last read: every thread's counts fall
        // inside the window (the reads at its opening came before it).
        let wall = self.opened.elapsed().as_nanos() as u64;
        self.closed = counts.map(|c| (wall, c));
    }

    /// The table's lines (the window closed now if it is still open).
    pub(crate) fn report(&mut self) -> String {
        self.close();
        match &self.closed {
            Some((wall, counts)) => summary(*wall, counts),
            None => "threads on their cpus: a thread's counters could not be read again\n".into(),
        }
    }
}

/// What [`Window::report`] prints for `counts` (the forward's thread
/// first) over `wall` ns.
fn summary(wall: u64, counts: &[Reading]) -> String {
    let all = wall as f64 * counts.len() as f64;
    let pc = |v: f64| percent(v, all);
    let sum = |f: fn(&Reading) -> u64| counts.iter().map(f).sum::<u64>();
    let (cpu, queued) = (sum(|r| r.cpu) as f64, sum(|r| r.queued) as f64);
    let off = (all - cpu - queued).max(0.0);
    let mut s = format!(
        "threads on their cpus: the forward's and {} of its team, {:.3} ms each\n\
         on cpu {:.1}%, waiting for a cpu {:.1}%, neither {:.1}% (asleep, or the cpu taken by \
         interrupts or the hypervisor); switched out {} times asked (sleeps), {} not\n",
        counts.len().saturating_sub(1),
        wall as f64 / 1e6,
        pc(cpu),
        pc(queued),
        pc(off),
        sum(|r| r.voluntary),
        sum(|r| r.involuntary),
    );
    if let Some((i, least)) = (counts.iter().enumerate()).min_by_key(|(_, r)| r.cpu) {
        let share = |v: u64| percent(v as f64, wall as f64);
        s += &format!(
            "least on cpu: thread {i} ({}), {:.1}% (waiting {:.1}%)\n",
            if i == 0 {
                "the forward's"
            } else {
                "the team's"
            },
            share(least.cpu),
            share(least.queued)
        );
    }
    s
}

/// `v` in percent of `of` (0 where `of` is not positive).
fn percent(v: f64, of: f64) -> f64 {
    if of > 0.0 {
        100.0 * v / of
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn status_and_schedstat_are_read_by_field() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        let r = parse(5, "100 250 7\n", status).unwrap();
        assert_eq!(
            r,
            Reading {
                cpu: 5,
                queued: 250,
                voluntary: 12,
                involuntary: 3
            }
        );
        // A missing field is no reading, not a zero.
        assert_eq!(parse(5, "100\n", status), None);
        assert_eq!(parse(5, "1 2 3", "voluntary_ctxt_switches:\t1\n"), None);
    }

    /// A thread that spins is on its CPU for most of a window; one that
    /// sleeps is not, and its sleeps are counted as asked for.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_spinning_thread_is_on_its_cpu_and_a_sleeping_one_is_not() {
        let spin = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        };
        let sleeper = std::thread::spawn(move || {
            let me = Thread::current().unwrap();
            let mut w = Window::open(vec![me]).unwrap();
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(10));
            }
            w.close();
            w.closed.unwrap()
        });
        let me = Thread::current().unwrap();
        let mut w = Window::open(vec![me]).unwrap();
        spin(Duration::from_millis(50));
        w.close();
        let (wall, spun) = w.closed.clone().unwrap();
        // On a loaded machine the spinner may wait for its CPU: what it
        // did not run, it waited for or lost to the hypervisor.
        assert!(spun[0].cpu <= wall, "{spun:?} over {wall} ns");
        assert!(
            spun[0].cpu + spun[0].queued >= wall / 2,
            "{spun:?} over {wall} ns"
        );
        let (wall, slept) = sleeper.join().unwrap();
        assert!(slept[0].voluntary >= 5, "{slept:?}");
        assert!(slept[0].cpu < wall / 4, "{slept:?} over {wall} ns");
        let text = w.report();
        assert!(text.contains("the forward's and 0 of its team"), "{text}");
    }
}
