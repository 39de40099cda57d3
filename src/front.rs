//! The `taptree` command's front.
//!
//! The commands that read trees and run no model (`ls`, `verify`, `diff`,
//! `stat`: src/cli/trees.rs) are answered here, by the same code as in the
//! full command, so that each costs one program's start: the full command
//! is a large binary whose start-up relocations fault in hundreds of pages
//! (docs/PERFORMANCE.md). A trusted `taptree verify A B` of two trees whose
//! roots are equal is settled before any argument parsing (src/trusted.rs).
//! Every other command line (the commands that run a model, `--help`,
//! `--version`, anything unknown) is handed, unchanged, to the full command
//! `taptree-full` beside this one (by `exec`, so its output, exit code and
//! signals are the full command's own).

#![forbid(unsafe_code)]

mod exit;
mod trusted;

/// The subcommand modules that `cli::trees` runs, and it.
mod cli {
    pub mod diff_cmd;
    mod diff_tp;
    pub mod ls;
    pub mod stat;
    pub mod trees;
    pub mod verify;
}

use cli::trees::TreeCommand;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The full command's file name, beside this one.
const FULL: &str = "taptree-full";

/// The variable that carries this build's id to the full command, which
/// refuses to run under a front of another build (build.rs).
const BUILD_VAR: &str = "TAPTREE_FRONT_BUILD";

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some((a, b)) = trusted_verify(&args) {
        if let Ok(Some(head)) = trusted::identical_heads(a, b) {
            return exit::end(trusted::report_identical(&head));
        }
    }
    if args.get(1).is_some_and(answered_here) {
        exit::on_failed_print();
        let front = <Front as clap::Parser>::parse_from(&args);
        return exit::end(front.command.run());
    }
    hand_over(&args)
}

/// Whether a command line whose first argument is `verb` is one of the
/// tree commands, which this front runs itself.
fn answered_here(verb: &OsString) -> bool {
    verb.to_str()
        .is_some_and(<TreeCommand as clap::Subcommand>::has_subcommand)
}

/// The command lines the front parses: one of the tree commands, read as
/// the full command reads it (the same `Args`, under the same name).
#[derive(clap::Parser)]
#[command(name = "taptree", bin_name = "taptree")]
struct Front {
    #[command(subcommand)]
    command: TreeCommand,
}

/// The two trees of `taptree verify A B`, when that is the whole command
/// line and neither path could be read as an option; `None` otherwise.
fn trusted_verify(args: &[OsString]) -> Option<(&Path, &Path)> {
    let plain = |a: &OsString| !a.is_empty() && !a.as_encoded_bytes().starts_with(b"-");
    match args {
        [_, verb, a, b] if verb == "verify" && plain(a) && plain(b) => {
            Some((Path::new(a), Path::new(b)))
        }
        _ => None,
    }
}

/// Runs the full command with this command line.
fn hand_over(args: &[OsString]) -> ExitCode {
    let full = match full_command() {
        Ok(path) => path,
        Err(e) => {
            let _ = writeln!(io::stderr(), "taptree: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cmd = Command::new(&full);
    cmd.args(args.iter().skip(1))
        .env(BUILD_VAR, env!("TAPTREE_BUILD_ID"));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        if let Some(arg0) = args.first() {
            cmd.arg0(arg0);
        }
        // Only returns on failure.
        let e = cmd.exec();
        let _ = writeln!(
            io::stderr(),
            "taptree: could not start {}: {e}",
            full.display()
        );
        ExitCode::from(2)
    }
    #[cfg(not(unix))]
    match cmd.status() {
        Ok(status) => ExitCode::from(status.code().map_or(2, |c| c as u8)),
        Err(e) => {
            let _ = writeln!(
                io::stderr(),
                "taptree: could not start {}: {e}",
                full.display()
            );
            ExitCode::from(2)
        }
    }
}

/// `taptree-full` in this executable's directory.
fn full_command() -> Result<PathBuf, String> {
    let me = std::env::current_exe()
        .map_err(|e| format!("cannot find this executable's own path: {e}"))?;
    let full = me.with_file_name(format!("{FULL}{}", std::env::consts::EXE_SUFFIX));
    if full.is_file() {
        Ok(full)
    } else {
        Err(format!(
            "{} is missing: `taptree` runs every command but a trusted `verify A B` through the full \
             command installed beside it (`cargo build --release` or `cargo install --path .` builds both)",
            full.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn only_a_plain_verify_of_two_trees_is_answered_here() {
        assert!(trusted_verify(&line("taptree verify a b")).is_some());
        for other in [
            "taptree verify a",
            "taptree verify a b c",
            "taptree verify --rehash a b",
            "taptree verify a --json",
            "taptree verify -- b",
            "taptree verify a -",
            "taptree verifyx a b",
            "taptree diff a b",
            "taptree",
        ] {
            assert!(trusted_verify(&line(other)).is_none(), "{other}");
        }
    }
}
