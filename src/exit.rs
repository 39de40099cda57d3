//! Exit codes, documented in `taptree --help` and docs/GUIDE.md.
//!
//! A tool failure must never read as a model defect (1) nor as agreement (0).

/// Identical, or within tolerance; a command that did its job.
pub const OK: u8 = 0;
/// The trees diverge (diff, verify A B), or a bisect found its answer red.
pub const DIVERGED: u8 = 1;
/// Could not compare: missing or incomplete tree, corrupt file, bad input,
/// a failed control, an unsupported model. Never a verdict on the model.
pub const COULD_NOT_COMPARE: u8 = 2;
