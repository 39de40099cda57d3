//! A tensor-parallel forward simulated on the CPU (`taptree capture --tp N`):
//! the oracle for a multi-GPU engine's per-rank taps.
//!
//! Megatron-style: q/k/v and gate/up are column-parallel (each of `N` ranks
//! computes its query heads' columns, the KV heads they read and its FFN
//! columns, from the replicated normed input); o_proj and ffn_down are
//! row-parallel (each rank multiplies its own columns of the activation by
//! its columns of the weight, giving a full-shape **partial sum**), and an
//! all-reduce adds the partial sums in the declared fixed order
//! `((p0 + p1) + p2) + ...`, rank by rank ([`forward::all_reduce`]).
//! Everything else (embedding, norms, residual adds, the logits) is
//! replicated: every rank would compute the same bits, so it runs and is
//! tapped once, without a rank. [`plan`] says how heads, KV heads and FFN
//! columns split; [`shard`] cuts each rank's weights from the prepared ones,
//! and every op is the CPU forward's own ([`super::attention`],
//! [`super::matmul`], ...).
//!
//! Taps: a column-parallel op's tap is the rank's shard, its key carrying
//! the rank and a [`capture::Shard`] (axis 1, its column range, the full
//! width); `o_proj_partial` and `ffn_down_partial` are each rank's partial
//! sum before the all-reduce (ranked, no shard); `o_proj` and `ffn_down` are
//! the all-reduced sums. Column-parallel shards equal the matching columns
//! of the one-device forward bit for bit (each output column is the same
//! dot product); from the first all-reduce on, the summation order differs
//! from the one-device matmul's, and so may the last bits.
//!
//! `TAPTREE_FAULT_TP_SKIP_ALLREDUCE=RANK@LAYER/STAGE` ([`crate::switches`])
//! plants a fault for testing the diff: that rank's partial sum is left out
//! of that all-reduce.

pub mod forward;
pub mod plan;
pub mod shard;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::forward::Acts;
use super::weights::DenseWeights;
use super::Real;
use crate::forward::{Forward, ForwardError, Precision};
use crate::switches::Switches;
use capture::StageSpec;
use forward::{RankCache, Step};
use model::{LlamaConfig, ModelWeights};
use plan::TpPlan;
use shard::RankLayer;

pub use crate::switches::{Reduce, TpSkip};

/// A rank's partial sum of o_proj, before the all-reduce.
pub const O_PROJ_PARTIAL: &str = "o_proj_partial";
/// A rank's partial sum of ffn_down, before the all-reduce.
pub const FFN_DOWN_PARTIAL: &str = "ffn_down_partial";

/// The stage vocabulary of a tensor-parallel forward: the model's, with
/// each row-parallel stage's per-rank partial sum before it (reading the
/// same inputs).
pub fn stages(config: &LlamaConfig) -> Vec<StageSpec> {
    let mut out = Vec::new();
    for spec in crate::stages::for_config(config) {
        let partial = match spec.name.as_str() {
            crate::stages::O_PROJ => Some(O_PROJ_PARTIAL),
            crate::stages::FFN_DOWN => Some(FFN_DOWN_PARTIAL),
            _ => None,
        };
        if let Some(name) = partial {
            let mut p = spec.clone();
            p.name = name.to_string();
            out.push(p);
        }
        out.push(spec);
    }
    out
}

enum Caches {
    F32(BTreeMap<Option<u32>, RankCache<f32>>),
    F64(BTreeMap<Option<u32>, RankCache<f64>>),
}

/// The CPU forward split over `N` simulated ranks (see the module doc).
pub struct TpForward {
    config: LlamaConfig,
    precision: Precision,
    weights: Arc<DenseWeights>,
    /// Per rank, per layer.
    ranks: Vec<Vec<RankLayer>>,
    plan: TpPlan,
    acts: Acts,
    skip: Option<TpSkip>,
    caches: Caches,
}

impl TpForward {
    /// Splits `weights` over `n` ranks and opens a forward at `precision`
    /// (f32, q8 or f64; `llamacpp` models one device's arithmetic only).
    pub fn new(
        weights: &ModelWeights,
        precision: Precision,
        switches: &Switches,
        n: usize,
    ) -> Result<TpForward, ForwardError> {
        let config = weights.config.clone();
        crate::forward::check_config(&config)?;
        switches.check(precision)?;
        if precision == Precision::LlamaCpp {
            return Err(ForwardError::Unsupported(format!(
                "--tp {n}: --precision llamacpp models one device's arithmetic; use f32, q8 or f64"
            )));
        }
        let plan = TpPlan::for_weights(weights, n)?;
        let skip = switches.tp_skip();
        plan.check_skip(skip, config.n_layer)?;
        let dense = Arc::new(DenseWeights::new(weights)?);
        let ranks = plan
            .ranks
            .iter()
            .enumerate()
            .map(|(r, p)| {
                dense
                    .layers
                    .iter()
                    .map(|l| RankLayer::new(l, p, r, config.head_dim))
                    .collect()
            })
            .collect();
        Ok(TpForward {
            config,
            precision,
            weights: dense,
            ranks,
            plan,
            acts: Acts::resolve(precision, switches),
            skip,
            caches: match precision {
                Precision::F64 => Caches::F64(BTreeMap::new()),
                _ => Caches::F32(BTreeMap::new()),
            },
        })
    }

    /// The split.
    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }

    fn cached_len(&self, slot: Option<u32>) -> usize {
        match &self.caches {
            Caches::F32(c) => c.get(&slot).map_or(0, |c| c.len),
            Caches::F64(c) => c.get(&slot).map_or(0, |c| c.len),
        }
    }
}

fn run_in<T: Real>(
    caches: &mut BTreeMap<Option<u32>, RankCache<T>>,
    step: &Step,
    tokens: &[u32],
) -> Vec<f32> {
    let cache = caches
        .entry(step.slot)
        .or_insert_with(|| RankCache::new(step.cfg.n_layer, step.plan));
    step.run(cache, tokens)
}

impl Forward for TpForward {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn forward(
        &mut self,
        slot: Option<u32>,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        crate::forward::check_tokens(&self.config, tokens)?;
        let cached = self.cached_len(slot);
        crate::forward::check_positions(&self.config, slot, tokens.len(), start_pos, cached)?;
        let step = Step {
            cfg: &self.config,
            w: &self.weights,
            ranks: &self.ranks,
            plan: &self.plan,
            acts: self.acts,
            skip: self.skip,
            slot,
            start: start_pos,
        };
        Ok(match &mut self.caches {
            Caches::F32(c) => run_in(c, &step, tokens),
            Caches::F64(c) => run_in(c, &step, tokens),
        })
    }

    /// The slots' steps one after another, as the one-device CPU forward
    /// runs them.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        crate::forward::decode_slot_by_slot(self, tokens, positions)
    }

    fn reset(&mut self) {
        match &mut self.caches {
            Caches::F32(c) => c.clear(),
            Caches::F64(c) => c.clear(),
        }
    }
}
