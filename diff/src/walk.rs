//! Walking two trees: identity, key matching per position, hash skipping,
//! the parallel metric pass, and assembling the [`Report`].

use crate::divergence;
use crate::graph::StageGraph;
use crate::metrics::{compare, Acc};
use crate::report::{
    Closer, Counts, EqualRun, Outcome, Position, Report, Row, Status, TreeInfo, TruthVerdict,
    SCHEMA,
};
use crate::tolerance::Tolerance;
use crate::tree::{Tensor, Tree};
use crate::Error;
use capture::{Entry, Manifest};
use rayon::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// How to compare.
#[derive(Default)]
pub struct Options<'p> {
    pub tolerance: Tolerance,
    /// Compare only this slot of A (`Some(None)`: the taps without a slot)
    /// against `slot_b` of B, whatever their slot numbers.
    pub slot_a: Option<Option<u32>>,
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
    fn start(&self, total_bytes: u64);
    fn advance(&self, bytes: u64);
    fn finish(&self);
}

/// One position of one tree: `(stage, layer, slot, pos)`.
/// The stage is numbered by [`Stages`]: keys are `Copy` and compare fast.
type PosKey = (u32, Option<u32>, Option<u32>, u32);

/// The positions of one (stage, layer, slot): a [`PosKey`] without its position.
type Group = (u32, Option<u32>, Option<u32>);

fn group(k: &PosKey) -> Group {
    (k.0, k.1, k.2)
}

/// A row: (layer, stage name).
type RowKey = (Option<u32>, String);

/// Stage names of every tree in the diff, numbered.
#[derive(Default)]
struct Stages {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Stages {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }
}

/// Where a position lives: entry index and row. Narrow, because there is
/// one per position of each tree and the index is built for every diff.
#[derive(Clone, Copy)]
struct Loc {
    entry: u32,
    row: u32,
}

impl Loc {
    fn entry(self) -> usize {
        self.entry as usize
    }

    fn row(self) -> usize {
        self.row as usize
    }
}

/// The entries a tree contributes after the slot pick, keyed by their first
/// position, in entry order. Numbering stages here, in entry order and one
/// tree after the other, keeps stage numbers (and so the order of reported
/// positions) independent of [`index`] running on both trees at once.
fn picked(tree: &dyn Tree, pick: Option<Option<u32>>, stages: &mut Stages) -> Vec<(PosKey, usize)> {
    let m = tree.manifest();
    let mut order: Vec<(PosKey, usize)> = Vec::with_capacity(m.entries.len());
    for (i, e) in m.entries.iter().enumerate() {
        let slot = match pick {
            Some(want) if e.key.slot != want => continue,
            // Picked slots are paired with each other whatever their numbers.
            Some(_) => None,
            None => e.key.slot,
        };
        let key = (stages.id(&e.key.stage), e.key.layer, slot, e.key.pos.start);
        order.push((key, i));
    }
    order
}

/// Sorts a tree's [`picked`] entries into key order and checks that they
/// hold one row per position and no position twice. The positions
/// themselves are never listed: the merge walks whole taps ([`Cursor`]),
/// so a diff costs per tap, not per position, where the taps agree.
fn index(tree: &dyn Tree, mut order: Vec<(PosKey, usize)>) -> Result<Vec<(PosKey, usize)>, Error> {
    let m = tree.manifest();
    order.sort_unstable();
    for &(_, i) in &order {
        let e = &m.entries[i];
        let rows = e.key.rows() as usize;
        if e.shape.first().copied() != Some(rows) && !(rows == 1 && e.shape.is_empty()) {
            return Err(Error::BadRows {
                path: tree.path().join(&e.path),
                key: e.key.to_string(),
                shape: e.shape.clone(),
            });
        }
    }
    // Sorted by first position, a tap overlaps an earlier one of its
    // (stage, layer, slot) exactly when it starts before the furthest end
    // seen so far; its first position is then held twice.
    let mut reach: Option<(Group, u32)> = None;
    for &(k, i) in &order {
        let e = &m.entries[i];
        if e.key.rows() == 0 {
            continue;
        }
        let end = e.key.pos.end;
        match &mut reach {
            Some((g, furthest)) if *g == group(&k) => {
                if k.3 < *furthest {
                    return Err(Error::DuplicatePosition {
                        path: tree.path().to_path_buf(),
                        key: e.key.to_string(),
                        pos: k.3,
                    });
                }
                *furthest = (*furthest).max(end);
            }
            _ => reach = Some((group(&k), end)),
        }
    }
    Ok(order)
}

