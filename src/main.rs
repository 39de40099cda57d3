//! The `taptree` command: parse, dispatch, map the outcome to an exit code.

mod bisect;
mod cli;
mod exit;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("taptree: {err:#}");
            ExitCode::from(exit::COULD_NOT_COMPARE)
        }
    }
}
