//! What every root integration test uses: the `taptree` binary run with
//! arguments, its output as text, and the one lock around in-process
//! captures.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// One capture may be armed per process, and every test of this binary runs
/// on a thread of one process: a test that arms a capture in-process holds
/// this lock (through [`one_capture_at_a_time`]).
pub static CAPTURE: Mutex<()> = Mutex::new(());

/// Holds [`CAPTURE`], also after another test panicked while holding it.
pub fn one_capture_at_a_time() -> MutexGuard<'static, ()> {
    CAPTURE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the built `taptree` with `args`.
pub fn taptree(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taptree"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

/// Whether the tests run under CI (`CI=true`), where a test whose model
/// or tool is missing must fetch it or fail, never skip.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// SmolLM2's path: cached, or fetched under CI; elsewhere `None` (the
/// caller skips, and this says so).
pub fn smollm2() -> Option<String> {
    if let Some(p) = fetch::cached_smollm2() {
        return Some(p.display().to_string());
    }
    if under_ci() {
        let p = fetch::ensure_smollm2().expect("CI needs SmolLM2");
        return Some(p.display().to_string());
    }
    eprintln!("skipping: SmolLM2 is not cached (cargo run -p fetch --example fetch_model)");
    None
}

/// A JSON report row's name: `L3/ffn_down`, or `logits` outside the layers.
pub fn row_name(row: &serde_json::Value) -> String {
    match row["layer"].as_u64() {
        Some(l) => format!("L{l}/{}", row["stage"].as_str().unwrap()),
        None => row["stage"].as_str().unwrap().to_string(),
    }
}

/// stdout and stderr, as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The binary run free of the caller's capture settings: the
/// `TAPTREE_ACT_*`, `TAPTREE_OUT` and `TAPTREE_SELECT` of the shell that
/// runs the tests would change what a capture writes.
pub mod clean {
    use std::path::Path;
    use std::process::{Command, Output};

    /// The built `taptree`, without the shell's capture variables.
    pub fn taptree() -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_taptree"));
        for (k, _) in std::env::vars() {
            if k.starts_with("TAPTREE_ACT_") || k == "TAPTREE_OUT" || k == "TAPTREE_SELECT" {
                c.env_remove(k);
            }
        }
        c
    }

    /// Runs [`taptree`] with `args`.
    pub fn run(args: &[&str]) -> Output {
        taptree().args(args).output().expect("taptree runs")
    }

    /// stdout then stderr, as one text.
    pub fn text(o: &Output) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    /// The exit code.
    pub fn code(o: &Output) -> i32 {
        o.status.code().expect("exited")
    }

    /// A fixture model written into `dir`, by name.
    pub fn fixture(dir: &Path, name: &str) -> String {
        fixtures::write(name, dir).unwrap().display().to_string()
    }
}