/// A run of matched positions held by one tap of each tree: positions
/// `key.3 .. key.3 + len`, at rows `a.row ..` of A's tap and `b.row ..` of
/// B's. Taps that hold the same positions in both trees (the usual case)
/// make one segment each.
#[derive(Clone, Copy)]
struct Segment {
    key: PosKey,
    len: u32,
    a: Loc,
    b: Loc,
}

impl Segment {
    fn key(&self, j: u32) -> PosKey {
        (self.key.0, self.key.1, self.key.2, self.key.3 + j)
    }
}

/// The positions of a tree not yet merged, a tap at a time: the current
/// tap's next position, its end, and where that position lives.
struct Cursor<'a> {
    entries: &'a [Entry],
    order: std::slice::Iter<'a, (PosKey, usize)>,
    current: Option<(PosKey, u32, Loc)>,
}

impl<'a> Cursor<'a> {
    fn new(m: &'a Manifest, order: &'a [(PosKey, usize)]) -> Cursor<'a> {
        let mut c = Cursor {
            entries: &m.entries,
            order: order.iter(),
            current: None,
        };
        c.current = c.pull();
        c
    }

    fn pull(&mut self) -> Option<(PosKey, u32, Loc)> {
        loop {
            let &(key, i) = self.order.next()?;
            let rows = self.entries[i].key.rows();
            if rows > 0 {
                let entry = u32::try_from(i).expect("fewer than 2^32 taps");
                return Some((key, key.3 + rows, Loc { entry, row: 0 }));
            }
        }
    }

    /// Moves past `n` positions of the current tap.
    fn advance(&mut self, n: u32) {
        if let Some((key, end, loc)) = &mut self.current {
            key.3 += n;
            loc.row += n;
            if key.3 >= *end {
                self.current = self.pull();
            }
        }
    }
}

/// The positions of entries sorted by [`index`], in that order.
struct Positions<'a> {
    entries: &'a [Entry],
    order: std::slice::Iter<'a, (PosKey, usize)>,
    current: Option<(PosKey, u32, u32)>,
    row: u32,
}

impl<'a> Positions<'a> {
    fn new(m: &'a Manifest, order: &'a [(PosKey, usize)]) -> Positions<'a> {
        Positions {
            entries: &m.entries,
            order: order.iter(),
            current: None,
            row: 0,
        }
    }
}

impl Iterator for Positions<'_> {
    type Item = (PosKey, Loc);

    fn next(&mut self) -> Option<(PosKey, Loc)> {
        loop {
            if let Some(((stage, layer, slot, start), entry, rows)) = self.current {
                if self.row < rows {
                    let row = self.row;
                    self.row += 1;
                    return Some(((stage, layer, slot, start + row), Loc { entry, row }));
                }
            }
            let &(key, i) = self.order.next()?;
            let entry = u32::try_from(i).expect("fewer than 2^32 taps");
            self.current = Some((key, entry, self.entries[i].key.rows()));
            self.row = 0;
        }
    }
}

fn info(tree: &dyn Tree) -> TreeInfo {
    let m = tree.manifest();
    TreeInfo {
        path: tree.path().display().to_string(),
        root: m.root.clone(),
        taps: m.entries.len(),
        bytes: m.bytes_of_entries(),
        model: m.run.model.clone(),
        backend: m.run.backend.clone(),
        precision: m.run.precision.clone(),
    }
}

fn row_elems(e: &Entry) -> usize {
    let rows = e.shape.first().copied().unwrap_or(1).max(1);
    e.shape.iter().product::<usize>() / rows
}

fn row_bytes<'t>(t: &'t Tensor, e: &Entry, row: usize) -> &'t [u8] {
    let len = row_elems(e) * e.dtype.size();
    &t.bytes()[row * len..(row + 1) * len]
}

