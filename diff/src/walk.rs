//! Walking two trees: identity, key matching per position, hash skipping,
//! the parallel metric pass, and assembling the [`Report`].

use crate::divergence;
use crate::graph::StageGraph;
use crate::metrics::{compare, Acc, Metrics};
use crate::report::{
    Closer, Counts, Outcome, Position, Report, Row, Status, TreeInfo, TruthVerdict, SCHEMA,
};
use crate::tolerance::Tolerance;
use crate::tree::{Tensor, Tree};
use crate::Error;
use capture::{Entry, Manifest};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

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

/// A position's A-vs-B accumulator and, with a truth, (T-vs-A, T-vs-B).
type Computed = (usize, Acc, Option<Box<(Acc, Acc)>>);

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
/// themselves are not stored: [`Positions`] expands them as the merge goes,
/// which spares a diff two arrays of one element per position of each tree.
fn index(tree: &dyn Tree, mut order: Vec<(PosKey, usize)>) -> Result<Vec<(PosKey, usize)>, Error> {
    let m = tree.manifest();
    // Sorting the entries (not the many more positions) and expanding each
    // one's ascending positions gives the positions in key order.
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
    let mut previous: Option<PosKey> = None;
    for (k, loc) in Positions::new(m, &order) {
        if previous == Some(k) {
            let e = &m.entries[loc.entry()];
            return Err(Error::DuplicatePosition {
                path: tree.path().to_path_buf(),
                key: e.key.to_string(),
                pos: k.3,
            });
        }
        previous = Some(k);
    }
    Ok(order)
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

    /// How many positions there are in all.
    fn count_all(m: &Manifest, order: &[(PosKey, usize)]) -> usize {
        order
            .iter()
            .map(|&(_, i)| m.entries[i].key.rows() as usize)
            .sum()
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
        bytes: m.entries.iter().map(|e| e.bytes).sum(),
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
    } else if a.dtype != b.dtype {
        Some(format!("dtype mismatch: {} vs {}", a.dtype, b.dtype))
    } else {
        None
    }
}

/// The result at one matched position. Boxed: most positions of a typical
/// diff are skipped, and the skipped ones should cost a word, not a struct.
enum PosState {
    /// Equal by hash, never read: `n` elements.
    Skipped(u64),
    /// To be read.
    Pending,
    Read(Box<PosResult>),
}

