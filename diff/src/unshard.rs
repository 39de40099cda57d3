//! Tensor-parallel trees: [`Unsharded`] presents a tree whose taps carry
//! ranks (format 2.2) as the one-device tree they stand for, so the walk
//! compares a TP=2 run with a TP=1 run (or another TP=N run) tensor by
//! tensor.
//!
//! Each (stage, layer, positions, slot) whose ranks declare shards becomes
//! one full tensor, rebuilt from the shards along their axis; the shards
//! must tile the full extent exactly (a gap is a missing shard, a range
//! held twice an overlap: both refused, naming the tap). A ranked tap
//! without a shard (a per-rank partial sum before an all-reduce) becomes
//! its own row `stage.rN` when the other side has ranks too, compared rank
//! by rank; against a tree without ranks it has no counterpart and is left
//! out (the caller says so). A rebuilt tensor's hash is marked, so it is
//! never taken for equal by hash to a tap of a one-device tree: it is read
//! and compared.

use crate::report::Side;
use crate::report::{Note, ReduceFault, ShardDiff};
use crate::tree::{Tensor, Tree};
use crate::Error;
use capture::{Entry, Manifest, StageSpec};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Where an entry of the unsharded view comes from.
enum Source {
    /// An inner entry, as it is.
    Entry(usize),
    /// Inner entries (in order along `axis`) placed side by side.
    Shards { axis: usize, parts: Vec<usize> },
}

/// A ranked tree seen unsharded.
pub struct Unsharded<'t> {
    inner: &'t dyn Tree,
    manifest: Manifest,
    source: Vec<Source>,
}

/// Whether any tap of `m` carries a rank.
pub fn is_ranked(m: &Manifest) -> bool {
    m.entries.iter().any(|e| e.key.rank.is_some())
}

/// The number of ranks `m`'s taps name (highest rank + 1; 0 without ranks),
/// counted past `u32::MAX`: a tree may name rank 4294967295.
pub fn rank_count(m: &Manifest) -> u64 {
    m.entries
        .iter()
        .filter_map(|e| e.key.rank)
        .max()
        .map_or(0, |r| u64::from(r) + 1)
}

/// `rank 3`, or `no rank` for an entry without one, in a message.
fn rank_text(rank: Option<u32>) -> String {
    rank.map_or_else(|| "no rank".to_string(), |r| format!("rank {r}"))
}

/// Checks that the shards `parts` of one tap (inner entries) tile their
/// full tensor; returns them in order along the axis.
fn tile(path: &Path, entries: &[Entry], mut parts: Vec<usize>) -> Result<Vec<usize>, Error> {
    let first = &entries[parts[0]];
    let shard = first.key.shard.expect("grouped by shard");
    let full_key = first.key.clone().with_rank(None, None).to_string();
    let bad = |reason: String| Error::Shards {
        path: path.to_path_buf(),
        key: full_key.clone(),
        reason,
    };
    let axis = shard.axis as usize;
    for &i in &parts {
        let e = &entries[i];
        let s = e.key.shard.expect("grouped by shard");
        if s.axis != shard.axis || s.full != shard.full || e.dtype != first.dtype {
            return Err(bad(format!(
                "{} declares {s} {}, {} {shard} {}: not one tensor",
                rank_text(e.key.rank),
                e.dtype,
                rank_text(first.key.rank),
                first.dtype
            )));
        }
        // An empty shard tiles nothing, and its rows would be read in
        // chunks of no bytes.
        if s.start >= s.end || s.end > s.full {
            return Err(bad(format!(
                "{}: shard {s} is empty or leaves the full extent",
                rank_text(e.key.rank)
            )));
        }
        let mut other = e.shape.clone();
        let mut mine = first.shape.clone();
        if axis >= other.len() || axis >= mine.len() || other.len() != mine.len() {
            return Err(bad(format!("shard {s} does not fit shape {:?}", e.shape)));
        }
        other[axis] = 0;
        mine[axis] = 0;
        if other != mine || e.shape[axis] != (s.end.saturating_sub(s.start)) as usize {
            return Err(bad(format!(
                "{}: shape {:?} does not hold shard {s}",
                rank_text(e.key.rank),
                e.shape
            )));
        }
    }
    parts.sort_by_key(|&i| entries[i].key.shard.map(|s| (s.start, s.end)));
    let mut at = 0u32;
    for &i in &parts {
        let s = entries[i].key.shard.expect("grouped by shard");
        let rank = entries[i].key.rank.map_or("-".into(), |r| r.to_string());
        if s.start > at {
            return Err(bad(format!(
                "missing shard: {}..{} of {} along axis {axis} is held by no rank",
                at, s.start, shard.full
            )));
        }
        if s.start < at {
            return Err(bad(format!(
                "overlapping shards: rank {rank} declares {}..{}, but ..{at} is already held",
                s.start, s.end
            )));
        }
        at = s.end;
    }
    if at != shard.full {
        return Err(bad(format!(
            "missing shard: {at}..{} of {} along axis {axis} is held by no rank",
            shard.full, shard.full
        )));
    }
    Ok(parts)
}

