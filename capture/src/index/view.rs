//! An index's records read where they lie: a tree opened without building
//! an owned entry per tap. [`open_views`] proves the records sound on the
//! records themselves (every check the owned path makes: the decode's, each
//! entry's bounds, shape and byte count, no key twice, the directory hashes
//! and root recomputed from the records' fields); where anything is in
//! doubt it gives up, and the owned path opens the tree (and names the
//! error) as it always did.

use super::head::{hex_into, u32_at, u64_at, IndexHead};
use super::records::{body, check_record, dtype_of, shape_of, Rec};
use super::{HAS_LAYER, HAS_SLOT, HEAD_LEN, RECORD_LEN};
use crate::dtype::DType;
use crate::key_hash::KeyHasher;
use crate::manifest::{self, Entry, Manifest};
use crate::open::FileBytes;
use rayon::prelude::*;
use std::ops::Range;
use std::path::Path;

/// A sound index's records, read in place: the fields of tap `i` without
/// an owned [`Entry`] (one is built by [`Records::entry`] where needed).
/// The index's bytes are a copy read when the tree was opened, the ones
/// its checks were made on.
pub struct Records {
    bytes: FileBytes,
    /// Where the records and the dimensions lie in `bytes`.
    records: Range<usize>,
    dims: Range<usize>,
    /// The body's strings (stage names: every record's path is its
    /// writer's own, or the records are not opened as views).
    strings: Vec<String>,
    taps: usize,
    total: u64,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records").field("taps", &self.taps).finish()
    }
}

impl Records {
    #[inline]
    fn record(&self, i: usize) -> &[u8] {
        let at = self.records.start + i * RECORD_LEN;
        &self.bytes[at..at + RECORD_LEN]
    }