/// Why two taps cannot be compared element for element, if they cannot.
fn mismatch(a: &Entry, b: &Entry) -> Option<String> {
    let (sa, sb) = (
        a.shape.get(1..).unwrap_or(&[]),
        b.shape.get(1..).unwrap_or(&[]),
    );
    if sa != sb {
        Some(format!("shape mismatch: row shape {sa:?} vs {sb:?}"))
    } else if a.dtype != b.dtype && !(a.dtype.is_float() && b.dtype.is_float()) {
        // Float dtypes compare in f64 (an f64 tree against an f32 one).
        Some(format!("dtype mismatch: {} vs {}", a.dtype, b.dtype))
    } else {
        None
    }
}

/// What became of a segment.
enum SegState {
    /// Equal by hash, never read: `n` elements per position.
    Skipped(u64),
    /// Read, or not comparable (`mismatch`): one result per position.
    Compared {
        mismatch: Option<String>,
        results: Vec<Computed>,
    },
}

/// A position's A-vs-B accumulator and, with a truth, (T-vs-A, T-vs-B).
type Computed = (Acc, Option<Box<(Acc, Acc)>>);

/// Compares `a` with `b` (and, for red rows, both with `truth`).
pub fn diff(
    a: &dyn Tree,
    b: &dyn Tree,
    truth: Option<&dyn Tree>,
    opts: &Options,
) -> Result<Report, Error> {
    let (ma, mb) = (a.manifest(), b.manifest());
    let mut report = Report {
        schema: SCHEMA,
        a: info(a),
        b: info(b),
        truth: truth.map(info),
        tolerance: opts.tolerance.to_string(),
        outcome: Outcome::Identical,
        summary: String::new(),
        rows: Vec::new(),
        first_divergence: None,
        first_inexact: None,
        common_only: opts.common_only,
        growth_ranking: Vec::new(),
        only_in_a: Vec::new(),
        only_in_b: Vec::new(),
        inputs_split: None,
        counts: Counts::default(),
        controls: Vec::new(),
        notes: Vec::new(),
    };
    let picking = opts.slot_a.is_some() || opts.slot_b.is_some();
    if ma.root == mb.root && !picking {
        report.summary = format!(
            "bitwise identical: {} tensors, {} bytes, root {}",
            ma.entries.len(),
            report.a.bytes,
            short_hash(&ma.root)
        );
        return Ok(report);
    }

    let mut stages = Stages::default();
    let (pa, pb) = (
        picked(a, opts.slot_a, &mut stages),
        picked(b, opts.slot_b, &mut stages),
    );
    let (oa, ob) = rayon::join(|| index(a, pa), || index(b, pb));
    let (oa, ob) = (oa?, ob?);
    // Where the runs' input tokens part, per slot: later positions compute
    // different things and are not compared.
    let mut splits: HashMap<Option<u32>, Option<crate::inputs::InputSplit>> = HashMap::new();
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
    };
    // With `all_positions` the split is still reported, but nothing is cut.
    let mut split_at = |slot: Option<u32>| split_at(slot).filter(|_| !opts.all_positions);
    // Matched segments (a merge of the two sorted indexes, a tap at a
    // time), and the positions only one tree holds.
    let mut matched: Vec<Segment> = Vec::with_capacity(oa.len().max(ob.len()));
    let (mut ca, mut cb) = (Cursor::new(ma, &oa), Cursor::new(mb, &ob));
    loop {
        let (x, y) = (ca.current, cb.current);
        // The side whose next positions are only its own, and how many.
        let lone = match (x, y) {
            (None, None) => break,
            (Some((ka, ea, la)), Some((kb, eb, lb))) if group(&ka) == group(&kb) => {
                if ka.3 < kb.3 {
                    Some((true, ka, ea.min(kb.3) - ka.3))
                } else if kb.3 < ka.3 {
                    Some((false, kb, eb.min(ka.3) - kb.3))
                } else {
                    let n = ea.min(eb) - ka.3;
                    // Past the inputs' split positions are counted, not compared.
                    let cut = match split_at(ka.2) {
                        Some(at) => at.saturating_sub(ka.3).min(n),
                        None => n,
                    };
                    if cut > 0 {
                        matched.push(Segment {
                            key: ka,
                            len: cut,
                            a: la,
                            b: lb,
                        });
                    }
                    report.counts.positions_inputs_differ += u64::from(n - cut);
                    ca.advance(n);
                    cb.advance(n);
                    None
                }
            }
            (Some((ka, ea, _)), y) if y.is_none_or(|(kb, _, _)| group(&ka) < group(&kb)) => {
                Some((true, ka, ea - ka.3))
            }
            (_, Some((kb, eb, _))) => Some((false, kb, eb - kb.3)),
            (Some(_), None) => unreachable!("a lone A is taken above"),
        };
        if let Some((in_a, k, n)) = lone {
            // Past the inputs' split a missing position is no news.
            let at = split_at(k.2);
            let list = if in_a {
                &mut report.only_in_a
            } else {
                &mut report.only_in_b
            };
            for p in k.3..k.3 + n {
                if at.is_none_or(|at| p < at) {
                    list.push(pos_label(&(k.0, k.1, k.2, p), &stages));
                }
            }
            if in_a {
                ca.advance(n);
            } else {
                cb.advance(n);
            }
        }
    }

    // Directories whose hashes agree hold only equal taps: skipped wholesale.
    let equal_dirs: BTreeSet<&String> = ma
        .dirs
        .iter()
        .filter(|(d, h)| mb.dirs.get(*d) == Some(*h))
        .map(|(d, _)| d)
        .collect();
    let equal_by_hash = |ea: &Entry, eb: &Entry| {
        ea.key.pos == eb.key.pos
            && ea.dtype == eb.dtype
            && ea.shape == eb.shape
            && (ea.blake3 == eb.blake3
                || (!picking
                    && ea.key == eb.key
                    && equal_dirs.contains(&capture::manifest::dir_of(&ea.key))))
    };

    report.inputs_split = splits
        .into_values()
        .flatten()
        .min_by_key(|s| (s.pos, s.slot));

    // Each segment judged from the manifests: equal by hash, not
    // comparable, or to be read (`to_read`: segment, why not comparable).
    let mut states: Vec<Option<SegState>> = Vec::with_capacity(matched.len());
    let mut to_read: Vec<(usize, Option<String>)> = Vec::new();
    let mut skipped_taps = vec![false; ma.entries.len()];
    let mut compared_taps = vec![false; ma.entries.len()];
    for (i, seg) in matched.iter().enumerate() {
        let (ea, eb) = (&ma.entries[seg.a.entry()], &mb.entries[seg.b.entry()]);
        if let Some(why) = mismatch(ea, eb) {
            compared_taps[seg.a.entry()] = true;
            // Same element count per row: the metrics still say something.
            if row_elems(ea) == row_elems(eb) {
                to_read.push((i, Some(why)));
                states.push(None);
            } else {
                states.push(Some(SegState::Compared {
                    mismatch: Some(why),
                    results: (0..seg.len).map(|_| (Acc::default(), None)).collect(),
                }));
            }
        } else if equal_by_hash(ea, eb) {
            skipped_taps[seg.a.entry()] = true;
            states.push(Some(SegState::Skipped(row_elems(ea) as u64)));
        } else {
            compared_taps[seg.a.entry()] = true;
            to_read.push((i, None));
            states.push(None);
        }
    }

    let truth_index: Option<HashMap<PosKey, Loc>> = match truth {
        Some(t) => {
            let order = picked(t, None, &mut stages);
            let order = index(t, order)?;
            Some(Positions::new(t.manifest(), &order).collect())
        }
        None => None,
    };
    // A truth that generated other tokens than A is no truth from there on.
    let truth_split: HashMap<Option<u32>, u32> = match truth {
        Some(t) => {
            let slots: BTreeSet<Option<u32>> = matched.iter().map(|s| s.key.2).collect();
            slots
                .into_iter()
                .filter_map(|slot| {
                    crate::inputs::split(&ma.run, &t.manifest().run, slot, slot)
                        .map(|s| (slot, s.pos))
                })
                .collect()
        }
        None => HashMap::new(),
    };
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
    let computed: Vec<Vec<Computed>> = to_read
        .par_iter()
        .map(|&(i, _)| {
            let seg = &matched[i];
            let (ea, eb) = (&ma.entries[seg.a.entry()], &mb.entries[seg.b.entry()]);
            let (ta, tb) = (a.read(seg.a.entry())?, b.read(seg.b.entry())?);
            let mut out = Vec::with_capacity(seg.len as usize);
            let mut truth_cache: HashMap<usize, Tensor> = HashMap::new();
            for j in 0..seg.len {
                let k = seg.key(j);
                let (ra, rb) = (
                    row_bytes(&ta, ea, (seg.a.row + j) as usize),
                    row_bytes(&tb, eb, (seg.b.row + j) as usize),
                );
                let acc = compare(ra, ea.dtype, rb, eb.dtype);
                let mut t_pair = None;
                let truth_fed_same = truth_split.get(&k.2).is_none_or(|&at| k.3 < at);
                if let (Some(t), Some(ti), true) = (truth, truth_index.as_ref(), truth_fed_same) {
                    let lt = ti.get(&k).or_else(|| ti.get(&(k.0, k.1, None, k.3)));
                    if let Some(lt) = lt {
                        let et = &t.manifest().entries[lt.entry()];
                        if row_elems(et) == row_elems(ea) {
                            if let std::collections::hash_map::Entry::Vacant(v) =
                                truth_cache.entry(lt.entry())
                            {
                                v.insert(t.read(lt.entry())?);
                            }
                            let tt = &truth_cache[&lt.entry()];
                            let rt = row_bytes(tt, et, lt.row());
                            t_pair = Some(Box::new((
                                compare(rt, et.dtype, ra, ea.dtype),
                                compare(rt, et.dtype, rb, eb.dtype),
                            )));
                        }
                    }
                }
                out.push((acc, t_pair));
            }
            if let Some(p) = opts.progress {
                p.advance(ea.bytes + eb.bytes);
            }
            Ok(out)
        })
        .collect::<Result<_, Error>>()?;
    if let Some(p) = opts.progress {
        p.finish();
    }
    for ((i, why), results) in to_read.into_iter().zip(computed) {
        states[i] = Some(SegState::Compared {
            mismatch: why,
            results,
        });
    }
    let states: Vec<SegState> = states
        .into_iter()
        .map(|s| s.expect("every segment judged or read"))
        .collect();
    report.counts.positions = matched.iter().map(|s| u64::from(s.len)).sum();
    report.counts.taps_skipped = skipped_taps
        .iter()
        .zip(&compared_taps)
        .filter(|(s, c)| **s && !**c)
        .count() as u64;
    report.counts.taps_compared = compared_taps.iter().filter(|c| **c).count() as u64;
    report.counts.bytes_read = total;

    // Rows, in forward order.
    // Entries come in runs of one layer: only a change of layer is inserted.
    let mut layers: BTreeSet<u32> = BTreeSet::new();
    let mut last_layer = None;
    for layer in ma
        .entries
        .iter()
        .chain(&mb.entries)
        .filter_map(|e| e.key.layer)
    {
        if last_layer != Some(layer) {
            layers.insert(layer);
            last_layer = Some(layer);
        }
    }
    let graph = StageGraph::new(&vocabulary(ma, mb), &layers);
    // `matched` is sorted by (stage, layer, slot, pos): each row is a run.
    let mut by_row: Vec<(RowKey, std::ops::Range<usize>)> = Vec::new();
    for (i, seg) in matched.iter().enumerate() {
        match by_row.last_mut() {
            Some(((layer, _), members))
                if *layer == seg.key.1 && matched[members.start].key.0 == seg.key.0 =>
            {
                members.end = i + 1
            }
            _ => by_row.push((
                (seg.key.1, stages.names[seg.key.0 as usize].clone()),
                i..i + 1,
            )),
        }
    }
    // Rows are built on every core: a row that is not all equal by hash
    // derives and stores the metrics of each of its positions.
    let mut rows: Vec<Row> = by_row
        .into_par_iter()
        .map(|((layer, stage), members)| {
            build_row(
                layer,
                stage,
                &matched[members.clone()],
                &states[members],
                ma,
                &opts.tolerance,
                truth.is_some(),
            )
        })
        .collect();
    rows.sort_by_key(|r| graph.order(r.layer, &r.stage));
    divergence::classify(&mut rows, &graph);
    crate::hints::layout(&mut rows, &graph);
    report.growth_ranking = divergence::growth(&mut rows, &graph);
    report.first_divergence = divergence::first_divergence(&rows);
    report.first_inexact = divergence::first_inexact(&rows);
    report.counts.rows_red = rows.iter().filter(|r| r.status.is_red()).count() as u64;
    report.counts.rows_degenerate = rows
        .iter()
        .filter(|r| r.status == Status::Degenerate)
        .count() as u64;
    report.rows = rows;
    crate::truth::count(&mut report);
    report.outcome = Outcome::WithinTolerance;
    conclude(&mut report);
    Ok(report)
}

