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
//! A failed control makes the diff's outcome `ControlFailed` (exit 2).

use crate::graph::StageGraph;
use crate::metrics::compare;
use crate::report::{Control, Flagged, Report, Status};
use crate::tree::{Tree, Tweaked};
use crate::walk::{self, Options};
use crate::Error;
use rayon::prelude::*;
use std::collections::BTreeSet;

/// A position named on the command line: `L3/ffn_down@2`, `logits@0 slot 1`,
/// or without `@pos` (the tap's middle position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub layer: Option<u32>,
    pub stage: String,
    pub pos: Option<u32>,
    pub slot: Option<u32>,
}

impl At {
    pub fn parse(s: &str) -> Option<At> {
        let s = s.trim();
        let (s, slot) = match s.split_once(" slot ") {
            Some((head, n)) => (head, Some(n.trim().parse().ok()?)),
            None => (s, None),
        };
        let (s, pos) = match s.split_once('@') {
            Some((head, p)) => (head, Some(p.trim().parse().ok()?)),
            None => (s, None),
        };
        let (layer, stage) = match s.split_once('/') {
            Some((l, stage)) => {
                let n = l.strip_prefix('L').or_else(|| l.strip_prefix('l'))?;
                (Some(n.parse().ok()?), stage)
            }
            None => (None, s),
        };
        if stage.is_empty() {
            return None;
        }
        Some(At {
            layer,
            stage: stage.to_string(),
            pos,
            slot,
        })
    }

    /// The (entry, row) of `tree` this names, if it holds it.
    pub fn locate(&self, tree: &dyn Tree) -> Option<(usize, usize)> {
        let m = tree.manifest();
        m.entries.iter().enumerate().find_map(|(i, e)| {
            if e.key.stage != self.stage || e.key.layer != self.layer {
                return None;
            }
            if self.slot.is_some() && e.key.slot != self.slot {
                return None;
            }
            match self.pos {
                Some(p) if e.key.pos.contains(&p) => Some((i, (p - e.key.pos.start) as usize)),
                Some(_) => None,
                None => Some((i, e.key.rows() as usize / 2)),
            }
        })
    }
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
        fixture_validity(&[("A", a), ("B", b)])?,
    ])
}

/// Adds controls to a report and concludes it again.
pub fn attach(report: &mut Report, controls: Vec<Control>) {
    report.controls = controls;
    walk::conclude(report);
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

/// SELF: every tensor of A read twice and compared must be bitwise equal.
pub fn self_control(a: &dyn Tree, opts: &Options) -> Result<Control, Error> {
    let copy = Tweaked::unhashed(a);
    let r = walk::diff(a, &copy, None, &quiet(opts))?;
    let not_equal: Vec<String> = r
        .rows
        .iter()
        .filter(|row| row.status != Status::Equal && row.status != Status::Degenerate)
        .map(|row| row.name())
        .collect();
    let positions: u64 = a
        .manifest()
        .entries
        .iter()
        .map(|e| e.key.rows() as u64)
        .sum();
    let passed = not_equal.is_empty()
        && r.only_in_a.is_empty()
        && r.only_in_b.is_empty()
        && r.counts.positions == positions;
    Ok(Control {
        name: "SELF".into(),
        passed,
        detail: if passed {
            format!(
                "A against A: {} positions bitwise equal",
                r.counts.positions
            )
        } else {
            format!(
                "A against A is not bitwise equal: {} rows differ (first {}), {} of {} positions matched",
                not_equal.len(),
                not_equal.first().map_or("-", |s| s.as_str()),
                r.counts.positions,
                positions
            )
        },
        flagged: Vec::new(),
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

/// PERTURBED: a planted change at `at` (default: [`middle`]) must be the
/// first diverging op, at its position, and the only red row.
pub fn perturbed(a: &dyn Tree, opts: &Options, at: Option<&At>) -> Result<Control, Error> {
    let target = match at {
        Some(at) => at.clone(),
        None => match middle(a) {
            Some(m) => m,
            None => {
                return Ok(Control {
                    name: "PERTURBED".into(),
                    passed: false,
                    detail: "A holds no tap to perturb".into(),
                    flagged: Vec::new(),
                })
            }
        },
    };
    let Some((entry, row)) = target.locate(a) else {
        return Err(Error::NoSuchTap {
            path: a.path().to_path_buf(),
            key: at_label(&target),
        });
    };
    let key = &a.manifest().entries[entry].key;
    let pos = key.pos.start + row as u32;
    let planted = Tweaked::perturbed(a, entry, row);
    let r = walk::diff(a, &planted, None, &quiet(opts))?;
    let name = match key.layer {
        Some(l) => format!("L{l}/{}", key.stage),
        None => key.stage.clone(),
    };
    let label = capture::Key::new(key.stage.as_str(), key.layer, pos..pos + 1)
        .with_slot(key.slot)
        .to_string();
    let found = r.first_divergence.map(|i| {
        let row = &r.rows[i];
        let w = row.worst();
        (row.name(), w.pos, w.slot)
    });
    let passed = found.as_ref() == Some(&(name.clone(), pos, key.slot)) && r.counts.rows_red == 1;
    Ok(Control {
        name: "PERTURBED".into(),
        passed,
        detail: match (&found, passed) {
            (Some(_), true) => format!("planted change at {label}: named exactly"),
            (Some((n, p, _)), false) => format!(
                "planted change at {label}, but the first diverging op is {n}@{p} ({} red rows)",
                r.counts.rows_red
            ),
            (None, _) => format!("planted change at {label} was not seen: no divergence"),
        },
        flagged: Vec::new(),
    })
}

fn at_label(at: &At) -> String {
    let mut s = match at.layer {
        Some(l) => format!("L{l}/{}", at.stage),
        None => at.stage.clone(),
    };
    if let Some(p) = at.pos {
        s.push_str(&format!("@{p}"));
    }
    if let Some(slot) = at.slot {
        s.push_str(&format!(" slot {slot}"));
    }
    s
}

/// FIXTURE VALIDITY: reads every tap of every tree and flags degenerate rows.
pub fn fixture_validity(trees: &[(&str, &dyn Tree)]) -> Result<Control, Error> {
    let mut flagged = Vec::new();
    let mut rows = 0u64;
    for &(name, tree) in trees {
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
                        let mut k = e.key.clone();
                        k.pos = k.pos.start + r as u32..k.pos.start + r as u32 + 1;
                        out.push(Flagged {
                            tree: name.to_string(),
                            key: k.to_string(),
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
    let passed = flagged.is_empty();
    Ok(Control {
        name: "FIXTURE VALIDITY".into(),
        passed,
        detail: if passed {
            format!("{rows} tap positions checked: none all zero, all nonfinite or constant")
        } else {
            format!(
                "{} of {rows} tap positions degenerate (first: {} {} is {})",
                flagged.len(),
                flagged[0].tree,
                flagged[0].key,
                flagged[0].what
            )
        },
        flagged,
    })
}
