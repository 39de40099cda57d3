//! Walking two trees, step by step: `index` each tree's taps, `merge`
//! the two indexes into runs of positions both hold, `read` what the
//! hashes cannot settle, `judge` each (layer, stage) into a row; then the
//! rows in forward order, with causes and growth, go to a [`Visit`]
//! delegate. [`diff`] records them into a [`DiffReport`].

mod index;
mod judge;
mod merge;
pub(crate) mod outcome;
mod read;
pub mod visit;

use crate::graph::StageGraph;
use crate::report::{Counts, DiffReport, Row};
use crate::tolerance::Tolerance;
use crate::tree::Tree;
use crate::{divergence, Error};
use capture::{Manifest, TapId};
use index::{PosKey, Positions, Stages};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
pub use visit::{Action, Change, Recorder, Side, Visit, Walked};

/// A row: (layer, stage name).
type RowKey = (Option<u32>, String);

/// How to compare.
#[derive(Default)]
pub struct Options<'p> {
    /// When two positions agree.
    pub tolerance: Tolerance,
    /// Compare only this slot of A (`Some(None)`: the taps without a slot)
    /// against `slot_b` of B, whatever their slot numbers.
    pub slot_a: Option<Option<u32>>,
    /// The slot of B compared with `slot_a`.
    pub slot_b: Option<Option<u32>>,
    /// Compare every position, also past the one where the runs' input
    /// tokens part (by default those are left out: they compute different
    /// things). For probes that a different input must diverge.
    pub all_positions: bool,
    /// Told how many tensor bytes are to be read, then each read as it ends.
    pub progress: Option<&'p (dyn Progress + Sync)>,
    /// Compare only the taps both trees hold: taps in one tree only do not
    /// make the outcome diverged (by default they do: a missing layer is
    /// never agreement).
    pub common_only: bool,
}

/// Progress of the metric pass (the CLI draws a bar; the library draws nothing).
pub trait Progress {
    /// The bytes to be read in all.
    fn start(&self, total_bytes: u64);
    /// `bytes` more were read.
    fn advance(&self, bytes: u64);
    /// The pass ended.
    fn finish(&self);
}

/// Compares `a` with `b` (and, for red rows, both with `truth`).
pub fn diff(
    a: &dyn Tree,
    b: &dyn Tree,
    truth: Option<&dyn Tree>,
    opts: &Options,
) -> Result<DiffReport, Error> {
    let mut recorder = Recorder::default();
    let walked = walk(a, b, truth, opts, &mut recorder)?;
    crate::timing::mark("walked");
    let report = recorder.report(walked, (a, b, truth), opts);
    crate::timing::mark("report");
    Ok(report)
}