/// Items of shards grouped by the full tensor they are slices of (the
/// shard's key without rank and shard), groups in order of first item.
struct ByFull<T> {
    at: HashMap<capture::Key, usize>,
    list: Vec<(capture::Key, Vec<T>)>,
}

impl<T> Default for ByFull<T> {
    fn default() -> Self {
        ByFull {
            at: HashMap::new(),
            list: Vec::new(),
        }
    }
}

impl<T> ByFull<T> {
    /// Adds `item` to the group of the full tensor of shard `key`; returns
    /// that full tensor's key when its group is new.
    fn add(&mut self, key: &capture::Key, item: T) -> Option<&capture::Key> {
        let full = key.clone().with_rank(None, None);
        if let Some(&g) = self.at.get(&full) {
            self.list[g].1.push(item);
            return None;
        }
        self.at.insert(full.clone(), self.list.len());
        self.list.push((full, vec![item]));
        self.list.last().map(|(k, _)| k)
    }
}

impl<'t> Unsharded<'t> {
    /// The view of `inner`; `keep_partials` keeps the ranked taps without a
    /// shard as rows of their own (`stage.rN`), else leaves them out.
    pub fn new(inner: &'t dyn Tree, keep_partials: bool) -> Result<Unsharded<'t>, Error> {
        let src = inner.manifest();
        let mut manifest = src.clone();
        manifest.entries = Vec::with_capacity(src.entries.len());
        let mut source = Vec::with_capacity(src.entries.len());
        // Shards grouped by the key they stand for, in order of first shard.
        let mut groups: ByFull<usize> = ByFull::default();
        let mut rank_stages: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (i, e) in src.entries.iter().enumerate() {
            match (e.key.rank, e.key.shard) {
                (None, None) => {
                    manifest.entries.push(e.clone());
                    source.push(Source::Entry(i));
                }
                (_, Some(_)) => {
                    if let Some(full) = groups.add(&e.key, i) {
                        let mut entry = e.clone();
                        entry.key = full.clone();
                        manifest.entries.push(entry);
                        source.push(Source::Shards {
                            axis: 0,
                            parts: Vec::new(),
                        });
                    }
                }
                (Some(rank), None) if keep_partials => {
                    let mut entry = e.clone();
                    let stage = format!("{}.r{rank}", e.key.stage);
                    let ranks = rank_stages.entry(e.key.stage.clone()).or_default();
                    if !ranks.contains(&rank) {
                        ranks.push(rank);
                    }
                    entry.key = e.key.clone().with_rank(None, None);
                    entry.key.stage = stage;
                    manifest.entries.push(entry);
                    source.push(Source::Entry(i));
                }
                (Some(_), None) => {}
            }
        }
        let path = inner.path();
        let mut g = 0;
        for (entry, s) in manifest.entries.iter_mut().zip(source.iter_mut()) {
            let Source::Shards { axis, parts } = s else {
                continue;
            };
            let tiled = tile(path, &src.entries, std::mem::take(&mut groups.list[g].1))?;
            g += 1;
            let shard = src.entries[tiled[0]].key.shard.expect("a shard");
            *axis = shard.axis as usize;
            entry.shape[*axis] = shard.full as usize;
            entry.bytes = tiled.iter().map(|&i| src.entries[i].bytes).sum();
            let hashes: Vec<&str> = tiled
                .iter()
                .map(|&i| src.entries[i].blake3.as_str())
                .collect();
            entry.blake3 = format!("unsharded:{}", hashes.join("+"));
            entry.header_blake3 = None;
            *parts = tiled;
        }
        add_rank_stages(&mut manifest.stages, &rank_stages);
        manifest.root = format!("{}-unsharded", manifest.root);
        for h in manifest.dirs.values_mut() {
            *h = format!("{h}-unsharded");
        }
        Ok(Unsharded {
            inner,
            manifest,
            source,
        })
    }
}

/// Adds `stage.rN` after `stage` for every rank a partial sum was kept for.
fn add_rank_stages(stages: &mut Vec<StageSpec>, ranks: &BTreeMap<String, Vec<u32>>) {
    for (stage, rs) in ranks {
        let Some(at) = stages.iter().position(|s| &s.name == stage) else {
            continue;
        };
        let base = stages[at].clone();
        let mut rs = rs.clone();
        rs.sort_unstable();
        for (k, r) in rs.iter().enumerate() {
            let mut spec = base.clone();
            spec.name = format!("{stage}.r{r}");
            stages.insert(at + 1 + k, spec);
        }
    }
}

impl Tree for Unsharded<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        let (axis, parts) = match &self.source[index] {
            Source::Entry(i) => return self.inner.read(*i),
            Source::Shards { axis, parts } => (*axis, parts),
        };
        let entries = &self.inner.manifest().entries;
        let full = &self.manifest.entries[index];
        let size = full.dtype.size();
        // Each shard is `outer` blocks of `shape[axis..]`; block `o` of the
        // full tensor is the shards' blocks `o` side by side.
        let outer: usize = full.shape[..axis].iter().product();
        let inner_len: usize = full.shape[axis + 1..].iter().product::<usize>() * size;
        let full_block = full.shape[axis] * inner_len;
        let mut out = vec![0u8; outer * full_block];
        for &i in parts {
            let e = &entries[i];
            let s = e.key.shard.expect("a shard");
            let t = self.inner.read(i)?;
            let block = e.shape[axis] * inner_len;
            let at = s.start as usize * inner_len;
            for (o, src) in t.bytes().chunks_exact(block).enumerate().take(outer) {
                out[o * full_block + at..o * full_block + at + block].copy_from_slice(src);
            }
        }
        Ok(Tensor::Owned(out))
    }
}

