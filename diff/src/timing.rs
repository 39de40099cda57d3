//! `TAPTREE_TIMING=1`: where a diff's time goes, phase by phase, on stderr
//! (the capture prints its end's phases under the same variable). Marks
//! cost one cached load when it is off.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

static ON: OnceLock<bool> = OnceLock::new();
static MARKS: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());

/// Whether `TAPTREE_TIMING` is `1`.
pub fn on() -> bool {
    *ON.get_or_init(|| std::env::var_os("TAPTREE_TIMING").is_some_and(|v| v == "1"))
}

/// Notes that phase `what` ended now.
pub fn mark(what: &'static str) {
    if on() {
        MARKS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((what, Instant::now()));
    }
}

/// The phases marked since `start`, each with its milliseconds, as one
/// line (no phase when timing is off).
pub fn line(start: Instant) -> String {
    let marks = MARKS.lock().unwrap_or_else(|p| p.into_inner());
    let mut last = start;
    let mut out = String::from("diff timing (ms):");
    for (what, at) in marks.iter() {
        out += &format!(" {what} {:.2};", (*at - last).as_secs_f64() * 1e3);
        last = *at;
    }
    out + &format!(" total {:.2}", (last - start).as_secs_f64() * 1e3)
}
