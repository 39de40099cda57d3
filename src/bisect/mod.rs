//! The machinery of `taptree bisect`, independent of how a verdict is reached.
//!
//! - [`git`]: the repository, the first-parent range, one worktree per
//!   candidate (the user's checkout, index and branches are never touched);
//! - [`command`]: the user's capture command, run as `git bisect run` runs its
//!   script (exit 125 = skip);
//! - [`cache`]: trees cached by commit (or by arm) and command;
//! - [`search`]: binary search for the first red commit, with skips;
//! - [`ddmin`]: delta debugging for a minimal set of switches;
//! - [`judge`]: green or red against the reference, by the `diff` crate;
//! - [`runner`]: one step, from the cache or a fresh capture;
//! - [`commits`] and [`switches`]: the two bisects, each computing a report (`CommitsReport`, `SwitchesReport`)
//!   that [`render`] presents.

pub mod cache;
pub mod command;
pub mod commits;
pub mod ddmin;
pub mod git;
pub mod judge;
pub mod render;
pub mod runner;
pub mod search;
pub mod switches;
