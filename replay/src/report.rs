//! [`replay`]: every selected tap of a tree recomputed, compared position
//! by position with what the tree holds, and gathered into a [`ReplayReport`].

use crate::ops::{Arith, Ops};
use crate::taps::{self, Taps};
use crate::{Error, Model};
use capture::Selection;
use diff::metrics::{compare, Acc};
use diff::{Metrics, Tree};
use serde::Serialize;
use std::time::Instant;

/// The default tolerance on an op's local error (relative RMS): two orders
/// above what an f32 op's own rounding leaves against its f64
/// recomputation on SmolLM2 (at most ~1e-6, see docs/GUIDE.md), two below
/// the error int8 activations leave in a matmul.
pub const DEFAULT_TOLERANCE: f64 = 1e-4;

/// What to replay, and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The arithmetic of the recomputation: `F64` for the truth.
    pub precision: Arith,
    /// The largest local error (relative RMS over the op's positions) that
    /// is within tolerance.
    pub tolerance: f64,
    /// Which taps (and positions) to judge; inputs are read from the whole tree.
    pub selection: Selection,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            precision: Arith::F64,
            tolerance: DEFAULT_TOLERANCE,
            selection: Selection::all(),
        }
    }
}

/// One (layer, stage): its taps recomputed and compared.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The stage name, as the tree's keys spell it.
    pub stage: String,
    /// The layer, `None` for a global stage (`embedding`, `logits`).
    pub layer: Option<u32>,
    /// Positions compared (over every slot).
    pub positions: u64,
    /// The op's local error: relative RMS of the tree's output against the
    /// recomputation, over all its compared positions.
    pub local_error: f64,
    /// Whether the local error is above tolerance (or a value is nonfinite
    /// on one side only).
    pub above: bool,
    /// The position with the largest relative RMS error, and its slot.
    pub worst_pos: u32,
    /// The worst position's slot, `None` in a single-sequence tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_slot: Option<u32>,
    /// Metrics at the worst position (A: the recomputation, B: the tree).
    pub worst: Metrics,
    /// Metrics over every compared position.
    pub whole: Metrics,
    /// Each compared position's relative RMS error, in the tree's order.
    pub position_errors: Vec<PosError>,
}

/// One position's relative RMS error (infinite: a nonfinite mismatch).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PosError {
    /// The token position.
    pub pos: u32,
    /// The slot, `None` in a single-sequence tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Relative RMS of the tree's values against the recomputation.
    pub rel_rms: f64,
}

impl Row {
    /// `L3/ffn_down`, `logits`.
    pub fn name(&self) -> String {
        capture::RowId::new(self.layer, self.stage.as_str()).to_string()
    }
}

/// Whether every op's local error is within tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayOutcome {
    /// Every row's local error is within tolerance.
    Within,
    /// At least one row is above tolerance.
    Above,
}

impl ReplayOutcome {
    /// 0 within tolerance, 1 some op above it.
    pub fn exit_code(self) -> u8 {
        match self {
            ReplayOutcome::Within => 0,
            ReplayOutcome::Above => 1,
        }
    }
}

/// The replay of one tree.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// `"taptree-replay/1"`.
    pub schema: &'static str,
    /// The tree's directory.
    pub tree: String,
    /// The tree's root hash, from its manifest.
    pub root: String,
    /// The tree's run: backend, precision, engine (if it says).
    pub tree_backend: String,
    /// The precision the tree's run records.
    pub tree_precision: String,
    /// The model replayed against, as [`crate::Model::name`] names it.
    pub model: String,
    /// `matches the tree's record` or `the tree records no model hash`.
    pub model_check: String,
    /// The recomputation's arithmetic (`f64`, `f32`, `q8`, `llamacpp`).
    pub precision: String,
    /// The largest local error within tolerance ([`Options::tolerance`]).
    pub tolerance: f64,
    /// Stages whose declared half-split rotary layout was put in the model's order.
    pub reconciled: Vec<String>,
    /// Forward order (the order the tree first holds each op).
    pub rows: Vec<Row>,
    /// The row with the largest local error.
    pub largest: Option<usize>,
    /// The first row in forward order above tolerance.
    pub first_above: Option<usize>,
    /// How many rows are above tolerance.
    pub rows_above: usize,
    /// How many taps were selected and recomputed.
    pub taps: usize,
    /// Wall-clock seconds spent reading the tree into memory.
    pub seconds_read: f64,
    /// Wall-clock seconds spent recomputing and comparing.
    pub seconds_replay: f64,
    /// [`ReplayOutcome::Above`] when any row is.
    pub outcome: ReplayOutcome,
}

