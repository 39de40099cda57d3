//! The machinery of `taptree bisect`, independent of how a verdict is reached.
//!
//! - [`git`]: the repository, the first-parent range, one worktree per
//!   candidate (the user's checkout, index and branches are never touched);
//! - [`command`]: the user's capture command, run as `git bisect run` runs its
//!   script (exit 125 = skip);
//! - [`cache`]: trees cached by commit (or by arm) and command;
//! - [`search`]: binary search for the first red commit, with skips;
//! - [`ddmin`]: delta debugging for a minimal set of switches.
//!
//! The CLI (`src/cli/bisect.rs`) decides green or red with the `diff` crate.

// Until the CLI drives every part of it.
#![allow(dead_code)]

pub mod cache;
pub mod command;
pub mod ddmin;
pub mod git;
pub mod search;
