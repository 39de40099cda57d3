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
use capture::{DType, Dims, Entries};
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

/// Tap `i` of a tree's entries `l`.
#[derive(Clone, Copy)]
struct At<'a>(Entries<'a>, usize);

impl At<'_> {
    fn shape(&self) -> Dims<'_> {
        self.0.shape(self.1)
    }

    fn dtype(&self) -> DType {
        self.0.dtype(self.1)
    }
}

fn row_elems(shape: Dims) -> usize {
    let rows = shape.get(0).unwrap_or(1).max(1);
    shape.iter().product::<usize>() / rows
}

fn row_bytes<'t>(t: &'t Tensor, e: At, row: usize) -> &'t [u8] {
    let len = row_elems(e.shape()) * e.dtype().size();
    &t.bytes()[row * len..(row + 1) * len]
}

/// Why two taps cannot be compared element for element, if they cannot.
fn mismatch(a: At, b: At) -> Option<Reason> {
    let (sa, sb) = (a.shape().from(1), b.shape().from(1));
    let (da, db) = (a.dtype(), b.dtype());
    if sa != sb {
        Some(Reason::ShapeMismatch {
            a: sa.to_vec(),
            b: sb.to_vec(),
        })
    } else if da != db && !(da.is_float() && db.is_float()) {
        // Float dtypes compare in f64 (an f64 tree against an f32 one).
        Some(Reason::DtypeMismatch { a: da, b: db })
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
    let (la, lb) = (a.listing(), b.listing());
    // Directories whose hashes agree hold only equal taps: skipped wholesale.
    let equal_dirs: BTreeSet<&str> = capture::compare::equal_dirs(a.head(), b.head());
    let equal_by_hash = |ea: At, eb: At| {
        let (i, j) = (ea.1, eb.1);
        la.pos(i) == lb.pos(j)
            && ea.dtype() == eb.dtype()
            && ea.shape() == eb.shape()
            && (la.same_hash(i, &lb, j)
                || (!picking
                    && la.same_key(i, &lb, j)
                    && equal_dirs.contains(capture::manifest::dir_of_layer(la.layer(i)).as_str())))
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
            let (ea, eb) = (At(la, seg.a.entry()), At(lb, seg.b.entry()));
            match mismatch(ea, eb) {
                // Same element count per row: the metrics still say something.
                Some(why) if row_elems(ea.shape()) == row_elems(eb.shape()) => {
                    Judged::Read(Some(why))
                }
                Some(why) => Judged::Apart(why),
                None if equal_by_hash(ea, eb) => Judged::Skipped(row_elems(ea.shape()) as u64),
                None => Judged::Read(None),
            }
        })
        .collect();
    // Which taps of A were skipped and which compared (one pass: two
    // flags a tap), and the segments to read with why they are not
    // comparable, if they are not.
    let mut skipped_taps = vec![false; la.len()];
    let mut compared_taps = vec![false; la.len()];
    let mut to_read: Vec<(usize, Option<Reason>)> = Vec::new();
    for (i, (seg, judged)) in matched.iter().zip(&judged).enumerate() {
        match judged {
            Judged::Skipped(_) => skipped_taps[seg.a.entry()] = true,
            Judged::Read(why) => {
                compared_taps[seg.a.entry()] = true;
                to_read.push((i, why.clone()));
            }
            Judged::Apart(_) => compared_taps[seg.a.entry()] = true,
        }
    }
    // One state per segment, built on every core (a state a segment, the
    // most memory the walk touches: its pages are faulted in side by
    // side); those to read are filled in below.
    let mut states: Vec<Option<SegState>> = Vec::new();
    judged
        .into_par_iter()
        .zip(matched.par_iter())
        .map(|(judged, seg)| match judged {
            Judged::Skipped(n) => Some(SegState::Skipped(n)),
            Judged::Read(_) => None,
            Judged::Apart(why) => Some(SegState::Compared {
                mismatch: Some(why),
                results: (0..seg.len).map(|_| Acc::default()).collect(),
            }),
        })
        .collect_into_vec(&mut states);
    // Two taps overlap in one run of positions: each pair is one segment,
    // read once.
    let total: u64 = to_read
        .iter()
        .map(|&(i, _)| la.bytes(matched[i].a.entry()) + lb.bytes(matched[i].b.entry()))
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
                p.advance(la.bytes(seg.a.entry()) + lb.bytes(seg.b.entry()));
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
    let (ea, eb) = (
        At(a.listing(), seg.a.entry()),
        At(b.listing(), seg.b.entry()),
    );
    let (ta, tb) = (a.read(seg.a.entry())?, b.read(seg.b.entry())?);
    Ok((0..seg.len)
        .map(|j| {
            compare(
                row_bytes(&ta, ea, (seg.a.row + j) as usize),
                ea.dtype(),
                row_bytes(&tb, eb, (seg.b.row + j) as usize),
                eb.dtype(),
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
        At(a.listing(), seg.a.entry()),
        At(b.listing(), seg.b.entry()),
    );
    let et = At(t.tree.listing(), lt.entry());
    let (na, nb, nt) = (
        row_elems(ea.shape()),
        row_elems(eb.shape()),
        row_elems(et.shape()),
    );
    if na != nb || nt != na {
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
        compare(rt, et.dtype(), ra, ea.dtype()),
        compare(rt, et.dtype(), rb, eb.dtype()),
    )))
}
