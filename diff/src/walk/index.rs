//! Step 1, index: each tree's taps after the slot pick, numbered and sorted
//! by key, checked to hold one row per position and no position twice.

use crate::tree::Tree;
use crate::Error;
use capture::{Entry, Manifest};
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

/// The entries a tree contributes after the slot pick, keyed by their first
/// position, in entry order. Numbering stages here, in entry order and one
/// tree after the other, keeps stage numbers (and so the order of reported
/// positions) independent of [`index`] running on both trees at once.
pub(crate) fn picked(
    tree: &dyn Tree,
    pick: Option<Option<u32>>,
    stages: &mut Stages,
) -> Vec<(PosKey, usize)> {
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
/// themselves are never listed: the merge walks whole taps, so a diff costs
/// per tap, not per position, where the taps agree.
pub(crate) fn index(
    tree: &dyn Tree,
    mut order: Vec<(PosKey, usize)>,
) -> Result<Vec<(PosKey, usize)>, Error> {
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

/// The positions of entries sorted by [`index`], in that order (the
/// truth's index is looked up position by position).
pub(crate) struct Positions<'a> {
    entries: &'a [Entry],
    order: std::slice::Iter<'a, (PosKey, usize)>,
    current: Option<(PosKey, u32, u32)>,
    row: u32,
}

impl<'a> Positions<'a> {
    pub(crate) fn new(m: &'a Manifest, order: &'a [(PosKey, usize)]) -> Positions<'a> {
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
