//! A tree's entries as a reader of many taps wants them: field by field,
//! from owned entries or straight from an index's records
//! ([`crate::index::Records`]), an owned [`Entry`] built only where asked.

use crate::dtype::DType;
use crate::index::Records;
use crate::manifest::Entry;
use std::borrow::Cow;
use std::ops::Range;

/// A tree's entries in capture order: owned, or an index's records.
#[derive(Clone, Copy, Debug)]
pub enum Entries<'a> {
    /// Owned entries (a manifest parsed or decoded whole).
    Owned(&'a [Entry]),
    /// A sound index's records, read in place.
    Records(&'a Records),
}

/// A tap's shape: owned dimensions, or an index's (8 little-endian bytes each).
#[derive(Clone, Copy, Debug)]
pub enum Dims<'a> {
    /// Owned dimensions.
    Owned(&'a [usize]),
    /// An index's dimensions.
    Raw(&'a [u8]),
}

impl Dims<'_> {
    /// How many dimensions.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Dims::Owned(d) => d.len(),
            Dims::Raw(b) => b.len() / 8,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimension `k`.
    #[inline]
    pub fn get(&self, k: usize) -> Option<usize> {
        match self {
            Dims::Owned(d) => d.get(k).copied(),
            Dims::Raw(b) => b.get(k * 8..k * 8 + 8).map(|d| {
                let d = u64::from_le_bytes(d.try_into().expect("8 bytes"));
                usize::try_from(d).unwrap_or(usize::MAX)
            }),
        }
    }

    /// The dimensions from `k` on.
    #[inline]
    pub fn from(self, k: usize) -> Self {
        match self {
            Dims::Owned(d) => Dims::Owned(d.get(k..).unwrap_or(&[])),
            Dims::Raw(b) => Dims::Raw(b.get(k * 8..).unwrap_or(&[])),
        }
    }

    /// The dimensions in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).map(|k| self.get(k).expect("in range"))
    }

    /// The dimensions, owned.
    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }
}

impl PartialEq for Dims<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Dims::Owned(a), Dims::Owned(b)) => a == b,
            (Dims::Raw(a), Dims::Raw(b)) => a == b,
            _ => self.len() == other.len() && self.iter().eq(other.iter()),
        }
    }
}

impl<'a> Entries<'a> {
    /// How many taps.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Entries::Owned(e) => e.len(),
            Entries::Records(r) => r.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tap `i`'s stage.
    #[inline]
    pub fn stage(&self, i: usize) -> &'a str {
        match *self {
            Entries::Owned(e) => &e[i].key.stage,
            Entries::Records(r) => r.stage(i),
        }
    }

    /// Tap `i`'s layer.
    #[inline]
    pub fn layer(&self, i: usize) -> Option<u32> {
        match self {
            Entries::Owned(e) => e[i].key.layer,
            Entries::Records(r) => r.layer(i),
        }
    }

    /// Tap `i`'s positions.
    #[inline]
    pub fn pos(&self, i: usize) -> Range<u32> {
        match self {
            Entries::Owned(e) => e[i].key.pos.clone(),
            Entries::Records(r) => r.pos(i),
        }
    }

    /// Tap `i`'s slot.
    #[inline]
    pub fn slot(&self, i: usize) -> Option<u32> {
        match self {
            Entries::Owned(e) => e[i].key.slot,
            Entries::Records(r) => r.slot(i),
        }
    }

    /// Tap `i`'s number of positions.
    #[inline]
    pub fn rows(&self, i: usize) -> u32 {
        let pos = self.pos(i);
        pos.end.saturating_sub(pos.start)
    }

    /// Tap `i`'s element type.
    #[inline]
    pub fn dtype(&self, i: usize) -> DType {
        match self {
            Entries::Owned(e) => e[i].dtype,
            Entries::Records(r) => r.dtype(i),
        }
    }

    /// Tap `i`'s shape.
    #[inline]
    pub fn shape(&self, i: usize) -> Dims<'a> {
        match *self {
            Entries::Owned(e) => Dims::Owned(&e[i].shape),
            Entries::Records(r) => Dims::Raw(r.dims(i)),
        }
    }

    /// Tap `i`'s tensor bytes.
    #[inline]
    pub fn bytes(&self, i: usize) -> u64 {
        match self {
            Entries::Owned(e) => e[i].bytes,
            Entries::Records(r) => r.bytes(i),
        }
    }

    /// All taps' tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        match self {
            Entries::Owned(e) => e.iter().map(|e| e.bytes).fold(0, u64::saturating_add),
            Entries::Records(r) => r.total_bytes(),
        }
    }

    /// Whether tap `i` has the same tensor hash as `other`'s tap `j`.
    pub fn same_hash(&self, i: usize, other: &Entries, j: usize) -> bool {
        match (self, other) {
            (Entries::Owned(a), Entries::Owned(b)) => a[i].blake3 == b[j].blake3,
            (Entries::Records(a), Entries::Records(b)) => a.blake3(i) == b.blake3(j),
            (Entries::Owned(e), Entries::Records(r)) | (Entries::Records(r), Entries::Owned(e)) => {
                let (e, k) = if matches!(self, Entries::Owned(_)) {
                    (&e[i], j)
                } else {
                    (&e[j], i)
                };
                let mut hex = [0u8; 64];
                crate::index::hex_into(&mut hex, r.blake3(k));
                e.blake3.as_bytes() == hex
            }
        }
    }

    /// Whether tap `i` has the same key as `other`'s tap `j` (an index's
    /// records have neither rank nor shard).
    pub fn same_key(&self, i: usize, other: &Entries, j: usize) -> bool {
        if let (Entries::Owned(a), Entries::Owned(b)) = (self, other) {
            return a[i].key == b[j].key;
        }
        let unranked = |t: &Entries, k: usize| match t {
            Entries::Owned(e) => e[k].key.rank.is_none() && e[k].key.shard.is_none(),
            Entries::Records(_) => true,
        };
        unranked(self, i)
            && unranked(other, j)
            && self.stage(i) == other.stage(j)
            && self.layer(i) == other.layer(j)
            && self.pos(i) == other.pos(j)
            && self.slot(i) == other.slot(j)
    }

    /// Tap `i` as an entry: borrowed where owned, built from its record
    /// otherwise.
    pub fn entry(&self, i: usize) -> Cow<'a, Entry> {
        match *self {
            Entries::Owned(e) => Cow::Borrowed(&e[i]),
            Entries::Records(r) => Cow::Owned(r.entry(i)),
        }
    }
}
