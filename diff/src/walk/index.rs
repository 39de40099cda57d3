//! Step 1, index: each tree's taps after the slot pick, numbered and sorted
//! by key, checked to hold one row per position and no position twice.

use crate::tree::Tree;
use crate::Error;
use rayon::prelude::*;
use std::collections::HashMap;

/// One position of one tree: `(stage, layer, slot, pos)`.
/// The stage is numbered by [`Stages`]: keys are `Copy` and compare fast.
pub(crate) type PosKey = (u32, Option<u32>, Option<u32>, u32);

/// The positions of one (stage, layer, slot): a [`PosKey`] without its position.
pub(crate) type Group = (u32, Option<u32>, Option<u32>);

pub(crate) fn group(k: &PosKey) -> Group {
    (k.0, k.1, k.2)
}

/// Stage names of every tree in the diff, numbered.
#[derive(Default)]
pub(crate) struct Stages {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Stages {
    pub(crate) fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    pub(crate) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }
}

/// Where a position lives: entry index and row. Narrow, because there is
/// one per position of each tree and the index is built for every diff.
#[derive(Clone, Copy)]
pub(crate) struct Loc {
    pub(crate) entry: u32,
    pub(crate) row: u32,
}

impl Loc {
    pub(crate) fn entry(self) -> usize {
        self.entry as usize
    }

    pub(crate) fn row(self) -> usize {
        self.row as usize
    }
}

/// One tap of one tree after the slot pick, as the merge needs it: the key
/// of its first position, its number of positions, and its entry. Built
/// once per tap (on every core) so that sorting and merging never go back
/// to the entries.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tap {
    pub(crate) key: PosKey,
    pub(crate) entry: u32,
    pub(crate) rows: u32,
}

impl Tap {
    pub(crate) fn entry(self) -> usize {
        self.entry as usize
    }
}

/// Entries taken a chunk at a time when numbering stages on every core.
const CHUNK: usize = 1024;

/// The taps a tree contributes after the slot pick, in entry order. Stages
/// are numbered in order of first appearance, in entry order and one tree
/// after the other, which keeps stage numbers (and so the order of reported
/// positions) independent of [`index`] running on both trees at once. Each
/// chunk of entries lists the stages it meets in its own order (on every
/// core); the chunks' lists, taken in order, number the stages as one pass
/// over the entries would.
pub(crate) fn picked(tree: &dyn Tree, pick: Option<Option<u32>>, stages: &mut Stages) -> Vec<Tap> {
    let l = tree.listing();
    let chunks: Vec<(Vec<&str>, Vec<Tap>)> = (0..l.len().div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let range = c * CHUNK..l.len().min((c + 1) * CHUNK);
            let mut names: Vec<&str> = Vec::new();
            let mut taps = Vec::with_capacity(range.len());
            for (j, i) in range.enumerate() {
                let slot = match pick {
                    Some(want) if l.slot(i) != want => continue,
                    // Picked slots are paired with each other whatever their numbers.
                    Some(_) => None,
                    None => l.slot(i),
                };
                let stage = l.stage(i);
                let local = match names.iter().rposition(|n| *n == stage) {
                    Some(i) => i,
                    None => {
                        names.push(stage);
                        names.len() - 1
                    }
                };
                let entry = u32::try_from(c * CHUNK + j).expect("fewer than 2^32 taps");
                taps.push(Tap {
                    key: (local as u32, l.layer(i), slot, l.pos(i).start),
                    entry,
                    rows: l.rows(i),
                });
            }
            (names, taps)
        })
        .collect();
    let ids: Vec<Vec<u32>> = chunks
        .iter()
        .map(|(names, _)| names.iter().map(|n| stages.id(n)).collect())
        .collect();
    // The taps renumbered, collected on every core (so the output's fresh
    // pages are faulted in side by side, not one after the other here):
    // tap `k` of the output is in the chunk whose first tap is the last at
    // or before `k`.
    let mut starts = Vec::with_capacity(chunks.len());
    let mut total = 0;
    for (_, taps) in &chunks {
        starts.push(total);
        total += taps.len();
    }
    let mut out = Vec::new();
    (0..total)
        .into_par_iter()
        .map(|k| {
            let c = starts.partition_point(|&s| s <= k) - 1;
            let t = chunks[c].1[k - starts[c]];
            Tap {
                key: (ids[c][t.key.0 as usize], t.key.1, t.key.2, t.key.3),
                ..t
            }
        })
        .collect_into_vec(&mut out);
    out
}

