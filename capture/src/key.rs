//! A tap's identity: (stage, layer or none, position range, optional slot,
//! and for a tensor-parallel run, optional rank and [`Shard`] placement).
//!
//! Keys are printed and parsed here and nowhere else: [`Key`] (owned, in the
//! manifest), [`TapId`] (borrowed and `Copy`, on the hot path), [`RowId`]
//! (a (layer, stage) row of a report) and [`Site`] (a position named on a
//! command line, `L3/ffn_down@2 slot 1`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// Identifies one tapped tensor in a tree.
///
/// `pos` is a half-open range of token positions. A tap holding more than one
/// position stores them as rows: axis 0 of its shape has `pos.len()` entries,
/// so a batched-prefill tap diffs against one-position-at-a-time decode taps.
/// `slot` names a sequence of a batched decode (none for a single sequence).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Key {
    /// The stage (`ffn_down`), a name of the manifest's vocabulary.
    pub stage: String,
    /// The layer, or none for a stage outside the layers (`embedding`, `logits`).
    pub layer: Option<u32>,
    /// The positions held, one row each.
    pub pos: Range<u32>,
    /// The sequence of a batched decode, or none.
    pub slot: Option<u32>,
    /// The tensor-parallel rank that computed it, or none (a replicated or
    /// single-device tensor). Absent from the manifest when none, so trees
    /// without ranks keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Where this rank's tensor lies in the full one, or none: a ranked tap
    /// without a shard is a per-rank tensor of the full shape (an addend
    /// before an all-reduce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

/// A shard's place in the full tensor: elements `start..end` of `full`
/// along `axis` (never 0, the positions). The full tensor's shape is the
/// tap's shape with `shape[axis] = full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// The split axis of the tap's shape.
    pub axis: u32,
    /// First element along `axis` this shard holds.
    pub start: u32,
    /// One past the last.
    pub end: u32,
    /// The full tensor's extent along `axis`.
    pub full: u32,
}

impl fmt::Display for Shard {
    /// `1:0-320/576`, as tap file metadata and hash lines write it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}-{}/{}", self.axis, self.start, self.end, self.full)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("shard {s:?} is not axis:start-end/full");
        let (axis, rest) = s.split_once(':').ok_or_else(bad)?;
        let (range, full) = rest.split_once('/').ok_or_else(bad)?;
        let (start, end) = range.split_once('-').ok_or_else(bad)?;
        let n = |v: &str| v.parse::<u32>().map_err(|_| bad());
        Ok(Shard {
            axis: n(axis)?,
            start: n(start)?,
            end: n(end)?,
            full: n(full)?,
        })
    }
}

impl Key {
    /// A key without a slot.
    pub fn new(stage: impl Into<String>, layer: Option<u32>, pos: Range<u32>) -> Key {
        Key {
            stage: stage.into(),
            layer,
            pos,
            slot: None,
            rank: None,
            shard: None,
        }
    }

    /// The same key in `slot`.
    pub fn with_slot(mut self, slot: Option<u32>) -> Key {
        self.slot = slot;
        self
    }

    /// The same key computed by `rank`, placed in the full tensor by `shard`.
    pub fn with_rank(mut self, rank: Option<u32>, shard: Option<Shard>) -> Key {
        self.rank = rank;
        self.shard = shard;
        self
    }

    /// Number of positions (rows) the tap holds.
    #[inline]
    pub fn rows(&self) -> u32 {
        // Not through `id()`: opening and diffing a tree ask this of every
        // entry, and building the borrowed key was a visible part of that.
        self.pos.end.saturating_sub(self.pos.start)
    }

    /// The key, borrowed.
    pub fn id(&self) -> TapId<'_> {
        TapId::new(&self.stage, self.layer, self.pos.clone(), self.slot)
            .with_rank(self.rank, self.shard)
    }
}

/// `L3/ffn_down@0..7` or `final_norm@5 slot 2`: the form used in every report.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.id().fmt(f)
    }
}

