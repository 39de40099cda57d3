//! Step 3, read: each matched segment judged from the manifests first
//! (equal by hash, not comparable, or to be read), then the ones to be read
//! read in parallel and compared position by position. The truth is read
//! later, and only where a row's report uses it ([`truth_pair`]: its worst
//! position).
//! A tap that cannot be read makes its segment [`SegState::Unreadable`]:
//! reported and counted, not the end of the diff.

use super::index::{Loc, PosKey};
use super::merge::Segment;
use super::Options;
use crate::metrics::{compare, Acc};
use crate::report::Reason;
use crate::tree::{Tensor, Tree};
use capture::{Entry, Manifest};
use rayon::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// What became of a segment.
pub(crate) enum SegState {
    /// Equal by hash, never read: `n` elements per position.
    Skipped(u64),
    /// Read, or not comparable (`mismatch`): one result per position.
    Compared {
        mismatch: Option<Reason>,
        results: Vec<Computed>,
    },
    /// A tap of A or B could not be read: why.
    Unreadable(crate::report::Unreadable),
}

/// A position's A-vs-B accumulator.
pub(crate) type Computed = Acc;

/// What the read step did, for the report's counts.
#[derive(Default)]
pub(crate) struct ReadCounts {
    pub(crate) taps_skipped: u64,
    pub(crate) taps_compared: u64,
    pub(crate) bytes_read: u64,
}

/// The truth, indexed by position, and where its inputs part from A's.
pub(crate) struct Truth<'t> {
    pub(crate) tree: &'t dyn Tree,
    pub(crate) index: HashMap<PosKey, Loc>,
    /// Per slot, the first position the truth was fed other tokens than A.
    pub(crate) split: HashMap<Option<u32>, u32>,
}

pub(crate) fn row_elems(e: &Entry) -> usize {
    let rows = e.shape.first().copied().unwrap_or(1).max(1);
    e.shape.iter().product::<usize>() / rows
}

fn row_bytes<'t>(t: &'t Tensor, e: &Entry, row: usize) -> &'t [u8] {
    let len = row_elems(e) * e.dtype.size();
    &t.bytes()[row * len..(row + 1) * len]
}

/// Why two taps cannot be compared element for element, if they cannot.
fn mismatch(a: &Entry, b: &Entry) -> Option<Reason> {
    let (sa, sb) = (
        a.shape.get(1..).unwrap_or(&[]),
        b.shape.get(1..).unwrap_or(&[]),
    );
    if sa != sb {
        Some(Reason::ShapeMismatch {
            a: sa.to_vec(),
            b: sb.to_vec(),
        })
    } else if a.dtype != b.dtype && !(a.dtype.is_float() && b.dtype.is_float()) {
        // Float dtypes compare in f64 (an f64 tree against an f32 one).
        Some(Reason::DtypeMismatch {
            a: a.dtype,
            b: b.dtype,
        })
    } else {
        None
    }
}