/// What the ranks say about row `(layer, stage)` of a diff of `a` against
/// `b` (`views` are their unsharded views, `None` for a tree without
/// ranks): which rank's shard holds the difference, and whether an
/// all-reduced tensor is the rank-order sum of its tree's partial sums.
pub fn rank_notes(
    (a, b): (&dyn Tree, &dyn Tree),
    views: (&dyn Tree, &dyn Tree),
    layer: Option<u32>,
    stage: &str,
) -> Result<Vec<Note>, Error> {
    let mut notes = Vec::new();
    for (side, tree) in [(Side::A, a), (Side::B, b)] {
        notes.extend(shard_notes(side, tree, views, layer, stage)?);
        notes.extend(reduce_notes(side, tree, layer, stage)?);
    }
    Ok(notes)
}

/// The values of entry `i` of `tree`, widened to f64.
fn values(tree: &dyn Tree, i: usize) -> Result<Vec<f64>, Error> {
    let e = &tree.manifest().entries[i];
    let t = tree.read(i)?;
    // Only f32 and f64 taps: the partial-sum checks sum in those.
    Ok(match e.dtype {
        capture::DType::F32 | capture::DType::F64 => crate::metrics::decode(t.bytes(), e.dtype),
        _ => Vec::new(),
    })
}

/// For each shard `tree` declares at the row: does its slice of the full
/// tensors of the two views differ?
fn shard_notes(
    side: Side,
    tree: &dyn Tree,
    (va, vb): (&dyn Tree, &dyn Tree),
    layer: Option<u32>,
    stage: &str,
) -> Result<Option<Note>, Error> {
    let find =
        |v: &dyn Tree, key: &capture::Key| v.manifest().entries.iter().position(|e| &e.key == key);
    // The row's shards grouped by the full tensor they are slices of, in
    // order of first appearance: each full tensor is read once per view,
    // however many shards slice it.
    let mut fulls: ByFull<(u32, capture::Shard)> = ByFull::default();
    for e in &tree.manifest().entries {
        let (Some(rank), Some(s)) = (e.key.rank, e.key.shard) else {
            continue;
        };
        if e.key.layer != layer || e.key.stage != stage || s.axis != 1 {
            continue;
        }
        fulls.add(&e.key, (rank, s));
    }
    let mut worst: BTreeMap<(u32, u32, u32), f64> = BTreeMap::new();
    for (full, shards) in &fulls.list {
        let (Some(ia), Some(ib)) = (find(va, full), find(vb, full)) else {
            continue;
        };
        let (xa, xb) = (values(va, ia)?, values(vb, ib)?);
        if xa.len() != xb.len() || xa.is_empty() {
            continue;
        }
        for &(rank, s) in shards {
            let width = s.full as usize;
            let mut m = 0f64;
            for (ra, rb) in xa.chunks_exact(width).zip(xb.chunks_exact(width)) {
                for c in s.start as usize..s.end as usize {
                    let d = (ra[c] - rb[c]).abs();
                    if d > m || d.is_nan() {
                        m = if d.is_nan() { f64::INFINITY } else { d };
                    }
                }
            }
            let w = worst.entry((rank, s.start, s.end)).or_insert(0.0);
            *w = w.max(m);
        }
    }
    if worst.is_empty() {
        return Ok(None);
    }
    let shards = worst
        .into_iter()
        .map(|((rank, start, end), max_abs)| ShardDiff {
            rank,
            start,
            end,
            max_abs,
        })
        .collect();
    Ok(Some(Note::Shards {
        row: capture::RowId::new(layer, stage),
        tree: side,
        shards,
    }))
}

