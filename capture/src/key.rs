//! A tap's identity: (stage, layer or none, position range, optional slot).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;

/// Identifies one tapped tensor in a tree.
///
/// `pos` is a half-open range of token positions. A tap holding more than one
/// position stores them as rows: axis 0 of its shape has `pos.len()` entries,
/// so a batched-prefill tap diffs against one-position-at-a-time decode taps.
/// `slot` names a sequence of a batched decode (none for a single sequence).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Key {
    pub stage: String,
    pub layer: Option<u32>,
    pub pos: Range<u32>,
    pub slot: Option<u32>,
}

impl Key {
    pub fn new(stage: impl Into<String>, layer: Option<u32>, pos: Range<u32>) -> Key {
        Key {
            stage: stage.into(),
            layer,
            pos,
            slot: None,
        }
    }

    pub fn with_slot(mut self, slot: Option<u32>) -> Key {
        self.slot = slot;
        self
    }

    /// Number of positions (rows) the tap holds.
    pub fn rows(&self) -> u32 {
        self.pos.end.saturating_sub(self.pos.start)
    }
}

/// `L3/ffn_down@0..7` or `final_norm@5 slot 2`: the form used in every report.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(layer) = self.layer {
            write!(f, "L{layer}/")?;
        }
        write!(f, "{}@", self.stage)?;
        if self.pos.end == self.pos.start + 1 {
            write!(f, "{}", self.pos.start)?;
        } else {
            write!(f, "{}..{}", self.pos.start, self.pos.end)?;
        }
        if let Some(slot) = self.slot {
            write!(f, " slot {slot}")?;
        }
        Ok(())
    }
}