/// Sorts a tree's [`picked`] taps into key order and checks that they
/// hold one row per position and no position twice. The positions
/// themselves are never listed: the merge walks whole taps, so a diff costs
/// per tap, not per position, where the taps agree.
pub(crate) fn index(tree: &dyn Tree, mut order: Vec<Tap>) -> Result<Vec<Tap>, Error> {
    let l = tree.listing();
    order.par_sort_unstable();
    let bad_rows = |t: &Tap| {
        let shape = l.shape(t.entry());
        let rows = t.rows as usize;
        shape.get(0) != Some(rows) && !(rows == 1 && shape.is_empty())
    };
    // Checked on every core; the first bad tap in key order is the error.
    if let Some(t) = order.par_iter().find_first(|t| bad_rows(t)) {
        let e = l.entry(t.entry());
        return Err(Error::BadRows {
            path: tree.path().join(&e.path),
            key: e.key.to_string(),
            shape: e.shape.clone(),
        });
    }
    // Sorted by first position, a tap overlaps an earlier one of its
    // (stage, layer, slot) exactly when it starts before the furthest end
    // seen so far; its first position is then held twice.
    let mut reach: Option<(Group, u32)> = None;
    for t in &order {
        if t.rows == 0 {
            continue;
        }
        let (k, end) = (t.key, t.key.3 + t.rows);
        match &mut reach {
            Some((g, furthest)) if *g == group(&k) => {
                if k.3 < *furthest {
                    return Err(Error::DuplicatePosition {
                        path: tree.path().to_path_buf(),
                        key: l.entry(t.entry()).key.to_string(),
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

/// The positions of entries sorted by [`index`], in that order (the
/// truth's index is looked up position by position).
pub(crate) struct Positions<'a> {
    order: std::slice::Iter<'a, Tap>,
    current: Option<Tap>,
    row: u32,
}

impl<'a> Positions<'a> {
    pub(crate) fn new(order: &'a [Tap]) -> Positions<'a> {
        Positions {
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
            if let Some(Tap { key, entry, rows }) = self.current {
                if self.row < rows {
                    let row = self.row;
                    self.row += 1;
                    let (stage, layer, slot, start) = key;
                    return Some(((stage, layer, slot, start + row), Loc { entry, row }));
                }
            }
            self.current = Some(*self.order.next()?);
            self.row = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walk::tests::{bare, Bare};
    use capture::{DType, Entry, Key};

    /// A tree of `n` taps, tap `i` of stage `stage(i)`, in slot `i % 2`.
    fn tree(n: u32, stage: impl Fn(u32) -> &'static str) -> Bare {
        tree_in(n, stage, |i| i % 2)
    }

    /// A tree of `n` taps, tap `i` of stage `stage(i)`, in slot `slot(i)`.
    fn tree_in(n: u32, stage: impl Fn(u32) -> &'static str, slot: impl Fn(u32) -> u32) -> Bare {
        let entries = (0..n)
            .map(|i| {
                let key = Key::new(stage(i), Some(0), i..i + 1).with_slot(Some(slot(i)));
                Entry {
                    path: capture::manifest::path_of(&key),
                    key,
                    dtype: DType::F32,
                    shape: vec![1, 2],
                    blake3: String::new(),
                    bytes: 8,
                    header_blake3: None,
                }
            })
            .collect();
        bare("t", entries)
    }

    /// Stages are numbered as one pass over A's entries, then B's, would
    /// number them (first appearance, after the slot pick), whatever chunk
    /// of entries each first appears in.
    #[test]
    fn stages_are_numbered_in_order_of_first_appearance_across_chunks() {
        let a = tree(3 * CHUNK as u32 + 5, |i| match i {
            7 => "first_in_chunk_0",
            1023 => "last_of_chunk_0",
            1024 => "first_of_chunk_1",
            1025 => "odd_first_of_chunk_1",
            2050 => "first_of_chunk_1",
            3074 => "in_chunk_3",
            _ if i % 5 == 0 => "common",
            _ => "other",
        });
        let b = tree(CHUNK as u32 + 10, |i| match i {
            1030 => "only_b",
            4 => "in_chunk_3",
            _ => "common",
        });
        // And a tree whose chunks alternate slots, so that a pick leaves
        // whole chunks empty: the first, middle ones, the last.
        let stage = |i: u32| match i % 7 {
            0 => "common",
            3 => "three",
            _ => "other",
        };
        let chunked = tree_in(4 * CHUNK as u32 + 3, stage, |i| (i / CHUNK as u32) % 2);
        let c = |pick| (pick, &a, &b);
        let alternating = |pick| (pick, &chunked, &a);
        let cases = [
            c(None),
            c(Some(Some(1))),
            c(Some(Some(0))),
            alternating(Some(Some(1))),
            alternating(Some(Some(0))),
        ];
        for (pick, a, b) in cases {
            let mut stages = Stages::default();
            let (pa, pb) = (picked(a, pick, &mut stages), picked(b, pick, &mut stages));
            // The definition: one pass, A then B.
            let mut want = Stages::default();
            for (t, taps) in [(a, &pa), (b, &pb)] {
                let kept: Vec<(usize, &Entry)> = (t.manifest().entries.iter().enumerate())
                    .filter(|(_, e)| pick.is_none_or(|want| e.key.slot == want))
                    .collect();
                assert_eq!(taps.len(), kept.len());
                for (tap, (i, e)) in taps.iter().zip(kept) {
                    assert_eq!(tap.entry(), i);
                    assert_eq!(tap.key.0, want.id(&e.key.stage), "entry {i}, {pick:?}");
                    assert_eq!(tap.key.2, if pick.is_some() { None } else { e.key.slot });
                    assert_eq!((tap.key.3, tap.rows), (e.key.pos.start, 1));
                }
            }
            assert_eq!(stages.names, want.names);
        }
    }
}
