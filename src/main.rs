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
            eprintln!("taptree: {}", message(&err));
            ExitCode::from(exit::COULD_NOT_COMPARE)
        }
    }
}

/// The error and its causes, `: `-separated, leaving out a cause whose text the
/// message already carries (library errors embed their io cause as
/// `path: cause`, and also expose it as their source).
fn message(err: &anyhow::Error) -> String {
    let mut out = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}
