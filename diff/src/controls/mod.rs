//! Controls: checks of the comparator itself, run beside a diff.
//!
//! - SELF: A against A, every tensor read on both sides (hashes are hidden so
//!   nothing is skipped), must be bitwise equal everywhere.
//! - PERTURBED: A against a copy of A (in memory) with one planted change
//!   must diverge, and its first diverging op must be exactly the planted tap
//!   and position.
//! - FIXTURE VALIDITY: no tap position of A or B may be degenerate (all zero,
//!   all nonfinite, constant): agreement between such tensors proves nothing.
//!
//! SELF and PERTURBED are delegates of a walk ([`SelfCheck`],
//! [`PlantedCheck`]) over the doubles in [`doubles`]. A failed control makes
//! the diff's outcome `ControlFailed` (exit 2).

pub mod doubles;

use crate::graph::StageGraph;
use crate::metrics::compare;
use crate::report::Side;
use crate::report::{Control, DiffReport, Finding, Flagged, Status};
use crate::tree::Tree;
use crate::walk::{self, Action, Change, Options, Visit};
use crate::Error;
use capture::RowId;
use doubles::Tweaked;
use rayon::prelude::*;
use std::collections::BTreeSet;

/// A position named on the command line: `L3/ffn_down@2`, `logits@0 slot 1`,
/// or without `@pos` (the tap's middle position). Parsed by capture, where
/// every key is.
pub use capture::Site as At;

/// The (entry, row) of `tree` that `at` names, if it holds it.
pub fn locate(at: &At, tree: &dyn Tree) -> Option<(usize, usize)> {
    let m = tree.manifest();
    m.entries.iter().enumerate().find_map(|(i, e)| {
        if e.key.stage != at.stage || e.key.layer != at.layer {
            return None;
        }
        if at.slot.is_some() && e.key.slot != at.slot {
            return None;
        }
        match at.pos {
            Some(p) if e.key.pos.contains(&p) => Some((i, (p - e.key.pos.start) as usize)),
            Some(_) => None,
            None => Some((i, e.key.rows() as usize / 2)),
        }
    })
}

/// Runs the three controls on `a` (and FIXTURE VALIDITY on `b` too).
pub fn run(
    a: &dyn Tree,
    b: &dyn Tree,
    opts: &Options,
    perturb_at: Option<&At>,
) -> Result<Vec<Control>, Error> {
    Ok(vec![
        self_control(a, opts)?,
        perturbed(a, opts, perturb_at)?,
        fixture_validity(&[(Side::A, a), (Side::B, b)])?,
    ])
}

/// Adds controls to a report and concludes it again.
pub fn attach(report: &mut DiffReport, controls: Vec<Control>) {
    report.controls = controls;
    walk::outcome::conclude(report);
}

fn quiet<'p>(opts: &Options<'p>) -> Options<'p> {
    Options {
        tolerance: opts.tolerance.clone(),
        slot_a: None,
        slot_b: None,
        all_positions: opts.all_positions,
        progress: None,
        common_only: opts.common_only,
    }
}

/// SELF's delegate: the rows that are not bitwise equal and whether a
/// position was held by one side only.
#[derive(Default)]
pub struct SelfCheck {
    /// Rows neither equal nor degenerate, in forward order.
    pub not_equal: Vec<RowId>,
    /// A position was found in one tree only.
    pub one_sided: bool,
}

impl Visit for SelfCheck {
    fn visit(&mut self, change: Change<'_>) -> Action {
        match change {
            Change::OnlyIn { .. } => self.one_sided = true,
            Change::Row(row) => {
                if row.status != Status::Equal && row.status != Status::Degenerate {
                    self.not_equal.push(row.id());
                }
            }
        }
        Action::Continue
    }
}

/// SELF: every tensor of A read twice and compared must be bitwise equal.
pub fn self_control(a: &dyn Tree, opts: &Options) -> Result<Control, Error> {
    let copy = Tweaked::unhashed(a);
    let mut check = SelfCheck::default();
    let walked = walk::walk(a, &copy, None, &quiet(opts), &mut check)?;
    let matched = walked.counts.positions;
    let positions: u64 = a
        .manifest()
        .entries
        .iter()
        .map(|e| e.key.rows() as u64)
        .sum();
    let passed = check.not_equal.is_empty() && !check.one_sided && matched == positions;
    Ok(Control {
        finding: if passed {
            Finding::SelfEqual { positions: matched }
        } else {
            Finding::SelfDiffers {
                rows: check.not_equal.len(),
                first: check.not_equal.into_iter().next(),
                matched,
                positions,
            }
        },
    })
}

