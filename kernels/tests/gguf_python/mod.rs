//! What the tests that compare against Python and the real model share.
//!
//! Outside CI a missing Python package or an unfetched model skips the test
//! with a printed reason; under CI (`CI=true`) both are failures, so a
//! broken environment can never pass as green.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn python() -> String {
    std::env::var("TAPTREE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether Python can import `modules`; prints why not (and panics in CI).
pub fn python_has(modules: &[&str]) -> bool {
    let code = format!("import {}", modules.join(", "));
    let ok = Command::new(python())
        .args(["-c", &code])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let msg = format!(
            "python cannot `{code}`: python3 -m pip install numpy safetensors gguf tokenizers"
        );
        if in_ci() {
            panic!("{msg}");
        }
        eprintln!("skipped: {msg}");
    }
    ok
}

/// The real model: fetched in CI or with `TAPTREE_FETCH=1`, else only used
/// when already cached.
pub fn smollm2() -> Option<PathBuf> {
    real_model(&fetch::SMOLLM2)
}

/// Gemma 3 270M, as [`smollm2`].
pub fn gemma3() -> Option<PathBuf> {
    real_model(&fetch::GEMMA3_270M)
}

fn real_model(m: &fetch::RealModel) -> Option<PathBuf> {
    if let Some(p) = fetch::cached(m) {
        return Some(p);
    }
    if in_ci() || std::env::var("TAPTREE_FETCH").is_ok_and(|v| v == "1") {
        return Some(fetch::ensure(m).unwrap_or_else(|e| panic!("fetching {}: {e}", m.name)));
    }
    eprintln!(
        "skipped: {} is not in {} (run `cargo run --release -p fetch --example fetch_model {}`, or set TAPTREE_FETCH=1)",
        m.name,
        fetch::cache_dir().display(),
        m.name
    );
    None
}

/// Runs a script from fixtures/ and returns its stdout.
pub fn run_script(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(python())
        .arg(repo_root().join("fixtures").join(script))
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Deterministic bytes (splitmix64).
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}
