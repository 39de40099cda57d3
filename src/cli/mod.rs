//! Subcommands. Each lives in its own module with its `Args` and `run`,
//! named for its subcommand; where that is also a crate's name (`capture`,
//! `diff`, `replay`), the module is `NAME_cmd`, so that `capture::` always
//! means the crate.

pub mod bisect;
pub mod capture_cmd;
pub mod diff_cmd;
mod diff_tp;
pub mod drift;
pub mod engine;
pub mod forward;
pub mod ls;
pub mod replay_cmd;
pub mod replay_html;
pub mod stat;
pub mod trees;
pub mod verify;

use clap::{Parser, Subcommand};

/// Capture every intermediate tensor of an LLM forward into a content-hashed
/// tree, and diff two trees.
///
/// Exit codes: 0 identical or within tolerance, 1 diverged, 2 could not
/// compare (missing or incomplete tree, corrupt file, bad input).
#[derive(Debug, Parser)]
// `bin_name`: usage reads `taptree` also when `taptree-full` is started
// by its own name (the front hands over with its own argv[0]).
#[command(name = "taptree", bin_name = "taptree", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a forward of a model and write every tap into a tree.
    Capture(capture_cmd::Args),
    /// `ls`, `verify`, `diff`, `stat`: they read trees only (also answered
    /// by the front, src/front.rs).
    #[command(flatten)]
    Trees(trees::TreeCommand),
    /// Find the commit or the runtime switch that caused a divergence.
    Bisect(bisect::Args),
    /// Greedy answers under two configurations, prompt by prompt.
    Drift(drift::Args),
    /// Recompute every op of a tree from its own inputs: each op's local error.
    Replay(replay_cmd::Args),
}

/// Runs a parsed command line; returns the exit code.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Capture(args) => capture_cmd::run(args),
        Command::Trees(command) => command.run(),
        Command::Bisect(args) => bisect::run(args),
        Command::Drift(args) => drift::run(args),
        Command::Replay(args) => replay_cmd::run(args),
    }
}