    fn checked<'s>(&'s self, i: usize, strings: &[&'s str]) -> Rec<'s> {
        check_record(i, self.record(i), &self.bytes[self.dims.clone()], strings)
            .expect("every record was checked when the tree was opened")
    }

    fn strs(&self) -> Vec<&str> {
        self.strings.iter().map(String::as_str).collect()
    }

    /// How many taps.
    #[inline]
    pub fn len(&self) -> usize {
        self.taps
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.taps == 0
    }

    /// The taps' total tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Tap `i`'s stage.
    #[inline]
    pub fn stage(&self, i: usize) -> &str {
        &self.strings[u32_at(self.record(i), 0) as usize]
    }

    /// Tap `i`'s layer.
    #[inline]
    pub fn layer(&self, i: usize) -> Option<u32> {
        let r = self.record(i);
        (flags(r) & HAS_LAYER != 0).then(|| u32_at(r, 4))
    }

    /// Tap `i`'s positions.
    #[inline]
    pub fn pos(&self, i: usize) -> Range<u32> {
        let r = self.record(i);
        u32_at(r, 8)..u32_at(r, 12)
    }

    /// Tap `i`'s slot.
    #[inline]
    pub fn slot(&self, i: usize) -> Option<u32> {
        let r = self.record(i);
        (flags(r) & HAS_SLOT != 0).then(|| u32_at(r, 16))
    }

    /// Tap `i`'s element type.
    #[inline]
    pub fn dtype(&self, i: usize) -> DType {
        dtype_of(self.record(i)[20]).expect("every record was checked when the tree was opened")
    }

    /// Tap `i`'s shape, 8 little-endian bytes per dimension.
    #[inline]
    pub fn dims(&self, i: usize) -> &[u8] {
        let r = self.record(i);
        let (at, n) = (u32_at(r, 24) as usize, r[21] as usize);
        &self.bytes[self.dims.start + at * 8..self.dims.start + (at + n) * 8]
    }

    /// Tap `i`'s tensor bytes.
    #[inline]
    pub fn bytes(&self, i: usize) -> u64 {
        u64_at(self.record(i), 32)
    }

    /// Tap `i`'s tensor hash, raw.
    #[inline]
    pub fn blake3(&self, i: usize) -> &[u8; 32] {
        self.record(i)[40..72].try_into().expect("32 bytes")
    }

    /// Tap `i` as an owned entry (what the owned path decodes).
    pub fn entry(&self, i: usize) -> Entry {
        self.checked(i, &self.strs()).entry()
    }

    /// Every tap as an owned entry, decoded on every core.
    pub fn entries(&self) -> Vec<Entry> {
        let (mut all, strings) = (Vec::new(), self.strs());
        (0..self.taps)
            .into_par_iter()
            .map(|i| self.checked(i, &strings).entry())
            .collect_into_vec(&mut all);
        all
    }
}

#[inline]
fn flags(r: &[u8]) -> u16 {
    u16::from_le_bytes([r[22], r[23]])
}

/// The largest index read whole into memory at open (4 GiB: some 40
/// million taps).
const MOST_READ: u64 = 4 << 30;

/// The manifest of the tree at `tree` (its fields besides the entries; the
/// entries left empty) and its index's records, where everything the owned
/// path ([`super::open_manifest`], then the entries' checks) would accept
/// is proven on the records themselves and the taps and bytes are `counts`
/// where the manifest's head gives them. `None` on any doubt: the caller
/// opens the tree the owned way, which gives today's error if there is one.
pub(crate) fn open_views(
    tree: &Path,
    json: &[u8],
    counts: (Option<u64>, Option<u64>),
) -> Option<(Manifest, Records)> {
    let (m, records) = open_views_unsealed(tree, json, counts)?;
    hashes_hold(&records, &m).then_some((m, records))
}

/// [`open_views`] but its last check, [`hashes_hold`]: until that passes,
/// nothing binds the records to the manifest's root (they are sound as
/// records, but may not be this tree's).
pub(crate) fn open_views_unsealed(
    tree: &Path,
    json: &[u8],
    counts: (Option<u64>, Option<u64>),
) -> Option<(Manifest, Records)> {
    let mut file = super::open_index(tree).ok()?;
    // Read, not mapped: the records are read again for as long as the tree
    // is open, so they must be the bytes proven here, whatever happens to
    // the file later (a mapping would show a rewrite, or fault on a file
    // cut short). Read whole only at the size its head gives it.
    let mut first = [0u8; HEAD_LEN];
    let n = super::read_up_to(&mut file, &mut first).ok()?;
    let len = IndexHead::parse(&first[..n])
        .ok()?
        .body_len
        .checked_add(HEAD_LEN as u64)?;
    // A head claiming more than any real index (a few MB for 37,000 taps)
    // is not read into memory here: the owned path decides.
    if len > MOST_READ {
        return None;
    }
    let index = FileBytes::Read(crate::open::read_whole_on_every_core(&file, len).ok()?);
    let (head, m) = super::open_head(tree, &index, json).ok()?;
    let (records, dims, strings) = {
        let b = body(&index, &head).ok()?;
        let at = |s: &[u8]| s.as_ptr() as usize - index.as_ptr() as usize;
        let records = at(b.records)..at(b.records) + b.records.len();
        let dims = HEAD_LEN + b.records.len()..HEAD_LEN + b.records.len() + b.dims.len();
        let strings: Vec<String> = b.strings.iter().map(|s| s.to_string()).collect();
        (records, dims, strings)
    };
    let mut records = Records {
        bytes: index,
        records,
        dims,
        strings,
        taps: usize::try_from(head.taps).ok()?,
        total: 0,
    };
    records.total = sound(&records)?;
    let actual = (records.taps as u64, records.total);
    if let (Some(taps), Some(bytes)) = counts {
        if (taps, bytes) != actual {
            return None;
        }
    }
    Some((m, records))
}

/// Whether the directory hashes and root recomputed from `records` are the
/// ones `m` records: what makes the records the tree's.
pub(crate) fn hashes_hold(records: &Records, m: &Manifest) -> bool {
    let (dirs, root) = hashes(records, m);
    dirs == m.dirs && root == m.root
}

/// The records' total bytes if every record passes the decode's checks
/// and the owned entries' checks would pass (each entry's key bounds, its
/// path its writer's own, its byte count its shape's, axis 0 its
/// positions; the sums of positions and bytes; no key twice).
fn sound(r: &Records) -> Option<u64> {
    let dims = &r.bytes[r.dims.clone()];
    let strings: Vec<&str> = r.strings.iter().map(String::as_str).collect();
    let one = |i: usize| -> Option<(u64, u128)> {
        let rec = check_record(i, r.record(i), dims, &strings).ok()?;
        if rec.path.is_some() || manifest::check_key_bounds(rec.layer, &rec.pos).is_err() {
            return None;
        }
        let mut elements: usize = 1;
        for d in shape_of(rec.dims) {
            elements = elements.checked_mul(usize::try_from(d).ok()?)?;
        }
        let bytes = elements.checked_mul(rec.dtype.size())?;
        let rows = rec.pos.end - rec.pos.start;
        let first = shape_of(rec.dims).next();
        (bytes as u64 == rec.bytes && first == Some(u64::from(rows)))
            .then_some((u64::from(rows), u128::from(rec.bytes)))
    };
    let (sums, unique) = rayon::join(
        || {
            (0..r.taps)
                .into_par_iter()
                .map(one)
                .try_reduce(|| (0, 0), |a, b| Some((a.0 + b.0, a.1 + b.1)))
        },
        || no_key_twice(r, &strings),
    );
    let (rows, bytes) = sums.filter(|_| unique)?;
    (rows <= u64::from(manifest::MAX_POSITION))
        .then(|| u64::try_from(bytes).ok())
        .flatten()
}

/// Whether no two records have one key (stage by its text: a string table
/// may hold one text twice), found from the keys' 64-bit hashes sorted on
/// every core: two equal hashes are a doubt (the owned path, which
/// compares the keys themselves, decides), so a collision costs only time.
fn no_key_twice(r: &Records, strings: &[&str]) -> bool {
    // Each string's number, as that of the first string with its text.
    let mut first: std::collections::HashMap<&str, u64> = Default::default();
    let canon: Vec<u64> = (strings.iter().enumerate())
        .map(|(i, s)| *first.entry(s).or_insert(i as u64))
        .collect();
    let mut hashes: Vec<u64> = Vec::new();
    (0..r.taps)
        .into_par_iter()
        .map(|i| {
            let rec = r.record(i);
            let stage = canon
                .get(u32_at(rec, 0) as usize)
                .copied()
                .unwrap_or(u64::MAX);
            let opt = |v: Option<u32>| v.map_or(1 << 32, u64::from);
            let pos = r.pos(i);
            let words = [
                stage,
                opt(r.layer(i)),
                opt(r.slot(i)),
                u64::from(pos.start) << 32 | u64::from(pos.end),
            ];
            KeyHasher::of_words(&words)
        })
        .collect_into_vec(&mut hashes);
    hashes.par_sort_unstable();
    hashes.windows(2).all(|w| w[0] != w[1])
}

/// The directory hashes and root of the records, by the format 2 rule.
fn hashes(r: &Records, m: &Manifest) -> (std::collections::BTreeMap<String, String>, String) {
    crate::hashes::tree_hashes_by(
        r.taps,
        |i| r.layer(i),
        |out, i| {
            let pos = r.pos(i);
            crate::hashes::line_fields(
                out,
                r.stage(i),
                (r.layer(i), &pos, r.slot(i)),
                r.dtype(i),
                shape_of(r.dims(i)),
            );
            // The tap's hash in hex straight into the line.
            let at = out.len();
            out.resize(at + 64, 0);
            let hex: &mut [u8; 64] = (&mut out[at..]).try_into().expect("64 bytes");
            hex_into(hex, r.blake3(i));
            out.push(b'\n');
        },
        &m.verdict_inputs(),
    )
}