fn f64_bytes(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One row in the making.
struct Building {
    stage: String,
    layer: Option<u32>,
    whole: Acc,
    worst: Option<(f64, u32, Option<u32>, Metrics)>,
    positions: Vec<PosError>,
}

impl Building {
    /// Compares the recomputed `want` with the tree's `got` (`width` values
    /// per position, positions `pos`) at each selected position.
    fn add(
        &mut self,
        sel: &Selection,
        slot: Option<u32>,
        pos: std::ops::Range<u32>,
        width: usize,
        (want, got): (&[f64], &[f64]),
    ) {
        for p in sel.selected_runs(pos.clone()).flatten() {
            let at = (p - pos.start) as usize * width..(p - pos.start + 1) as usize * width;
            let acc = compare(
                &f64_bytes(&want[at.clone()]),
                capture::DType::F64,
                &f64_bytes(&got[at]),
                capture::DType::F64,
            );
            let mut metrics = acc.metrics();
            // Both sides were widened to f64: an f64 ULP distance says nothing.
            metrics.max_ulp = None;
            let err = badness(&metrics);
            self.positions.push(PosError {
                pos: p,
                slot,
                rel_rms: err,
            });
            if self.worst.as_ref().is_none_or(|w| err > w.0) {
                self.worst = Some((err, p, slot, metrics));
            }
            self.whole.merge(&acc);
        }
    }

    /// The finished row, judged against `tolerance`; none when no position
    /// was compared.
    fn finish(self, tolerance: f64) -> Option<Row> {
        let (_, worst_pos, worst_slot, worst) = self.worst?;
        let mut whole = self.whole.metrics();
        whole.max_ulp = None;
        let local_error = whole.rel_rms;
        Some(Row {
            above: local_error.is_nan() || local_error > tolerance || whole.nonfinite_mismatch > 0,
            stage: self.stage,
            layer: self.layer,
            positions: whole.rows,
            local_error,
            worst_pos,
            worst_slot,
            worst,
            whole,
            position_errors: self.positions,
        })
    }
}

/// What the tree's record says of `model`: an error when the hashes differ.
fn check_model(tree: &dyn Tree, model: &Model) -> Result<&'static str, Error> {
    match (&tree.manifest().run.model_blake3, model.blake3) {
        (Some(rec), Some(given)) if rec != given => Err(Error::ModelMismatch {
            tree: tree.path().to_path_buf(),
            recorded: rec.clone(),
            model: model.name.to_string(),
            given: given.to_string(),
        }),
        (Some(_), Some(_)) => Ok("matches the tree's record"),
        _ => Ok("the tree records no model hash"),
    }
}

/// Replays every selected tap of `tree` against `model`.
pub fn replay(tree: &dyn Tree, model: &Model, opts: &Options) -> Result<ReplayReport, Error> {
    let m = tree.manifest();
    let run = &m.run;
    let model_check = check_model(tree, model)?;
    let ops = Ops::new(
        model.config,
        model.weights,
        run,
        tree.path().to_path_buf(),
        opts.precision,
    )?;
    let sel = &opts.selection;
    let chosen: Vec<usize> = (0..m.entries.len())
        .filter(|&i| {
            let k = &m.entries[i].key;
            sel.wants(k.id())
        })
        .collect();
    if chosen.is_empty() {
        return Err(Error::NothingSelected {
            tree: tree.path().to_path_buf(),
        });
    }
    for &i in &chosen {
        ops.check(&m.entries[i].key.stage, m.entries[i].key.layer)?;
    }
    let t0 = Instant::now();
    let taps = Taps::load(tree, ops.halves())?;
    let seconds_read = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut rows: Vec<Building> = Vec::new();
    let mut index: std::collections::HashMap<(String, Option<u32>), usize> = Default::default();
    for &i in &chosen {
        let k = &m.entries[i].key;
        let pos = k.pos.start..k.pos.end;
        let want = ops.recompute(&taps, &k.stage, k.layer, k.slot, pos.clone())?;
        let width = want.len() / pos.len();
        let tap = taps::name(&k.stage, k.layer, k.slot, &pos);
        let got = taps.get::<f64>((&k.stage, k.layer, k.slot), pos.clone(), width, &tap)?;
        let r = *index.entry((k.stage.clone(), k.layer)).or_insert_with(|| {
            rows.push(Building {
                stage: k.stage.clone(),
                layer: k.layer,
                whole: Acc::default(),
                worst: None,
                positions: Vec::new(),
            });
            rows.len() - 1
        });
        rows[r].add(sel, k.slot, pos, width, (&want, &got));
    }
    let rows: Vec<Row> = rows
        .into_iter()
        .filter_map(|b| b.finish(opts.tolerance))
        .collect();
    let largest = (0..rows.len()).max_by(|&a, &b| {
        badness(&rows[a].whole)
            .partial_cmp(&badness(&rows[b].whole))
            .expect("badness is never NaN")
    });
    let first_above = rows.iter().position(|r| r.above);
    let rows_above = rows.iter().filter(|r| r.above).count();
    Ok(ReplayReport {
        schema: "taptree-replay/1",
        tree: tree.path().display().to_string(),
        root: m.root.clone(),
        tree_backend: run.backend.clone(),
        tree_precision: run.precision.clone(),
        model: model.name.to_string(),
        model_check: model_check.into(),
        precision: opts.precision.name().into(),
        tolerance: opts.tolerance,
        reconciled: taps.reconciled.clone(),
        largest,
        first_above,
        rows_above,
        taps: chosen.len(),
        seconds_read,
        seconds_replay: t1.elapsed().as_secs_f64(),
        outcome: if rows_above > 0 {
            ReplayOutcome::Above
        } else {
            ReplayOutcome::Within
        },
        rows,
    })
}

/// The relative RMS error, with a nonfinite mismatch worse than any and a
/// NaN error (never expected: the sums skip nonfinite pairs) as infinite.
fn badness(m: &Metrics) -> f64 {
    if m.nonfinite_mismatch > 0 || m.rel_rms.is_nan() {
        f64::INFINITY
    } else {
        m.rel_rms
    }
}