/// Walks `a` against `b` (and `truth`), emitting what it finds to `delegate`.
pub fn walk(
    a: &dyn Tree,
    b: &dyn Tree,
    truth: Option<&dyn Tree>,
    opts: &Options,
    delegate: &mut dyn Visit,
) -> Result<Walked, Error> {
    let (ma, mb) = (a.head(), b.head());
    let picking = opts.slot_a.is_some() || opts.slot_b.is_some();
    if capture::compare::same_root(ma, mb) && !picking {
        return Ok(Walked {
            identical: true,
            ..Walked::default()
        });
    }
    let mut stages = Stages::default();
    let (pa, pb) = (
        index::picked(a, opts.slot_a, &mut stages),
        index::picked(b, opts.slot_b, &mut stages),
    );
    crate::timing::mark("picked");
    let (oa, ob) = rayon::join(|| index::index(a, pa), || index::index(b, pb));
    let (oa, ob) = (oa?, ob?);
    crate::timing::mark("indexed");
    // Where the runs' input tokens part, per slot: later positions compute
    // different things and are not compared. The merge asks once per tap;
    // an ordered map keeps each question logarithmic however many slots a
    // (possibly hostile) tree holds.
    let mut splits: BTreeMap<Option<u32>, Option<crate::inputs::InputSplit>> = BTreeMap::new();
    let mut split_at = |slot: Option<u32>| -> Option<u32> {
        splits
            .entry(slot)
            .or_insert_with(|| {
                let (sa, sb) = match (opts.slot_a, opts.slot_b) {
                    (None, None) => (slot, slot),
                    (pa, pb) => (pa.flatten(), pb.flatten()),
                };
                crate::inputs::split(&ma.run, &mb.run, sa, sb)
            })
            .as_ref()
            .map(|s| s.pos)
            // With `all_positions` the split is still reported, but nothing is cut.
            .filter(|_| !opts.all_positions)
    };
    let merged = merge::merge(&oa, &ob, &mut split_at);
    crate::timing::mark("merged");
    let mut walked = Walked {
        inputs_split: (splits.into_values().flatten()).min_by_key(|s| (s.pos, s.slot)),
        ..Walked::default()
    };
    let lone = (merged.only_in_a.iter().map(|k| (Side::A, k)))
        .chain(merged.only_in_b.iter().map(|k| (Side::B, k)));
    for (side, k) in lone {
        let key = TapId::new(stages.name(k.0), k.1, k.3..k.3 + 1, k.2);
        if delegate.visit(Change::OnlyIn { side, key }) == Action::Cancel {
            walked.cancelled = true;
            return Ok(walked);
        }
    }
    let truth = match truth {
        Some(t) => Some(truth_index(t, ma, &merged.matched, &mut stages)?),
        None => None,
    };
    let matched = &merged.matched;
    let (states, read) = read::read((a, b), matched, picking, opts);
    crate::timing::mark("read");
    walked.counts = Counts {
        positions: matched.iter().map(|s| u64::from(s.len)).sum(),
        positions_inputs_differ: merged.inputs_differ,
        taps_skipped: read.taps_skipped,
        taps_compared: read.taps_compared,
        bytes_read: read.bytes_read,
        ..Counts::default()
    };
    // `matched` is sorted by (stage, layer, slot, pos): each row is a run.
    let mut by_row: Vec<(RowKey, std::ops::Range<usize>)> = Vec::new();
    for (i, seg) in matched.iter().enumerate() {
        match by_row.last_mut() {
            Some(((layer, _), members))
                if *layer == seg.key.1 && matched[members.start].key.0 == seg.key.0 =>
            {
                members.end = i + 1
            }
            _ => by_row.push(((seg.key.1, stages.name(seg.key.0).to_string()), i..i + 1)),
        }
    }
    crate::timing::mark("by_row");
    // Rows are built on every core: a row that is not all equal by hash
    // derives and stores the metrics of each of its positions.
    let truth_at = |seg: &merge::Segment, j: u32| match &truth {
        Some(t) => read::truth_pair((a, b), t, seg, j).map_err(std::sync::Arc::new),
        None => Ok(None),
    };
    let truth_at: Option<&judge::TruthAt> = truth.as_ref().map(|_| &truth_at as _);
    let rows: Vec<Row> = by_row
        .into_par_iter()
        .map(|(id, members)| {
            judge::build_row(
                id,
                &matched[members.clone()],
                &states[members],
                a.listing(),
                &opts.tolerance,
                truth_at,
            )
        })
        .collect();
    // What the rows were built from is freed on the pool, off this
    // thread's path: freeing it is megabytes of pages given back, and each
    // unmap interrupts every core the process runs on.
    crate::timing::mark("rows");
    rayon::spawn(move || drop((states, merged, oa, ob)));
    let rows = in_forward_order(rows, (a, b));
    crate::timing::mark("ordered");
    for row in rows {
        if delegate.visit(Change::Row(Box::new(row))) == Action::Cancel {
            walked.cancelled = true;
            break;
        }
    }
    Ok(walked)
}

/// The truth's positions, and per slot where it was fed other tokens than A.
fn truth_index<'t>(
    t: &'t dyn Tree,
    ma: &Manifest,
    matched: &[merge::Segment],
    stages: &mut Stages,
) -> Result<read::Truth<'t>, Error> {
    let order = index::picked(t, None, stages);
    let order = index::index(t, order)?;
    let index: HashMap<PosKey, index::Loc> = Positions::new(&order).collect();
    // A truth that generated other tokens than A is no truth from there on.
    let slots: BTreeSet<Option<u32>> = matched.iter().map(|s| s.key.2).collect();
    let split = slots
        .into_iter()
        .filter_map(|slot| {
            crate::inputs::split(&ma.run, &t.head().run, slot, slot).map(|s| (slot, s.pos))
        })
        .collect();
    Ok(read::Truth {
        tree: t,
        index,
        split,
    })
}

