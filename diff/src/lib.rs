//! Compare two taptree trees and say, with evidence, where they first stop
//! agreeing and which side is wrong.
//!
//! [`diff`] walks two trees ([`Tree`], usually [`capture::TreeReader`]) and
//! returns a [`DiffReport`]: one [`report::Row`] per (layer, stage) in forward
//! order, with per-position [`Metrics`], a verdict under a [`Tolerance`], the
//! first diverging op, origin vs inherited, error growth and, with a truth
//! tree, which side is inaccurate. [`controls`] check the comparator itself;
//! [`stat`] describes one tree. The renderers in [`render`] only format.
//!
//! The walk goes by steps (index, merge, read, judge: [`walk`](mod@walk)) and hands
//! what it finds to a delegate ([`walk::Visit`]); [`walk::Recorder`] builds
//! the report, and the controls are delegates of their own.
//!
//! ```no_run
//! use capture::TreeReader;
//! let a = TreeReader::open("runs/cpu-f32")?;
//! let b = TreeReader::open("runs/cpu-q8")?;
//! let report = diff::diff(&a, &b, None, &diff::Options::default())?;
//! if let Some(i) = report.first_divergence {
//!     println!("first diverging op: {}", report.rows[i].name());
//! }
//! print!("{}", diff::render::table::render(&report, &Default::default()));
//! println!("{}", diff::render::summary(&report));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod align;
pub mod controls;
pub mod divergence;
pub mod graph;
pub mod hints;
pub mod inputs;
pub mod layout;
pub mod metrics;
pub mod pool;
pub mod render;
pub mod report;
pub mod stat;
pub mod timing;
pub mod tolerance;
pub mod tree;
pub mod truth;
pub mod unshard;
pub mod walk;

pub use metrics::Metrics;
pub use report::{DiffOutcome, DiffReport};
pub use tolerance::Tolerance;
pub use tree::Tree;
pub use walk::{diff, walk, Options, Progress};

use std::path::PathBuf;

/// Why a diff could not be made. Every one maps to exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening or reading a tree failed (missing, incomplete, corrupt).
    #[error(transparent)]
    Capture(#[from] capture::Error),

    /// A tap's shape does not hold one row per position of its key.
    #[error("{}: {key}: shape {shape:?} does not hold one row per position", path.display())]
    BadRows {
        /// The tap file.
        path: PathBuf,
        /// The tap's key.
        key: String,
        /// The shape it holds.
        shape: Vec<usize>,
    },

    /// Two taps of one tree hold the same position.
    #[error("{}: position {pos} of {key} is held by two taps", path.display())]
    DuplicatePosition {
        /// The tree's directory.
        path: PathBuf,
        /// The key of the second tap holding it.
        key: String,
        /// The position held twice.
        pos: u32,
    },

    /// A stage declares a layout the diff cannot reconcile.
    #[error("{}: stage {stage}: {reason}", path.display())]
    Layout {
        /// The tree's directory.
        path: PathBuf,
        /// The stage whose layout is declared.
        stage: String,
        /// What the diff cannot reconcile.
        reason: String,
    },

    /// A tensor-parallel tap's shards do not make one full tensor: one
    /// missing, two overlapping, or declarations that disagree.
    #[error("{}: {key}: {reason}", path.display())]
    Shards {
        /// The tree.
        path: PathBuf,
        /// The full tensor's key.
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// `--at` or a control named a tap the tree does not hold.
    #[error("{}: no tap {key:?}", path.display())]
    NoSuchTap {
        /// The tree's directory.
        path: PathBuf,
        /// The tap as named.
        key: String,
    },
}