/// The tap in the middle of the forward: the middle row of the middle entry
/// in forward order.
pub fn middle(tree: &dyn Tree) -> Option<At> {
    let m = tree.manifest();
    let layers: BTreeSet<u32> = m.entries.iter().filter_map(|e| e.key.layer).collect();
    let graph = StageGraph::new(&m.stages, &layers);
    let mut order: Vec<usize> = (0..m.entries.len()).collect();
    order.sort_by_key(|&i| {
        let k = &m.entries[i].key;
        (graph.order(k.layer, &k.stage), k.slot, k.pos.start)
    });
    let e = &m.entries[*order.get(order.len() / 2)?];
    Some(At {
        layer: e.key.layer,
        stage: e.key.stage.clone(),
        pos: Some(e.key.pos.start + e.key.rows() / 2),
        slot: e.key.slot,
    })
}

/// PERTURBED's delegate: the first red row in forward order (its name and
/// worst position) and how many rows are red.
#[derive(Default)]
pub struct PlantedCheck {
    /// The first red row: its id, worst position, its slot.
    pub first_red: Option<(RowId, u32, Option<u32>)>,
    /// Red rows in all.
    pub red: u64,
}

impl Visit for PlantedCheck {
    fn visit(&mut self, change: Change<'_>) -> Action {
        if let Change::Row(row) = change {
            if row.status.is_red() {
                self.red += 1;
                if self.first_red.is_none() {
                    let w = row.worst();
                    self.first_red = Some((row.id(), w.pos, w.slot));
                }
            }
        }
        Action::Continue
    }
}

/// PERTURBED: a planted change at `at` (default: [`middle`]) must be the
/// first diverging op, at its position, and the only red row.
pub fn perturbed(a: &dyn Tree, opts: &Options, at: Option<&At>) -> Result<Control, Error> {
    let target = match at {
        Some(at) => at.clone(),
        None => match middle(a) {
            Some(m) => m,
            None => {
                return Ok(Control {
                    finding: Finding::NothingToPerturb,
                })
            }
        },
    };
    let Some((entry, row)) = locate(&target, a) else {
        return Err(Error::NoSuchTap {
            path: a.path().to_path_buf(),
            key: target.to_string(),
        });
    };
    let key = &a.manifest().entries[entry].key;
    let pos = key.pos.start + row as u32;
    let planted = Tweaked::perturbed(a, entry, row);
    let mut check = PlantedCheck::default();
    walk::walk(a, &planted, None, &quiet(opts), &mut check)?;
    let at = key.id().with_pos(pos..pos + 1).to_key();
    let found = check.first_red;
    let passed = found.as_ref() == Some(&(key.id().row(), pos, key.slot)) && check.red == 1;
    Ok(Control {
        finding: match (found, passed) {
            (Some(_), true) => Finding::PlantedNamed { at },
            (Some((found, pos, _)), false) => Finding::PlantedMisnamed {
                at,
                found,
                pos,
                red: check.red,
            },
            (None, _) => Finding::PlantedUnseen { at },
        },
    })
}

/// FIXTURE VALIDITY: reads every tap of every tree and flags degenerate rows.
pub fn fixture_validity(trees: &[(Side, &dyn Tree)]) -> Result<Control, Error> {
    let mut flagged = Vec::new();
    let mut rows = 0u64;
    for &(side, tree) in trees {
        let m = tree.manifest();
        let found: Vec<Vec<Flagged>> = (0..m.entries.len())
            .into_par_iter()
            .map(|i| {
                let e = &m.entries[i];
                let t = tree.read(i)?;
                let n = e.key.rows() as usize;
                let len = t.bytes().len() / n.max(1);
                let mut out = Vec::new();
                for r in 0..n {
                    let row = &t.bytes()[r * len..(r + 1) * len];
                    let m = compare(row, e.dtype, row, e.dtype).metrics();
                    if let Some(what) = m.degenerate_a {
                        let p = e.key.pos.start + r as u32;
                        out.push(Flagged {
                            tree: side,
                            key: e.key.id().with_pos(p..p + 1).to_key(),
                            what,
                        });
                    }
                }
                Ok(out)
            })
            .collect::<Result<_, Error>>()?;
        rows += m.entries.iter().map(|e| e.key.rows() as u64).sum::<u64>();
        flagged.extend(found.into_iter().flatten());
    }
    let finding = if flagged.is_empty() {
        Finding::FixturesValid { positions: rows }
    } else {
        Finding::FixturesDegenerate {
            positions: rows,
            flagged,
        }
    };
    Ok(Control { finding })
}
