//! Hints for red rows that look like a layout difference, not an error.
//!
//! Two engines that order a tensor's width differently (rotary pairs
//! interleaved or half-split, heads in another order) give a cosine near 0
//! on that tensor while the op that reads it, which is invariant to the
//! order, agrees. Such a red row is flagged "layout?": declaring the stage's
//! layout in the manifest lets the diff reconcile it.

use crate::graph::{StageGraph, StageNode};
use crate::report::{LayoutHint, Row};
use std::collections::HashMap;

/// Below this |cosine| a red row looks unrelated rather than inaccurate.
pub const NEAR_ZERO_COS: f64 = 0.3;
/// How many near-zero red rows a layout difference may run through before a
/// green reader (q_proj, then q_rope, then attn).
const DEPTH: usize = 3;

fn near_zero(r: &Row) -> bool {
    r.status.is_red() && r.worst().metrics.cos.abs() < NEAR_ZERO_COS
}

/// Sets `hint` on every near-zero red row whose readers, through at most a
/// few near-zero red rows, include a green one.
pub fn layout(rows: &mut [Row], graph: &StageGraph) {
    let index: HashMap<StageNode, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.layer, r.stage.clone()), i))
        .collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); rows.len()];
    for (i, r) in rows.iter().enumerate() {
        for input in graph.inputs(r.layer, &r.stage) {
            if let Some(&j) = index.get(&input) {
                readers[j].push(i);
            }
        }
    }
    for i in 0..rows.len() {
        if !near_zero(&rows[i]) {
            continue;
        }
        let mut frontier = vec![i];
        let mut green = None;
        for _ in 0..DEPTH {
            let next: Vec<usize> = frontier
                .iter()
                .flat_map(|&j| readers[j].iter().copied())
                .collect();
            if let Some(&g) = next.iter().find(|&&k| !rows[k].status.is_red()) {
                green = Some(g);
                break;
            }
            frontier = next.into_iter().filter(|&k| near_zero(&rows[k])).collect();
            if frontier.is_empty() {
                break;
            }
        }
        if let Some(g) = green {
            rows[i].hint = Some(LayoutHint {
                cos: rows[i].worst().metrics.cos,
                reader: rows[g].id(),
            });
        }
    }
}
