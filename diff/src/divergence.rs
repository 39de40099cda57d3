//! The first diverging op, origin vs inherited, and error growth.
//!
//! Rows arrive sorted in forward order. The first divergence is the first red
//! row: whatever is red downstream of it is never the answer. A red row is an
//! *origin* when every row it reads is bitwise equal, *grew from* its inputs
//! when they are within tolerance but not equal, *inherited* when one is red. Inputs that were not tapped are looked through: their own inputs
//! stand in for them.

use crate::graph::{StageGraph, StageNode};
use crate::report::{Cause, Growth, Row, Status};
use std::collections::{HashMap, HashSet};

/// The index of the first red row in forward order.
pub fn first_divergence(rows: &[Row]) -> Option<usize> {
    rows.iter().position(|r| r.status.is_red())
}

/// The index of the first row, in forward order, that is not bitwise equal.
pub fn first_inexact(rows: &[Row]) -> Option<usize> {
    rows.iter().position(|r| r.status != Status::Equal)
}

/// The rows (indices) a row reads, looking through untapped stages (a run
/// of layers no tap carries as a whole: [`StageGraph::through_untapped_layers`]).
fn resolve(index: &HashMap<StageNode, usize>, graph: &StageGraph, row: StageNode) -> Vec<usize> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut todo = graph.inputs(row.0, &row.1);
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        if let Some(&i) = index.get(&id) {
            out.push(i);
            continue;
        }
        let through =
            id.0.and_then(|l| graph.through_untapped_layers(l, [id.1.clone()].into()));
        match through {
            Some(rows) => todo.extend(rows),
            None => todo.extend(graph.inputs(id.0, &id.1)),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Sets `cause` on every red row.
pub fn classify(rows: &mut [Row], graph: &StageGraph) {
    let index: HashMap<StageNode, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.layer, r.stage.clone()), i))
        .collect();
    for i in 0..rows.len() {
        if !rows[i].status.is_red() {
            continue;
        }
        let inputs = resolve(&index, graph, (rows[i].layer, rows[i].stage.clone()));
        let names = |keep: &dyn Fn(Status) -> bool| -> Vec<capture::RowId> {
            inputs
                .iter()
                .filter(|&&j| keep(rows[j].status))
                .map(|&j| rows[j].id())
                .collect()
        };
        let red = names(&|s| s.is_red());
        let inexact = names(&|s| s != Status::Equal);
        rows[i].cause = Some(if !red.is_empty() {
            Cause::Inherited { from: red }
        } else if !inexact.is_empty() {
            Cause::GrewFrom { from: inexact }
        } else {
            Cause::Origin
        });
    }
}

/// Fills each row's [`Growth`].
pub fn growth(rows: &mut [Row], graph: &StageGraph) {
    let index: HashMap<StageNode, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.layer, r.stage.clone()), i))
        .collect();
    let mut computed = Vec::with_capacity(rows.len());
    for i in 0..rows.len() {
        let inputs = resolve(&index, graph, (rows[i].layer, rows[i].stage.clone()));
        let mut best: Option<Growth> = None;
        for p in &rows[i].positions {
            let out = p.metrics.rel_rms;
            if !out.is_finite() {
                // A zero reference or nonfinite values: no meaningful ratio.
                continue;
            }
            let input = inputs
                .iter()
                .map(|&j| input_error(&rows[j], p.pos, p.slot))
                .fold(0.0f64, f64::max);
            let delta = out - input;
            if best.as_ref().is_none_or(|b| delta > b.delta) {
                best = Some(Growth {
                    pos: p.pos,
                    slot: p.slot,
                    input_error: input,
                    output_error: out,
                    delta,
                    ratio: if input > 0.0 {
                        out / input
                    } else {
                        f64::INFINITY
                    },
                });
            }
        }
        computed.push(best);
    }
    for (row, g) in rows.iter_mut().zip(computed) {
        row.growth = g;
    }
}

/// The rows ranked by their [`Growth`], largest increase first (rows that
/// add no error are left out).
pub fn ranking(rows: &[Row]) -> Vec<usize> {
    let delta = |i: usize| rows[i].growth.as_ref().map(|g| g.delta);
    let mut ranking: Vec<usize> = (0..rows.len())
        .filter(|&i| delta(i).is_some_and(|d| d > 0.0))
        .collect();
    ranking.sort_by(|&x, &y| {
        let (dx, dy) = (delta(x).unwrap(), delta(y).unwrap());
        dy.total_cmp(&dx).then(x.cmp(&y))
    });
    ranking
}

/// An input row's error at the same position (and slot), or its worst error
/// when it does not hold that position.
fn input_error(row: &Row, pos: u32, slot: Option<u32>) -> f64 {
    if row.is_equal_at(pos, slot) {
        return 0.0;
    }
    let at = row
        .positions
        .iter()
        .find(|q| q.pos == pos && q.slot == slot)
        .map(|q| q.metrics.rel_rms);
    let e = at.unwrap_or_else(|| {
        row.positions
            .iter()
            .map(|q| q.metrics.rel_rms)
            .fold(0.0, f64::max)
    });
    if e.is_finite() {
        e
    } else {
        0.0
    }
}
