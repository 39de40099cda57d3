//! The commands that read trees and run no model: `ls`, `verify`, `diff`
//! and `stat`. The `taptree` front (src/front.rs) answers them itself, so
//! that they cost one program's start, not two; the full command lists them
//! too, in its own list (`cli::Command::Trees`), with the same arguments.

use super::{diff_cmd, ls, stat, verify};
use clap::Subcommand;

/// The tree commands, as both binaries parse them.
#[derive(Debug, Subcommand)]
pub enum TreeCommand {
    /// List a tree's taps in forward order.
    Ls(ls::Args),
    /// Check a tree's integrity, or whether two trees are bitwise identical.
    Verify(verify::Args),
    /// Compare two trees: first diverging op, metrics, truth.
    Diff(diff_cmd::Args),
    /// Statistics of a tree's taps: range, top dimensions, crushed blocks.
    Stat(stat::Args),
}

impl TreeCommand {
    /// Runs the command; returns the exit code.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            TreeCommand::Ls(args) => ls::run(args),
            TreeCommand::Verify(args) => verify::run(args),
            TreeCommand::Diff(args) => diff_cmd::run(args),
            TreeCommand::Stat(args) => stat::run(args),
        }
    }
}