/// Judges every segment and reads the ones that need it: one state per
/// segment of `matched`.
pub(crate) fn read(
    (a, b): (&dyn Tree, &dyn Tree),
    matched: &[Segment],
    picking: bool,
    opts: &Options,
) -> (Vec<SegState>, ReadCounts) {
    let (ma, mb) = (a.manifest(), b.manifest());
    // Directories whose hashes agree hold only equal taps: skipped wholesale.
    let equal_dirs: BTreeSet<&str> = capture::compare::equal_dirs(ma, mb);
    let equal_by_hash = |ea: &Entry, eb: &Entry| {
        ea.key.pos == eb.key.pos
            && ea.dtype == eb.dtype
            && ea.shape == eb.shape
            && (ea.blake3 == eb.blake3
                || (!picking && ea.key == eb.key && equal_dirs.contains(ea.dir().as_str())))
    };
    // Each segment judged from the manifests (on every core): equal by
    // hash, to be read (and why it is not comparable, if it is not), or
    // not comparable at all.
    enum Judged {
        Skipped(u64),
        Read(Option<Reason>),
        Apart(Reason),
    }
    let judged: Vec<Judged> = matched
        .par_iter()
        .map(|seg| {
            let (ea, eb) = (&ma.entries[seg.a.entry()], &mb.entries[seg.b.entry()]);
            match mismatch(ea, eb) {
                // Same element count per row: the metrics still say something.
                Some(why) if row_elems(ea) == row_elems(eb) => Judged::Read(Some(why)),
                Some(why) => Judged::Apart(why),
                None if equal_by_hash(ea, eb) => Judged::Skipped(row_elems(ea) as u64),
                None => Judged::Read(None),
            }
        })
        .collect();
    // `to_read`: segment, why not comparable.
    let mut states: Vec<Option<SegState>> = Vec::with_capacity(matched.len());
    let mut to_read: Vec<(usize, Option<Reason>)> = Vec::new();
    let mut skipped_taps = vec![false; ma.entries.len()];
    let mut compared_taps = vec![false; ma.entries.len()];
    for (i, (seg, judged)) in matched.iter().zip(judged).enumerate() {
        match judged {
            Judged::Skipped(n) => {
                skipped_taps[seg.a.entry()] = true;
                states.push(Some(SegState::Skipped(n)));
            }
            Judged::Read(why) => {
                compared_taps[seg.a.entry()] = true;
                to_read.push((i, why));
                states.push(None);
            }
            Judged::Apart(why) => {
                compared_taps[seg.a.entry()] = true;
                states.push(Some(SegState::Compared {
                    mismatch: Some(why),
                    results: (0..seg.len).map(|_| Acc::default()).collect(),
                }));
            }
        }
    }
    // Two taps overlap in one run of positions: each pair is one segment,
    // read once.
    let total: u64 = to_read
        .iter()
        .map(|&(i, _)| {
            ma.entries[matched[i].a.entry()].bytes + mb.entries[matched[i].b.entry()].bytes
        })
        .sum();
    if let Some(p) = opts.progress {
        p.start(total);
    }
    let computed: Vec<Result<Vec<Computed>, capture::Error>> = to_read
        .par_iter()
        .map(|&(i, _)| {
            let seg = &matched[i];
            let out = compare_segment((a, b), seg);
            if let Some(p) = opts.progress {
                let (ea, eb) = (&ma.entries[seg.a.entry()], &mb.entries[seg.b.entry()]);
                p.advance(ea.bytes + eb.bytes);
            }
            out
        })
        .collect();
    if let Some(p) = opts.progress {
        p.finish();
    }
    for ((i, why), results) in to_read.into_iter().zip(computed) {
        states[i] = Some(match results {
            Ok(results) => SegState::Compared {
                mismatch: why,
                results,
            },
            Err(e) => SegState::Unreadable(std::sync::Arc::new(e)),
        });
    }
    let states = states
        .into_iter()
        .map(|s| s.expect("every segment judged or read"))
        .collect();
    let counts = ReadCounts {
        taps_skipped: skipped_taps
            .iter()
            .zip(&compared_taps)
            .filter(|(s, c)| **s && !**c)
            .count() as u64,
        taps_compared: compared_taps.iter().filter(|c| **c).count() as u64,
        bytes_read: total,
    };
    (states, counts)
}

/// Reads one segment's taps and compares them position by position.
fn compare_segment(
    (a, b): (&dyn Tree, &dyn Tree),
    seg: &Segment,
) -> Result<Vec<Computed>, capture::Error> {
    let (ma, mb): (&Manifest, &Manifest) = (a.manifest(), b.manifest());
    let (ea, eb) = (&ma.entries[seg.a.entry()], &mb.entries[seg.b.entry()]);
    let (ta, tb) = (a.read(seg.a.entry())?, b.read(seg.b.entry())?);
    Ok((0..seg.len)
        .map(|j| {
            compare(
                row_bytes(&ta, ea, (seg.a.row + j) as usize),
                ea.dtype,
                row_bytes(&tb, eb, (seg.b.row + j) as usize),
                eb.dtype,
            )
        })
        .collect())
}

/// (T-vs-A, T-vs-B) at position `j` of a compared segment: `None` where the
/// truth has no such tap, was fed other tokens than A by then, or its rows
/// (or A's and B's) do not hold as many elements. Reads the three taps.
pub(crate) fn truth_pair(
    (a, b): (&dyn Tree, &dyn Tree),
    t: &Truth,
    seg: &Segment,
    j: u32,
) -> Result<Option<(Acc, Acc)>, capture::Error> {
    let k = seg.key(j);
    if t.split.get(&k.2).is_some_and(|&at| k.3 >= at) {
        return Ok(None);
    }
    let Some(lt) = t
        .index
        .get(&k)
        .or_else(|| t.index.get(&(k.0, k.1, None, k.3)))
    else {
        return Ok(None);
    };
    let (ea, eb) = (
        &a.manifest().entries[seg.a.entry()],
        &b.manifest().entries[seg.b.entry()],
    );
    let et = &t.tree.manifest().entries[lt.entry()];
    if row_elems(ea) != row_elems(eb) || row_elems(et) != row_elems(ea) {
        return Ok(None);
    }
    let (ta, tb, tt) = (
        a.read(seg.a.entry())?,
        b.read(seg.b.entry())?,
        t.tree.read(lt.entry())?,
    );
    let ra = row_bytes(&ta, ea, (seg.a.row + j) as usize);
    let rb = row_bytes(&tb, eb, (seg.b.row + j) as usize);
    let rt = row_bytes(&tt, et, lt.row());
    Ok(Some((
        compare(rt, et.dtype, ra, ea.dtype),
        compare(rt, et.dtype, rb, eb.dtype),
    )))
}