/// Sets the outcome and its one-line summary from the rows.
pub(crate) fn conclude(report: &mut Report) {
    let mut missing = match (report.only_in_a.len(), report.only_in_b.len()) {
        (0, 0) => String::new(),
        (x, y) => format!(" ({x} positions only in A, {y} only in B, not compared)"),
    };
    if let Some(split) = report
        .inputs_split
        .as_ref()
        .filter(|_| report.counts.positions_inputs_differ > 0)
    {
        missing.push_str(&format!(
            " (inputs differ from position {}: {} positions not compared)",
            split.pos, report.counts.positions_inputs_differ
        ));
    }
    if report.controls.iter().any(|c| !c.passed) {
        report.outcome = Outcome::ControlFailed;
        let failed: Vec<&str> = report
            .controls
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.as_str())
            .collect();
        report.summary = format!(
            "control {} failed: this comparison cannot be trusted",
            failed.join(", ")
        );
        return;
    }
    if report.outcome == Outcome::Identical {
        return;
    }
    // Where the runs really start to differ, when that is before the
    // first op to leave tolerance.
    let inexact = match (report.first_inexact, report.first_divergence) {
        (Some(e), d) if d.is_none_or(|d| e < d) => {
            format!("; first op not bitwise equal: {}", report.rows[e].name())
        }
        _ => String::new(),
    };
    let one_sided = report.only_in_a.len() + report.only_in_b.len();
    if let Some(i) = report.first_divergence {
        let r = &report.rows[i];
        let w = r.worst();
        let first = r.first_failing().unwrap_or(w);
        let worst = if first.label() == w.label() {
            String::new()
        } else {
            format!("worst {}, ", w.label())
        };
        report.outcome = Outcome::Diverged;
        report.summary = format!(
            "diverged: first diverging op {}{} ({worst}cos {}, {} of {} rows red){inexact}{missing}",
            r.name(),
            first.label(),
            crate::tolerance::short(w.metrics.cos),
            report.counts.rows_red,
            report.rows.len()
        );
    } else if one_sided > 0 && !report.common_only && report.counts.positions > 0 {
        // Taps in one tree only: never agreement, unless asked for.
        report.outcome = Outcome::Diverged;
        report.summary = format!(
            "incomplete: the trees do not hold the same taps{missing}; what both hold agrees (--common-only compares only that){inexact}"
        );
    } else if report.counts.positions == 0 {
        report.outcome = Outcome::Inconclusive;
        report.summary = format!("no tap in common: nothing was compared{missing}");
    } else if report.counts.rows_degenerate > 0 {
        report.outcome = Outcome::Inconclusive;
        report.summary = format!(
            "inconclusive: {} rows agree only as degenerate tensors (all zero, all nonfinite or constant){missing}",
            report.counts.rows_degenerate
        );
    } else {
        report.outcome = Outcome::WithinTolerance;
        let equal = report.rows.iter().all(|r| r.status == Status::Equal);
        report.summary = if equal {
            format!(
                "bitwise equal by content: {} positions in {} rows{missing}",
                report.counts.positions,
                report.rows.len()
            )
        } else {
            format!(
                "within tolerance ({}): {} positions in {} rows{inexact}{missing}",
                report.tolerance,
                report.counts.positions,
                report.rows.len()
            )
        };
    }
}

