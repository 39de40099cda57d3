//! One build's id, shared by the `taptree` front and `taptree-full`: the
//! front hands it over, and the full command refuses to run under a front
//! of another build (src/front.rs), so that `cargo build --bin taptree`
//! alone can never leave new front code handing over to an old full one.
//! A new id is made whenever any workspace crate's source changes.

use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    for path in [
        "src",
        "capture/src",
        "diff/src",
        "kernels/src",
        "model/src",
        "replay/src",
        "fetch/src",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Position-dependent executables on Linux: a position-independent one
    // has the dynamic loader apply some 25,000 relocations at every start,
    // faulting in the pages they lie on (about 125 page faults and 0.6-0.9
    // ms of a 2-3 ms start; a diff of two mostly equal trees is a few ms).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!(
        "cargo:rustc-env=TAPTREE_BUILD_ID={now:x}-{:x}",
        std::process::id()
    );
}
