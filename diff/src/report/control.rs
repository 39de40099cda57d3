//! A control's result, as values: which check, whether the comparator
//! passed it, and what it found. [`crate::render::finding`] words the
//! finding (the JSON's `detail`).

use super::Side;
use crate::metrics::Degeneracy;
use capture::{Key, RowId};

/// A check of the comparator itself.
#[derive(Debug, Clone)]
pub struct Control {
    /// Which control.
    pub name: ControlName,
    /// Whether the comparator passed it.
    pub passed: bool,
    /// What was checked and found (the JSON's `detail`, in words).
    pub finding: Finding,
    /// Degenerate taps found (FIXTURE VALIDITY).
    pub flagged: Vec<Flagged>,
}

/// The three controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlName {
    /// A against A must be bitwise equal.
    SelfCheck,
    /// A planted change must be named exactly.
    Perturbed,
    /// No tap position may be degenerate.
    FixtureValidity,
}

impl ControlName {
    /// `SELF`, `PERTURBED` or `FIXTURE VALIDITY`, as every renderer names it.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlName::SelfCheck => "SELF",
            ControlName::Perturbed => "PERTURBED",
            ControlName::FixtureValidity => "FIXTURE VALIDITY",
        }
    }
}

/// What a control checked and found.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// SELF passed: every matched position bitwise equal.
    SelfEqual {
        /// Positions matched and compared.
        positions: u64,
    },
    /// SELF failed: rows not bitwise equal, or positions not matched.
    SelfDiffers {
        /// Rows neither equal nor degenerate.
        rows: usize,
        /// The first of them.
        first: Option<RowId>,
        /// Positions matched.
        matched: u64,
        /// Positions A holds.
        positions: u64,
    },
    /// PERTURBED: A holds no tap to plant a change in.
    NothingToPerturb,
    /// PERTURBED passed: the planted change was the first and only red row.
    PlantedNamed {
        /// Where the change was planted (one position).
        at: Key,
    },
    /// PERTURBED failed: another row was named first, or more rows went red.
    PlantedMisnamed {
        /// Where the change was planted.
        at: Key,
        /// The first red row.
        found: RowId,
        /// Its worst position.
        pos: u32,
        /// Red rows in all.
        red: u64,
    },
    /// PERTURBED failed: the planted change was not seen.
    PlantedUnseen {
        /// Where the change was planted.
        at: Key,
    },
    /// FIXTURE VALIDITY passed.
    FixturesValid {
        /// Tap positions checked.
        positions: u64,
    },
    /// FIXTURE VALIDITY failed: some positions are degenerate (the first
    /// is the control's `flagged[0]`).
    FixturesDegenerate {
        /// How many.
        degenerate: usize,
        /// Tap positions checked.
        positions: u64,
        /// The first one.
        first: Flagged,
    },
}

/// A degenerate tap position.
#[derive(Debug, Clone, PartialEq)]
pub struct Flagged {
    /// The tree holding it (`A` or `B`).
    pub tree: Side,
    /// The position (a one-position key).
    pub key: Key,
    /// How it is degenerate.
    pub what: Degeneracy,
}
