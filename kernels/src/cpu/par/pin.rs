//! `TAPTREE_CPU_PIN=1`, an experiment: each thread of a team, and the
//! forward's own thread while a forward runs, on a CPU of its own among
//! those the process may use (its affinity mask when the first team
//! started: `taskset -c 0-15` gives CPUs 0 to 15), so that a bench on a
//! many-core host can tell whether threads moving between cores cost the
//! forward anything. Thread `i` of a team (0: the caller) takes the mask's
//! `i`-th CPU, wrapping round when there are more threads than CPUs. Off
//! (the default), nothing is pinned. Where it takes a thread is the only
//! thing it changes: no task computes anything else.
//!
//! The caller is pinned for one forward only ([`caller`]'s guard gives its
//! mask back): a thread it spawned meanwhile would inherit the one CPU.

/// Whether `TAPTREE_CPU_PIN=1`.
pub(super) fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("TAPTREE_CPU_PIN").as_deref() {
        Ok("1") => true,
        Ok("") | Ok("0") | Err(_) => false,
        Ok(other) => {
            eprintln!("taptree: TAPTREE_CPU_PIN={other:?}: expected 1 or 0; not pinning");
            false
        }
    })
}

/// Pins team thread `me` (1 and up) to the mask's `me`-th CPU.
pub(super) fn helper(me: usize) {
    imp::pin_to(me);
}

/// While alive, the calling thread is pinned to the mask's first CPU (when
/// pinning is on); dropped, it gets its own mask back.
pub(crate) struct CallerPin {
    old: Option<imp::Mask>,
}

/// Pins the calling thread (a forward's, for the length of the forward)
/// when `pin`.
pub(super) fn caller(pin: bool) -> CallerPin {
    let old = match pin {
        true => imp::current(),
        false => None,
    };
    // Only a thread that was pinned gets its mask back.
    let pinned = old.is_some() && imp::pin_to(0);
    CallerPin {
        old: old.filter(|_| pinned),
    }
}

impl Drop for CallerPin {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            imp::set(&old);
        }
    }
}

/// The mask the process started its teams with (read once, before any
/// thread was pinned).
pub(super) fn init() {
    imp::cpus();
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::OnceLock;

    pub(super) type Mask = libc::cpu_set_t;

    /// The calling thread's affinity mask.
    pub(super) fn current() -> Option<Mask> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set, and the call
        // writes at most its size.
        unsafe {
            let mut m: Mask = std::mem::zeroed();
            (libc::sched_getaffinity(0, std::mem::size_of::<Mask>(), &mut m) == 0).then_some(m)
        }
    }

    /// Sets the calling thread's mask; false when the kernel refused.
    pub(super) fn set(m: &Mask) -> bool {
        // SAFETY: `m` is a whole cpu_set_t; pid 0 is the calling thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<Mask>(), m) == 0 }
    }

    /// The CPUs of `m`, in order.
    pub(super) fn listed(m: &Mask) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `c` is below CPU_SETSIZE, within the set.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, m) })
            .collect()
    }

    /// The CPUs of the mask, in order, as the first caller found them.
    pub(super) fn cpus() -> &'static [usize] {
        static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
        CPUS.get_or_init(|| current().map_or_else(Vec::new, |m| listed(&m)))
    }

    /// Pins the calling thread to the `i`-th CPU of [`cpus`] (modulo their
    /// count); false when there is none or the kernel refused.
    pub(super) fn pin_to(i: usize) -> bool {
        let cpus = cpus();
        if cpus.is_empty() {
            return false;
        }
        // SAFETY: as in `current`; the CPU is below CPU_SETSIZE.
        let m = unsafe {
            let mut m: Mask = std::mem::zeroed();
            libc::CPU_SET(cpus[i % cpus.len()], &mut m);
            m
        };
        set(&m)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub(super) type Mask = ();
    pub(super) fn current() -> Option<Mask> {
        None
    }
    pub(super) fn set(_: &Mask) -> bool {
        false
    }
    pub(super) fn cpus() -> &'static [usize] {
        &[]
    }
    pub(super) fn pin_to(_: usize) -> bool {
        false
    }
}

/// The CPUs the calling thread may run on now.
#[cfg(all(test, target_os = "linux"))]
pub(super) fn allowed() -> Vec<usize> {
    imp::listed(&imp::current().expect("sched_getaffinity"))
}
