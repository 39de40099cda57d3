//! The full `taptree` command (`taptree-full`, started by the `taptree`
//! front, src/front.rs): parse, dispatch, map the outcome to an exit code.

#![forbid(unsafe_code)]

mod bisect;
mod cli;
mod drift;
mod exit;
mod trusted;

use std::process::ExitCode;

fn main() -> ExitCode {
    exit::on_failed_print();
    if let Err(e) = same_build_as_the_front() {
        eprintln!("taptree: {e}");
        return ExitCode::from(exit::COULD_NOT_COMPARE);
    }
    let args = <cli::Cli as clap::Parser>::parse();
    exit::end(cli::run(args))
}

/// Started by the `taptree` front (src/front.rs), this binary must be of
/// the front's build: a front rebuilt alone would otherwise hand its
/// commands to an older full command. The variable is removed, so that
/// commands this one starts (a bisect's captures) see a clean environment.
fn same_build_as_the_front() -> Result<(), String> {
    let Some(front) = std::env::var_os("TAPTREE_FRONT_BUILD") else {
        return Ok(());
    };
    std::env::remove_var("TAPTREE_FRONT_BUILD");
    let mine = env!("TAPTREE_BUILD_ID");
    if front.to_str() == Some(mine) {
        return Ok(());
    }
    let me =
        std::env::current_exe().map_or_else(|_| "taptree-full".into(), |p| p.display().to_string());
    Err(format!(
        "{me} is from another build than the `taptree` beside it (build {} against {mine}): \
         build both (`cargo build --release` or `cargo install --path .`)",
        front.to_string_lossy()
    ))
}