/// A partial sum's positions (start, end) and slot.
type PartialsAt = (u32, u32, Option<u32>);

/// Whether each all-reduced tap of the row in `tree` is the rank-order sum
/// of its partial sums (`STAGE_partial`), in the tap's own dtype; if not,
/// which one rank's partial sum is missing from it.
fn reduce_notes(
    side: Side,
    tree: &dyn Tree,
    layer: Option<u32>,
    stage: &str,
) -> Result<Vec<Note>, Error> {
    let partial_stage = format!("{stage}_partial");
    let entries = &tree.manifest().entries;
    let mut notes = Vec::new();
    // Per verdict: taps, first position, one past the last.
    let mut found: BTreeMap<ReduceFault, (usize, u32, u32)> = BTreeMap::new();
    // The row's partial sums by (positions, slot), found in one pass over
    // the entries rather than one per all-reduced tap.
    let mut partials: HashMap<PartialsAt, Vec<(u32, usize)>> = HashMap::new();
    for (j, p) in entries.iter().enumerate() {
        if p.key.stage == partial_stage && p.key.layer == layer && p.key.shard.is_none() {
            if let Some(r) = p.key.rank {
                let k = (p.key.pos.start, p.key.pos.end, p.key.slot);
                partials.entry(k).or_default().push((r, j));
            }
        }
    }
    for (i, e) in entries.iter().enumerate() {
        if e.key.layer != layer || e.key.stage != stage || e.key.rank.is_some() {
            continue;
        }
        let k = (e.key.pos.start, e.key.pos.end, e.key.slot);
        let mut parts: Vec<(u32, usize)> = partials.get(&k).cloned().unwrap_or_default();
        if parts.is_empty() {
            continue;
        }
        parts.sort_unstable();
        let reduced = values(tree, i)?;
        let addends = parts
            .iter()
            .map(|&(_, j)| values(tree, j))
            .collect::<Result<Vec<_>, _>>()?;
        let f32s = e.dtype == capture::DType::F32;
        let sum_without = |skip: Option<usize>| -> Vec<f64> {
            let mut sum: Option<Vec<f64>> = None;
            for (k, p) in addends.iter().enumerate() {
                if Some(k) == skip {
                    continue;
                }
                sum = Some(match sum {
                    None => p.clone(),
                    Some(s) => s
                        .iter()
                        .zip(p)
                        .map(|(x, y)| match f32s {
                            true => (*x as f32 + *y as f32) as f64,
                            false => x + y,
                        })
                        .collect(),
                });
            }
            sum.unwrap_or_default()
        };
        if sum_without(None) == reduced {
            continue;
        }
        let why = match (0..addends.len()).find(|&k| sum_without(Some(k)) == reduced) {
            Some(k) => ReduceFault::MissingRank {
                rank: parts[k].0,
                partial_stage: partial_stage.clone(),
            },
            None => ReduceFault::NotRankOrderSum {
                partials: parts.len(),
                partial_stage: partial_stage.clone(),
            },
        };
        let seen = found.entry(why).or_insert((0, u32::MAX, 0));
        seen.0 += 1;
        seen.1 = seen.1.min(e.key.pos.start);
        seen.2 = seen.2.max(e.key.pos.end);
    }
    for (fault, (taps, first, end)) in found {
        notes.push(Note::AllReduce {
            row: capture::RowId::new(layer, stage),
            tree: side,
            taps,
            first,
            end,
            fault,
        });
    }
    Ok(notes)
}