/// Parses what [`Key`]'s `Display` writes.
impl FromStr for Key {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Key, ParseKeyError> {
        let parts = Parts::parse(s)?;
        let pos = parts
            .pos
            .ok_or_else(|| ParseKeyError::new(s, "no `@` position"))?;
        Ok(Key::new(parts.stage, parts.layer, pos)
            .with_slot(parts.slot)
            .with_rank(parts.rank, None))
    }
}

/// A tap's identity, borrowed: what a tap call carries, with no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TapId<'a> {
    /// The stage name.
    pub stage: &'a str,
    /// The layer, or none for a stage outside the layers.
    pub layer: Option<u32>,
    /// The first position held.
    pub start: u32,
    /// One past the last position held.
    pub end: u32,
    /// The sequence of a batched decode, or none.
    pub slot: Option<u32>,
    /// The tensor-parallel rank, or none.
    pub rank: Option<u32>,
    /// The rank's place in the full tensor, or none.
    pub shard: Option<Shard>,
}

impl<'a> TapId<'a> {
    /// The tap of `stage` (in `layer`, of `slot`) holding positions `pos`.
    pub fn new(stage: &'a str, layer: Option<u32>, pos: Range<u32>, slot: Option<u32>) -> Self {
        TapId {
            stage,
            layer,
            start: pos.start,
            end: pos.end,
            slot,
            rank: None,
            shard: None,
        }
    }

    /// The same tap computed by `rank`, placed by `shard`.
    pub fn with_rank(self, rank: Option<u32>, shard: Option<Shard>) -> TapId<'a> {
        TapId {
            rank,
            shard,
            ..self
        }
    }

    /// The positions held.
    pub fn pos(&self) -> Range<u32> {
        self.start..self.end
    }

    /// Number of positions (rows) held.
    pub fn rows(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    /// The same tap holding positions `pos` instead.
    pub fn with_pos(self, pos: Range<u32>) -> TapId<'a> {
        TapId {
            start: pos.start,
            end: pos.end,
            ..self
        }
    }

    /// The owned key.
    pub fn to_key(&self) -> Key {
        Key::new(self.stage, self.layer, self.pos())
            .with_slot(self.slot)
            .with_rank(self.rank, self.shard)
    }

    /// The row of a report this tap belongs to.
    pub fn row(&self) -> RowId {
        RowId::new(self.layer, self.stage)
    }
}

impl fmt::Display for TapId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_row(f, self.layer, self.stage)?;
        // Checked: a tree read names its keys before their bounds are
        // known to hold (the error that refuses them names them too).
        if self.start.checked_add(1) == Some(self.end) {
            write!(f, "@{}", self.start)?;
        } else {
            write!(f, "@{}..{}", self.start, self.end)?;
        }
        write_slot(f, self.slot)?;
        match self.rank {
            Some(rank) => write!(f, " rank {rank}"),
            None => Ok(()),
        }
    }
}

/// One (layer, stage) of a forward: a row of a report. `L3/ffn_down`, or
/// `logits` for a stage outside the layers. Serialized as that string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowId {
    /// The layer, or none.
    pub layer: Option<u32>,
    /// The stage name.
    pub stage: String,
}

impl RowId {
    /// The row of `stage` in `layer`.
    pub fn new(layer: Option<u32>, stage: impl Into<String>) -> RowId {
        RowId {
            layer,
            stage: stage.into(),
        }
    }
}

impl fmt::Display for RowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_row(f, self.layer, &self.stage)
    }
}

impl FromStr for RowId {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<RowId, ParseKeyError> {
        let parts = Parts::parse(s)?;
        if parts.pos.is_some() || parts.slot.is_some() || parts.rank.is_some() {
            return Err(ParseKeyError::new(s, "a row names no position or slot"));
        }
        Ok(RowId::new(parts.layer, parts.stage))
    }
}

impl Serialize for RowId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RowId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RowId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A position named on a command line: `L3/ffn_down@2`, `logits@0 slot 1`,
/// or a row without `@pos` (its meaning is the reader's: a whole tap, or
/// its middle position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The layer, or none.
    pub layer: Option<u32>,
    /// The stage name.
    pub stage: String,
    /// The one position, if named.
    pub pos: Option<u32>,
    /// The slot, if named.
    pub slot: Option<u32>,
}