struct PosResult {
    acc: Acc,
    mismatch: Option<String>,
    truth: Option<Box<(Acc, Acc)>>,
}

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
        growth_ranking: Vec::new(),
        only_in_a: Vec::new(),
        only_in_b: Vec::new(),
        inputs_split: None,
        counts: Counts::default(),
        controls: Vec::new(),
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
    // Positions come in runs of one slot: the last answer is remembered.
    let mut last_split: Option<(Option<u32>, Option<u32>)> = None;
    let mut split_at = |slot: Option<u32>| -> Option<u32> {
        if let Some((s, at)) = last_split {
            if s == slot {
                return at;
            }
        }
        let at = splits
            .entry(slot)
            .or_insert_with(|| {
                let (sa, sb) = match (opts.slot_a, opts.slot_b) {
                    (None, None) => (slot, slot),
                    (pa, pb) => (pa.flatten(), pb.flatten()),
                };
                crate::inputs::split(&ma.run, &mb.run, sa, sb)
            })
            .as_ref()
            .map(|s| s.pos);
        last_split = Some((slot, at));
        at
    };
    // With `all_positions` the split is still reported, but nothing is cut.
    let mut split_at = |slot: Option<u32>| split_at(slot).filter(|_| !opts.all_positions);
    // Matched positions (a merge of the two sorted indexes), and the rest.
    let mut matched: Vec<(PosKey, Loc, Loc)> =
        Vec::with_capacity(Positions::count_all(ma, &oa).min(Positions::count_all(mb, &ob)));
    let (mut ia, mut ib) = (Positions::new(ma, &oa), Positions::new(mb, &ob));
    let (mut x, mut y) = (ia.next(), ib.next());
    loop {
        let order = match (&x, &y) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => break,
        };
        match order {
            // Past the inputs' split a missing position is no news.
            std::cmp::Ordering::Less => {
                let k = x.expect("compared").0;
                if split_at(k.2).is_none_or(|at| k.3 < at) {
                    report.only_in_a.push(pos_label(&k, &stages));
                }
                x = ia.next();
            }
            std::cmp::Ordering::Greater => {
                let k = y.expect("compared").0;
                if split_at(k.2).is_none_or(|at| k.3 < at) {
                    report.only_in_b.push(pos_label(&k, &stages));
                }
                y = ib.next();
            }
            std::cmp::Ordering::Equal => {
                let ((k, la), (_, lb)) = (x.expect("compared"), y.expect("compared"));
                if split_at(k.2).is_some_and(|at| k.3 >= at) {
                    report.counts.positions_inputs_differ += 1;
                } else {
                    matched.push((k, la, lb));
                }
                x = ia.next();
                y = ib.next();
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

    // The entry pairs that must be read.
    let mut results: Vec<PosState> = Vec::with_capacity(matched.len());
    let mut groups: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    let mut skipped_taps = vec![false; ma.entries.len()];
    let mut compared_taps = vec![false; ma.entries.len()];
    // A pair of taps is judged once, not once per position it holds: its
    // positions are consecutive in `matched`.
    enum Judged {
        /// Why they cannot be compared; whether rows still hold as many elements.
        Mismatch(String, bool),
        /// Equal by hash, with this many elements per row.
        Equal(u64),
        Differ,
    }
    let mut judged: Option<((usize, usize), Judged)> = None;
    for (i, (_, la, lb)) in matched.iter().enumerate() {
        let pair = (la.entry(), lb.entry());
        let verdict = match &judged {
            Some((p, v)) if *p == pair => v,
            _ => {
                let (ea, eb) = (&ma.entries[la.entry()], &mb.entries[lb.entry()]);
                let v = if let Some(why) = mismatch(ea, eb) {
                    Judged::Mismatch(why, row_elems(ea) == row_elems(eb))
                } else if equal_by_hash(ea, eb) {
                    Judged::Equal(row_elems(ea) as u64)
                } else {
                    Judged::Differ
                };
                &judged.insert((pair, v)).1
            }
        };
        match verdict {
            Judged::Mismatch(why, same_row_elems) => {
                results.push(PosState::Read(Box::new(PosResult {
                    acc: Acc::default(),
                    mismatch: Some(why.clone()),
                    truth: None,
                })));
                // Same element count per row: the metrics still say something.
                if *same_row_elems {
                    groups.entry(pair).or_default().push(i);
                }
                compared_taps[la.entry()] = true;
            }
            Judged::Equal(n) => {
                results.push(PosState::Skipped(*n));
                skipped_taps[la.entry()] = true;
            }
            Judged::Differ => {
                results.push(PosState::Pending);
                groups.entry(pair).or_default().push(i);
                compared_taps[la.entry()] = true;
            }
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
            let slots: BTreeSet<Option<u32>> = matched.iter().map(|(k, _, _)| k.2).collect();
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
    let total: u64 = groups
        .keys()
        .map(|(x, y)| ma.entries[*x].bytes + mb.entries[*y].bytes)
        .sum();
    if let Some(p) = opts.progress {
        p.start(total);
    }
    let groups: Vec<((usize, usize), Vec<usize>)> = groups.into_iter().collect();
    let computed: Vec<Vec<Computed>> = groups
        .par_iter()
        .map(|&((xa, xb), ref members)| {
            let (ea, eb) = (&ma.entries[xa], &mb.entries[xb]);
            let (ta, tb) = (a.read(xa)?, b.read(xb)?);
            let mut out = Vec::with_capacity(members.len());
            let mut truth_cache: HashMap<usize, Tensor> = HashMap::new();
            for &i in members {
                let (k, la, lb) = &matched[i];
                let (ra, rb) = (row_bytes(&ta, ea, la.row()), row_bytes(&tb, eb, lb.row()));
                let acc = compare(ra, ea.dtype, rb, eb.dtype);
                let mut t_pair = None;
                let truth_fed_same = truth_split.get(&k.2).is_none_or(|&at| k.3 < at);
                if let (Some(t), Some(ti), true) = (truth, truth_index.as_ref(), truth_fed_same) {
                    let lt = ti.get(k).or_else(|| ti.get(&(k.0, k.1, None, k.3)));
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
                out.push((i, acc, t_pair));
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
    for (i, acc, t) in computed.into_iter().flatten() {
        match &mut results[i] {
            PosState::Read(r) => {
                r.acc = acc;
                r.truth = t;
            }
            state => {
                *state = PosState::Read(Box::new(PosResult {
                    acc,
                    mismatch: None,
                    truth: t,
                }))
            }
        }
    }
    report.counts.positions = matched.len() as u64;
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
    let mut by_row: Vec<(RowKey, Vec<usize>)> = Vec::new();
    for (i, (k, _, _)) in matched.iter().enumerate() {
        match by_row.last_mut() {
            Some(((layer, _), members)) if *layer == k.1 && matched[members[0]].0 .0 == k.0 => {
                members.push(i)
            }
            _ => by_row.push(((k.1, stages.names[k.0 as usize].clone()), vec![i])),
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
                &members,
                &results,
                &matched,
                ma,
                &opts.tolerance,
                truth.is_some(),
            )
        })
        .collect();
    rows.sort_by_key(|r| graph.order(r.layer, &r.stage));
    divergence::classify(&mut rows, &graph);
    report.growth_ranking = divergence::growth(&mut rows, &graph);
    report.first_divergence = divergence::first_divergence(&rows);
    report.counts.rows_red = rows.iter().filter(|r| r.status.is_red()).count() as u64;
    report.counts.rows_degenerate = rows
        .iter()
        .filter(|r| r.status == Status::Degenerate)
        .count() as u64;
    report.rows = rows;
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
    if let Some(i) = report.first_divergence {
        let r = &report.rows[i];
        let w = r.worst();
        report.outcome = Outcome::Diverged;
        report.summary = format!(
            "diverged: first diverging op {}{} (cos {}, {} of {} rows red){missing}",
            r.name(),
            w.label(),
            crate::tolerance::short(w.metrics.cos),
            report.counts.rows_red,
            report.rows.len()
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
                "within tolerance ({}): {} positions in {} rows{missing}",
                report.tolerance,
                report.counts.positions,
                report.rows.len()
            )
        };
    }
}

#[allow(clippy::too_many_arguments)]
fn build_row(
    layer: Option<u32>,
    stage: String,
    members: &[usize],
    results: &[PosState],
    matched: &[(PosKey, Loc, Loc)],
    ma: &Manifest,
    tol: &Tolerance,
    has_truth: bool,
) -> Row {
    // Reports name A's own slot even when slots were paired.
    let slot_of = |i: usize| ma.entries[matched[i].1.entry()].key.slot;
    let skipped = members
        .iter()
        .all(|&i| matches!(results[i], PosState::Skipped(_)));
    if skipped {
        // Every position equal by hash: one line stands for them all.
        let n = members
            .iter()
            .map(|&i| match results[i] {
                PosState::Skipped(n) => n,
                _ => 0,
            })
            .sum();
        let acc = Acc::identical(n, members.len() as u64);
        return Row {
            layer,
            stage,
            status: Status::Equal,
            reasons: Vec::new(),
            cause: None,
            worst: 0,
            total: acc.metrics(),
            positions: vec![Position {
                pos: matched[members[0]].0 .3,
                slot: slot_of(members[0]),
                pass: true,
                metrics: acc.metrics(),
            }],
            skipped: true,
            growth: None,
            truth: None,
        };
    }
    let mut positions = Vec::with_capacity(members.len());
    let mut total = Acc::default();
    let mut mismatch = None;
    let mut truths = Vec::with_capacity(members.len());
    // Positions equal by hash with as many elements have equal metrics: the
    // last ones are reused rather than derived and judged again.
    let mut last_skipped: Option<(u64, Metrics, bool)> = None;
    for &i in members {
        let k = &matched[i].0;
        let (m, pass, r) = match &results[i] {
            PosState::Skipped(n) => {
                let acc = Acc::identical(*n, 1);
                total.merge(&acc);
                match &last_skipped {
                    Some((ln, m, pass)) if ln == n => (m.clone(), *pass, None),
                    _ => {
                        let m = acc.metrics();
                        let pass = tol.passes(&m);
                        last_skipped = Some((*n, m.clone(), pass));
                        (m, pass, None)
                    }
                }
            }
            PosState::Read(r) => {
                total.merge(&r.acc);
                let m = r.acc.metrics();
                let pass = r.mismatch.is_none() && tol.passes(&m);
                (m, pass, Some(r))
            }
            PosState::Pending => unreachable!("every pending position was read"),
        };
        let why = r.and_then(|r| r.mismatch.clone());
        if why.is_some() {
            mismatch = why;
        }
        positions.push(Position {
            pos: k.3,
            slot: slot_of(i),
            pass,
            metrics: m,
        });
        truths.push(r.and_then(|r| r.truth.as_deref()));
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
    let truth = if status.is_red() && has_truth {
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
        skipped,
        growth: None,
        truth,
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

fn pos_label(k: &PosKey, stages: &Stages) -> String {
    let stage = &stages.names[k.0 as usize];
    let mut s = match k.1 {
        Some(l) => format!("L{l}/{stage}@{}", k.3),
        None => format!("{stage}@{}", k.3),
    };
    if let Some(slot) = k.2 {
        s.push_str(&format!(" slot {slot}"));
    }
    s
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
                }
            })
            .collect();
        Bare(
            PathBuf::from(name),
            Manifest {
                format: "taptree".into(),
                format_version: capture::FORMAT_VERSION.into(),
                root: name.into(),
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