fn build_row(
    layer: Option<u32>,
    stage: String,
    segments: &[Segment],
    states: &[SegState],
    ma: &Manifest,
    tol: &Tolerance,
    has_truth: bool,
) -> Row {
    // Reports name A's own slot even when slots were paired.
    let slot_of = |seg: &Segment| ma.entries[seg.a.entry()].key.slot;
    let skipped = states.iter().all(|s| matches!(s, SegState::Skipped(_)));
    // Positions equal by hash, as runs of one slot.
    let mut equal: Vec<EqualRun> = Vec::new();
    for (seg, state) in segments.iter().zip(states) {
        if let SegState::Skipped(_) = state {
            let (slot, start, end) = (slot_of(seg), seg.key.3, seg.key.3 + seg.len);
            match equal.last_mut() {
                Some(r) if r.slot == slot && r.end == start => r.end = end,
                _ => equal.push(EqualRun { slot, start, end }),
            }
        }
    }
    if skipped {
        // Every position equal by hash: one line stands for them all.
        let (n, count) = segments
            .iter()
            .zip(states)
            .map(|(seg, s)| match s {
                SegState::Skipped(n) => (n * u64::from(seg.len), u64::from(seg.len)),
                SegState::Compared { .. } => (0, 0),
            })
            .fold((0, 0), |(n, c), (x, y)| (n + x, c + y));
        let acc = Acc::identical(n, count);
        return Row {
            layer,
            stage,
            status: Status::Equal,
            reasons: Vec::new(),
            cause: None,
            worst: 0,
            total: acc.metrics(),
            positions: vec![Position {
                pos: segments[0].key.3,
                slot: slot_of(&segments[0]),
                pass: true,
                metrics: acc.metrics(),
            }],
            equal,
            skipped: true,
            growth: None,
            truth: None,
            hint: None,
        };
    }
    let count: usize = segments
        .iter()
        .zip(states)
        .filter(|(_, s)| matches!(s, SegState::Compared { .. }))
        .map(|(seg, _)| seg.len as usize)
        .sum();
    let mut positions = Vec::with_capacity(count);
    let mut total = Acc::default();
    let mut mismatch = None;
    let mut truths = Vec::with_capacity(count);
    for (seg, state) in segments.iter().zip(states) {
        let slot = slot_of(seg);
        match state {
            // Positions equal by hash are counted, not listed (they are in
            // `equal`), unless identity itself fails the tolerance.
            SegState::Skipped(n) => {
                let acc = Acc::identical(*n, 1);
                let m = acc.metrics();
                let pass = tol.passes(&m);
                if pass {
                    total.merge(&Acc::identical(n * u64::from(seg.len), u64::from(seg.len)));
                    continue;
                }
                for j in 0..seg.len {
                    total.merge(&acc);
                    positions.push(Position {
                        pos: seg.key.3 + j,
                        slot,
                        pass,
                        metrics: m.clone(),
                    });
                    truths.push(None);
                }
            }
            SegState::Compared {
                mismatch: why,
                results,
            } => {
                if why.is_some() {
                    mismatch = why.clone();
                }
                for (j, (acc, truth)) in (0..seg.len).zip(results) {
                    total.merge(acc);
                    let m = acc.metrics();
                    let pass = why.is_none() && tol.passes(&m);
                    positions.push(Position {
                        pos: seg.key.3 + j,
                        slot,
                        pass,
                        metrics: m,
                    });
                    truths.push(truth.as_deref());
                }
            }
        }
    }
    // The worst position: failing first, then lowest cosine, then highest NMSE.
    let worst = (0..positions.len())
        .min_by(|&x, &y| {
            let (px, py) = (&positions[x], &positions[y]);
            px.pass
                .cmp(&py.pass)
                .then(px.metrics.cos.total_cmp(&py.metrics.cos))
                .then(py.metrics.nmse.total_cmp(&px.metrics.nmse))
                .then(x.cmp(&y))
        })
        .unwrap_or(0);
    let any_fail = positions.iter().any(|p| !p.pass);
    let degenerate = positions
        .iter()
        .any(|p| p.metrics.degenerate_a.is_some() || p.metrics.degenerate_b.is_some());
    let all_equal = mismatch.is_none() && positions.iter().all(|p| p.metrics.bitwise());
    let status = if mismatch.is_some() {
        Status::Mismatch
    } else if any_fail {
        Status::Fail
    } else if degenerate {
        Status::Degenerate
    } else if all_equal {
        Status::Equal
    } else {
        Status::Pass
    };
    let mut reasons = Vec::new();
    if let Some(m) = mismatch {
        reasons.push(m);
    }
    if status == Status::Fail {
        reasons.extend(tol.failing(&positions[worst].metrics));
    }
    if status == Status::Degenerate {
        let p = positions
            .iter()
            .find(|p| p.metrics.degenerate_a.is_some() || p.metrics.degenerate_b.is_some())
            .unwrap();
        let side =
            |d: Option<crate::metrics::Degeneracy>| d.map_or("ok".to_string(), |d| d.to_string());
        reasons.push(format!(
            "degenerate at {}: A {}, B {}",
            p.label(),
            side(p.metrics.degenerate_a),
            side(p.metrics.degenerate_b)
        ));
    }
    // With a truth every row says which side is closer to it, green ones too.
    let truth = if has_truth {
        let w = &positions[worst];
        Some(match &truths[worst] {
            Some((ta, tb)) => verdict(w.pos, w.slot, &ta.metrics(), &tb.metrics()),
            None => TruthVerdict {
                pos: w.pos,
                slot: w.slot,
                error_a: f64::NAN,
                error_b: f64::NAN,
                max_abs_a: f64::NAN,
                max_abs_b: f64::NAN,
                closer: Closer::Unknown,
            },
        })
    } else {
        None
    };
    Row {
        layer,
        stage,
        status,
        reasons,
        cause: None,
        worst,
        total: total.metrics(),
        positions,
        equal,
        skipped,
        growth: None,
        truth,
        hint: None,
    }
}