/// The rows sorted into forward order, each red one's cause, layout hints
/// and error growth set.
fn in_forward_order(mut rows: Vec<Row>, (a, b): (&dyn Tree, &dyn Tree)) -> Vec<Row> {
    // Every layer either tree holds, found on every core (entries come in
    // runs of one layer: only a change of layer is inserted).
    let layers_of = |t: &dyn Tree| -> BTreeSet<u32> {
        let l = t.listing();
        (0..l.len().div_ceil(4096))
            .into_par_iter()
            .map(|c| {
                let (mut set, mut last) = (BTreeSet::new(), None);
                let chunk = c * 4096..l.len().min((c + 1) * 4096);
                for layer in chunk.filter_map(|i| l.layer(i)) {
                    if last != Some(layer) {
                        set.insert(layer);
                        last = Some(layer);
                    }
                }
                set
            })
            .reduce(BTreeSet::new, |mut x, y| {
                x.extend(y);
                x
            })
    };
    let (mut layers, more) = rayon::join(|| layers_of(a), || layers_of(b));
    layers.extend(more);
    let graph = StageGraph::new(&vocabulary(a.head(), b.head()), &layers);
    // Each row's place computed once (a key per comparison built a string each time).
    rows.sort_by_cached_key(|r| graph.order(r.layer, &r.stage));
    divergence::classify(&mut rows, &graph);
    crate::hints::layout(&mut rows, &graph);
    divergence::growth(&mut rows, &graph);
    rows
}

/// A's vocabulary, then any stage only B declares (found by name in a
/// set: a vocabulary may hold many thousand stages).
pub(crate) fn vocabulary(ma: &Manifest, mb: &Manifest) -> Vec<capture::StageSpec> {
    let mut v = ma.stages.clone();
    let mut names: std::collections::HashSet<&str> =
        ma.stages.iter().map(|s| s.name.as_str()).collect();
    for s in &mb.stages {
        if names.insert(&s.name) {
            v.push(s.clone());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tensor;
    use crate::Error;
    use capture::{DType, Entry, Key, RunInfo};
    use std::path::{Path, PathBuf};

    /// A tree held in memory whose tensors are never read.
    pub(super) struct Bare(PathBuf, Manifest);

    impl Tree for Bare {
        fn path(&self) -> &Path {
            &self.0
        }
        fn manifest(&self) -> &Manifest {
            &self.1
        }
        fn read(&self, _: usize) -> Result<Tensor, capture::Error> {
            unreachable!("no tensor is read before the indexes are checked")
        }
    }

    /// The tree `name` (its root too) of `entries`.
    pub(super) fn bare(name: &str, entries: Vec<Entry>) -> Bare {
        Bare(
            PathBuf::from(name),
            Manifest {
                format: "taptree".into(),
                format_version: capture::FORMAT_VERSION.into(),
                root: name.into(),
                manifest_blake3: None,
                run: RunInfo::default(),
                selection: "all".into(),
                stages: Vec::new(),
                dirs: Default::default(),
                entries,
            },
        )
    }

    fn tree(name: &str, taps: &[(u32, u32, usize)]) -> Bare {
        let entries = taps
            .iter()
            .map(|&(start, end, rows)| {
                let key = Key::new("x", Some(0), start..end);
                Entry {
                    path: capture::manifest::path_of(&key),
                    key,
                    dtype: DType::F32,
                    shape: vec![rows, 2],
                    blake3: format!("{start}-{end}"),
                    bytes: rows as u64 * 8,
                    header_blake3: None,
                }
            })
            .collect();
        bare(name, entries)
    }

    #[test]
    fn index_errors_name_the_first_problem_of_a_then_b() {
        let good = tree("good", &[(0, 2, 2), (2, 3, 1)]);
        let dup = tree("dup", &[(0, 2, 2), (1, 2, 1)]);
        let bad_rows = tree("rows", &[(0, 2, 3), (1, 2, 1)]);
        match diff(&good, &dup, None, &Options::default()) {
            Err(Error::DuplicatePosition { path, key, pos }) => {
                assert_eq!(
                    (path, key.as_str(), pos),
                    (PathBuf::from("dup"), "L0/x@1", 1)
                )
            }
            other => panic!("{:?}", other.err()),
        }
        // A tap inside an earlier, longer one (not next to it in key order).
        let inside = tree("inside", &[(0, 3, 3), (1, 2, 1), (3, 4, 1)]);
        match diff(&good, &inside, None, &Options::default()) {
            Err(Error::DuplicatePosition { key, pos, .. }) => {
                assert_eq!((key.as_str(), pos), ("L0/x@1", 1))
            }
            other => panic!("{:?}", other.err()),
        }
        // Rows are checked before duplicates, and A before B.
        match diff(&bad_rows, &dup, None, &Options::default()) {
            Err(Error::BadRows { key, .. }) => assert_eq!(key, "L0/x@0..2"),
            other => panic!("{:?}", other.err()),
        }
        let r = diff(
            &good,
            &tree("other", &[(0, 2, 2)]),
            None,
            &Options::default(),
        )
        .unwrap();
        assert_eq!(r.counts.positions, 2);
        assert_eq!(r.only_in_a, vec!["L0/x@2".parse().unwrap()]);
    }
}
