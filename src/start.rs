//! Parsing the command line without building every subcommand.
//!
//! clap's derive builds the whole command tree (every subcommand's
//! arguments, help texts and value parsers) before it looks at the first
//! argument. Trusted `taptree verify A B` is a few milliseconds in all, so
//! that tree is a visible part of it (docs/PERFORMANCE.md): `verify` is
//! parsed against a tree holding `verify` alone. Anything that tree does
//! not accept as a command to run (help, a usage error, any other word) is
//! parsed again by the full tree, so that every message, help text and exit
//! code is the full tree's.

use crate::cli::{self, verify};
use clap::{Parser, Subcommand};
use std::ffi::OsString;

/// The `taptree` command with its `verify` subcommand only.
#[derive(Debug, Parser)]
#[command(name = "taptree", bin_name = "taptree")]
struct VerifyOnly {
    #[command(subcommand)]
    command: OnlyVerify,
}

#[derive(Debug, Subcommand)]
enum OnlyVerify {
    Verify(verify::Args),
}

/// The parsed command line of this process (exits, as clap does, on help
/// and usage errors).
pub fn parse() -> cli::Cli {
    match parse_fast(std::env::args_os()) {
        Some(cli) => cli,
        None => cli::Cli::parse(),
    }
}

/// The command line `args`, when it is a `verify` that the `verify`-only
/// tree accepts; `None` for anything else, which the full tree parses.
fn parse_fast(args: impl IntoIterator<Item = OsString>) -> Option<cli::Cli> {
    let args: Vec<OsString> = args.into_iter().collect();
    if args.get(1).is_none_or(|a| a != "verify") {
        return None;
    }
    match VerifyOnly::try_parse_from(args) {
        Ok(VerifyOnly {
            command: OnlyVerify::Verify(args),
        }) => Some(cli::Cli {
            command: cli::Command::Verify(args),
        }),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn both(line: &str) -> (Option<cli::Cli>, Result<cli::Cli, clap::Error>) {
        let args: Vec<OsString> = line.split(' ').map(OsString::from).collect();
        (parse_fast(args.clone()), cli::Cli::try_parse_from(args))
    }

    #[test]
    fn verify_is_parsed_as_the_full_tree_parses_it() {
        for line in [
            "taptree verify a b",
            "taptree verify a",
            "taptree verify --rehash a b",
            "taptree verify --json --rehash a b",
            "taptree verify a -- --b",
        ] {
            let (fast, full) = both(line);
            let fast = fast.unwrap_or_else(|| panic!("{line}: not taken by the fast path"));
            let full = full.unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(format!("{fast:?}"), format!("{full:?}"), "{line}");
        }
    }

    #[test]
    fn anything_else_goes_to_the_full_tree() {
        for line in [
            "taptree verify",
            "taptree verify a b c",
            "taptree verify --help",
            "taptree verify --version",
            "taptree verify --rehahs a b",
            "taptree ls a",
            "taptree --version",
            "taptree verifyx a b",
            "taptree",
        ] {
            assert!(both(line).0.is_none(), "{line}: taken by the fast path");
        }
    }
}