fn verdict(
    pos: u32,
    slot: Option<u32>,
    ta: &crate::metrics::Metrics,
    tb: &crate::metrics::Metrics,
) -> TruthVerdict {
    let (ea, eb) = (ta.rel_rms, tb.rel_rms);
    let closer = if !(ea.is_finite() && eb.is_finite()) {
        match (ea.is_finite(), eb.is_finite()) {
            (true, false) => Closer::A,
            (false, true) => Closer::B,
            _ => Closer::Neither,
        }
    } else if ea.max(eb) <= 1.1 * ea.min(eb) {
        Closer::Neither
    } else if ea < eb {
        Closer::A
    } else {
        Closer::B
    };
    TruthVerdict {
        pos,
        slot,
        error_a: ea,
        error_b: eb,
        max_abs_a: ta.max_abs,
        max_abs_b: tb.max_abs,
        closer,
    }
}

/// A's vocabulary, then any stage only B declares.
fn vocabulary(ma: &Manifest, mb: &Manifest) -> Vec<capture::StageSpec> {
    let mut v = ma.stages.clone();
    for s in &mb.stages {
        if !v.iter().any(|t| t.name == s.name) {
            v.push(s.clone());
        }
    }
    v
}

/// `L3/ffn_down@7 slot 1`: a one-position key, as capture spells keys.
fn pos_label(k: &PosKey, stages: &Stages) -> String {
    capture::Key::new(stages.names[k.0 as usize].as_str(), k.1, k.3..k.3 + 1)
        .with_slot(k.2)
        .to_string()
}

pub(crate) fn short_hash(h: &str) -> &str {
    &h[..h.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use capture::{DType, Key, RunInfo};
    use std::path::{Path, PathBuf};

    struct Bare(PathBuf, Manifest);

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
        assert_eq!(r.only_in_a, vec!["L0/x@2".to_string()]);
    }
}
