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
    println!(
        "cargo:rustc-env=TAPTREE_BUILD_ID={now:x}-{:x}",
        std::process::id()
    );
}