impl Site {
    /// Whether `key` holds this site (any slot when none is named, every
    /// position when none is named).
    pub fn holds(&self, key: &Key) -> bool {
        key.stage == self.stage
            && key.layer == self.layer
            && self.slot.is_none_or(|s| key.slot == Some(s))
            && self.pos.is_none_or(|p| key.pos.contains(&p))
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_row(f, self.layer, &self.stage)?;
        if let Some(p) = self.pos {
            write!(f, "@{p}")?;
        }
        write_slot(f, self.slot)
    }
}

/// Surrounding blanks are ignored and the layer's `L` may be lowercase.
impl FromStr for Site {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Site, ParseKeyError> {
        let parts = Parts::parse(s)?;
        let pos = match parts.pos {
            None => None,
            Some(r) if parts.single => Some(r.start),
            Some(_) => return Err(ParseKeyError::new(s, "a site names one position")),
        };
        Ok(Site {
            layer: parts.layer,
            stage: parts.stage.to_string(),
            pos,
            slot: parts.slot,
        })
    }
}

/// A string that is not a key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {reason}")]
pub struct ParseKeyError {
    /// What was parsed.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ParseKeyError {
    fn new(text: &str, reason: &str) -> ParseKeyError {
        ParseKeyError {
            text: text.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// `L3/ffn_down` or `logits`: the one place a row is spelt.
fn write_row(f: &mut fmt::Formatter<'_>, layer: Option<u32>, stage: &str) -> fmt::Result {
    if let Some(layer) = layer {
        write!(f, "L{layer}/")?;
    }
    f.write_str(stage)
}

fn write_slot(f: &mut fmt::Formatter<'_>, slot: Option<u32>) -> fmt::Result {
    match slot {
        Some(slot) => write!(f, " slot {slot}"),
        None => Ok(()),
    }
}

/// The pieces of `[L<layer>/]<stage>[@<pos>[..<end>]][ slot <n>]`.
struct Parts<'s> {
    layer: Option<u32>,
    stage: &'s str,
    pos: Option<Range<u32>>,
    /// The position was written as one number, not a range.
    single: bool,
    slot: Option<u32>,
    rank: Option<u32>,
}

impl<'s> Parts<'s> {
    fn parse(text: &'s str) -> Result<Parts<'s>, ParseKeyError> {
        let bad = |reason: &str| ParseKeyError::new(text, reason);
        let number = |n: &str, what: &str| -> Result<u32, ParseKeyError> {
            n.trim()
                .parse()
                .map_err(|_| bad(&format!("{what} {:?} is not a number", n.trim())))
        };
        let s = text.trim();
        let (s, rank) = match s.rsplit_once(" rank ") {
            Some((head, n)) => (head, Some(number(n, "rank")?)),
            None => (s, None),
        };
        let (s, slot) = match s.split_once(" slot ") {
            Some((head, n)) => (head, Some(number(n, "slot")?)),
            None => (s, None),
        };
        let (s, pos, single) = match s.split_once('@') {
            Some((head, p)) => match p.split_once("..") {
                Some((x, y)) => (
                    head,
                    Some(number(x, "position")?..number(y, "position")?),
                    false,
                ),
                None => {
                    let p = number(p, "position")?;
                    let end = p
                        .checked_add(1)
                        .ok_or_else(|| bad("position past the last"))?;
                    (head, Some(p..end), true)
                }
            },
            None => (s, None, false),
        };
        let (layer, stage) = match s.split_once('/') {
            Some((l, stage)) => {
                let n = l
                    .strip_prefix('L')
                    .or_else(|| l.strip_prefix('l'))
                    .ok_or_else(|| bad("a layer is written L<n>/"))?;
                (Some(number(n, "layer")?), stage)
            }
            None => (None, s),
        };
        if stage.is_empty() {
            return Err(bad("no stage"));
        }
        Ok(Parts {
            layer,
            stage,
            pos,
            single,
            slot,
            rank,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_and_parse_back() {
        for text in [
            "L3/ffn_down@0..7",
            "final_norm@5 slot 2",
            "logits@0",
            "L0/x@4..5 slot 0",
        ] {
            let key: Key = text.parse().unwrap();
            let back = key.to_string();
            // `@4..5` is one position: printed `@4`.
            assert_eq!(back.parse::<Key>().unwrap(), key, "{text} -> {back}");
        }
        assert_eq!(
            "L3/ffn_down@0..7 slot 2".parse::<Key>().unwrap(),
            Key::new("ffn_down", Some(3), 0..7).with_slot(Some(2))
        );
        assert_eq!(Key::new("x", Some(0), 4..5).to_string(), "L0/x@4");
        assert!("L3/ffn_down".parse::<Key>().is_err());
        let ranked: Key = "L5/o_proj_partial@0..7 rank 1".parse().unwrap();
        assert_eq!(ranked.rank, Some(1));
        assert_eq!(ranked.to_string(), "L5/o_proj_partial@0..7 rank 1");
        assert!("L5/x@0 rank q".parse::<Key>().is_err());
    }

    #[test]
    fn shards_print_and_parse_back() {
        let s = Shard {
            axis: 1,
            start: 64,
            end: 320,
            full: 576,
        };
        assert_eq!(s.to_string(), "1:64-320/576");
        assert_eq!(s.to_string().parse::<Shard>().unwrap(), s);
        for bad in ["", "1:64-320", "1:64/576", "x:0-1/2", "1-0:1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn rows_and_sites_parse_as_the_cli_writes_them() {
        let row: RowId = "L3/ffn_down".parse().unwrap();
        assert_eq!(row, RowId::new(Some(3), "ffn_down"));
        assert_eq!(row.to_string(), "L3/ffn_down");
        assert_eq!(
            "logits".parse::<RowId>().unwrap(),
            RowId::new(None, "logits")
        );
        assert!("L3/ffn_down@2".parse::<RowId>().is_err());
        let site: Site = " l3/ffn_down@2 slot 1 ".parse().unwrap();
        assert_eq!(
            site,
            Site {
                layer: Some(3),
                stage: "ffn_down".into(),
                pos: Some(2),
                slot: Some(1)
            }
        );
        assert_eq!(site.to_string(), "L3/ffn_down@2 slot 1");
        for bad in [
            "",
            "L/x@1",
            "Lx/y",
            "M3/x",
            "L3/",
            "x@a",
            "x@1..3",
            "x@1 slot q",
        ] {
            assert!(bad.parse::<Site>().is_err(), "{bad:?} parsed");
        }
    }

    /// A key at the last position a `u32` holds prints its range as it is
    /// (its end one past it wraps to 0): the bounds check that refuses it
    /// names it, and `end == start + 1` overflowed there (wrapped in a
    /// release build, printing `@4294967295`). A position named on a
    /// command line cannot be that one.
    #[test]
    fn keys_at_the_last_position_print_and_parse_without_overflow() {
        // The wrapped range as a hostile tree holds it (a literal
        // `u32::MAX..0` is refused by the lint against reversed ranges).
        let wrapped = std::ops::Range {
            start: u32::MAX,
            end: 0,
        };
        let key = Key::new("x", Some(0), wrapped);
        assert_eq!(key.to_string(), "L0/x@4294967295..0");
        let last = Key::new("x", None, u32::MAX - 1..u32::MAX);
        assert_eq!(last.to_string(), "x@4294967294");
        assert!("x@4294967295".parse::<Site>().is_err());
        assert!("x@4294967295".parse::<Key>().is_err());
        assert_eq!(
            "x@4294967294".parse::<Site>().unwrap().pos,
            Some(u32::MAX - 1)
        );
    }

    #[test]
    fn tap_ids_are_keys_borrowed() {
        let key = Key::new("attn", Some(1), 2..5).with_slot(Some(0));
        let id = key.id();
        assert_eq!(id.to_key(), key);
        assert_eq!(id.to_string(), key.to_string());
        assert_eq!(id.rows(), 3);
        assert_eq!(id.row().to_string(), "L1/attn");
        assert_eq!(id.with_pos(3..4).to_string(), "L1/attn@3 slot 0");
    }
}
