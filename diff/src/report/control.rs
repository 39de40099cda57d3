//! A control's result, as values: what it found, from which follow which
//! check it was, whether the comparator passed it, and the degenerate
//! positions it flagged. [`crate::render::finding`] words the finding (the
//! JSON's `detail`).

use super::Side;
use crate::metrics::Degeneracy;
use capture::{Key, RowId};
use serde::Serialize;

/// A key serialized as the text its `Display` writes (`L1/v_proj@0`).
fn as_text<S: serde::Serializer>(key: &Key, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(key)
}

/// A key that serializes as the text its `Display` writes (`L1/v_proj@0`),
/// written straight into the output.
pub(crate) struct KeyText<'k>(pub(crate) &'k Key);

impl Serialize for KeyText<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        as_text(self.0, s)
    }
}

/// A check of the comparator itself.
#[derive(Debug, Clone)]
pub struct Control {
    /// What was checked and found (the JSON's `detail`, in words).
    pub finding: Finding,
}

impl Control {
    /// Which control it was.
    pub fn name(&self) -> ControlName {
        match self.finding {
            Finding::SelfEqual { .. } | Finding::SelfDiffers { .. } => ControlName::SelfCheck,
            Finding::NothingToPerturb
            | Finding::PlantedNamed { .. }
            | Finding::PlantedMisnamed { .. }
            | Finding::PlantedUnseen { .. } => ControlName::Perturbed,
            Finding::FixturesValid { .. } | Finding::FixturesDegenerate { .. } => {
                ControlName::FixtureValidity
            }
        }
    }

    /// Whether the comparator passed it.
    pub fn passed(&self) -> bool {
        matches!(
            self.finding,
            Finding::SelfEqual { .. }
                | Finding::PlantedNamed { .. }
                | Finding::FixturesValid { .. }
        )
    }

    /// The degenerate tap positions it found (FIXTURE VALIDITY), in the
    /// order the trees and their entries were read.
    pub fn flagged(&self) -> &[Flagged] {
        match &self.finding {
            Finding::FixturesDegenerate { flagged, .. } => flagged,
            _ => &[],
        }
    }
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
    /// FIXTURE VALIDITY failed: some positions are degenerate.
    FixturesDegenerate {
        /// Tap positions checked.
        positions: u64,
        /// The degenerate ones (at least one), in the order read.
        flagged: Vec<Flagged>,
    },
}

/// A degenerate tap position. Serialized as the JSON's `flagged` items:
/// the tree as `A` or `B`, the key as text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flagged {
    /// The tree holding it (`A` or `B`).
    pub tree: Side,
    /// The position (a one-position key).
    #[serde(serialize_with = "as_text")]
    pub key: Key,
    /// How it is degenerate.
    pub what: Degeneracy,
}
