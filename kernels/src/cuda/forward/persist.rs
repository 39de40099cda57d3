//! The persistent decode step: a fused single-sequence step's layers in one
//! cooperative launch ([`ops::decode_layers`]) instead of five launches
//! each, the same bits (`cuda_fused.rs`). Off unless asked for
//! (`TAPTREE_CUDA_PERSIST=1`, or `set_persistent`); a step it cannot run
//! takes the five launches.

use cudarc::driver::CudaSlice;

use super::{CudaForward, KvCache, Scratch, WeightsOnDevice};
use crate::cuda::device::Device;
use crate::cuda::ops::{self, LayerMatrices, LayerTable, StepBuffers, StepShape};
use crate::cuda::CudaError;
use model::LlamaConfig;

/// The persistent step's switch, its table of the layers' weights and its
/// barrier's counter.
pub(super) struct Persist {
    on: bool,
    /// The most blocks its grid may have (0: as many as fit).
    cap: usize,
    table: LayerTable,
    barrier: CudaSlice<u32>,
    runs: u64,
    /// The last plan made and the caches' capacity and cap it was made for
    /// (a plan asks the driver three things: made once per capacity, not
    /// on every step).
    plan: Option<(usize, usize, Option<ops::PersistPlan>)>,
    /// The timeline of the last persistent launch, where asked for, and
    /// the grid it ran on.
    stamps: Option<CudaSlice<u64>>,
    blocks: usize,
}

impl Persist {
    /// The table of `w`'s layers (made here, outside any graph capture: it
    /// is an upload) and the counter; the switch and the cap from
    /// `TAPTREE_CUDA_PERSIST` and `TAPTREE_CUDA_PERSIST_BLOCKS`.
    pub(super) fn new(
        dev: &Device,
        w: &WeightsOnDevice,
        c: &LlamaConfig,
    ) -> Result<Persist, CudaError> {
        let layers: Vec<LayerMatrices> = w
            .layers
            .iter()
            .enumerate()
            .map(|(l, lw)| {
                let la = c.family.attention(l, c.rope_base);
                LayerMatrices {
                    w: [
                        &lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down,
                    ],
                    norms: [&lw.attn_norm, &lw.ffn_norm],
                    window: la.window,
                    rope_base: la.rope_base,
                }
            })
            .collect();
        let table = LayerTable::new(dev, &layers)?;
        let barrier = ops::upload(dev, &[0u32; ops::BARRIER_WORDS])?;
        let env = std::env::var("TAPTREE_CUDA_PERSIST_BLOCKS").ok();
        Ok(Persist {
            on: matches!(
                std::env::var("TAPTREE_CUDA_PERSIST").as_deref(),
                Ok("1" | "on")
            ),
            cap: env.and_then(|v| v.parse().ok()).unwrap_or(0),
            table,
            barrier,
            runs: 0,
            plan: None,
            stamps: None,
            blocks: 0,
        })
    }
}

/// Runs the layers of a fused one-row step persistently where it can:
/// `Ok(false)` (nothing launched) where it is off or the step does not fit
/// ([`ops::persist_plan`]), and the caller launches the five per layer.
pub(super) fn layers(
    dev: &Device,
    p: &mut Persist,
    c: &LlamaConfig,
    sc: &mut Scratch,
    cache: &mut KvCache,
    pos: usize,
    tabled: bool,
) -> Result<bool, CudaError> {
    if !p.on {
        return Ok(false);
    }
    let shape = StepShape {
        d: c.n_embd,
        n_head: c.n_head,
        n_kv: c.n_head_kv,
        head_dim: c.head_dim,
        ff: c.n_ff,
        capacity: cache.capacity,
        eps: c.rms_eps,
        pos,
    };
    let plan = match p.plan {
        Some((capacity, cap, plan)) if capacity == cache.capacity && cap == p.cap => plan,
        _ => {
            let plan = ops::persist_plan(dev, &p.table, &shape, p.cap)?;
            p.plan = Some((cache.capacity, p.cap, plan));
            plan
        }
    };
    let Some(plan) = plan else {
        return Ok(false);
    };
    let (d, qw) = (c.n_embd, c.n_head * c.head_dim);
    let rope = sc.rope.slice(..c.head_dim);
    p.blocks = plan.blocks;
    ops::decode_layers(
        dev,
        &p.table,
        &shape,
        &plan,
        StepBuffers {
            x: &mut sc.x.slice_mut(..d),
            x2: &mut sc.x2.slice_mut(..d),
            q: &mut sc.q.slice_mut(..qw),
            att: &mut sc.att.slice_mut(..qw),
            s: &mut sc.s.slice_mut(..c.n_ff),
            k_cache: &mut cache.k.slice_mut(..),
            v_cache: &mut cache.v.slice_mut(..),
            pos: &sc.pos.slice(..1),
            rope: tabled.then_some(&rope),
            barrier: &mut p.barrier,
            stamps: p.stamps.as_mut(),
        },
    )?;
    p.runs += 1;
    Ok(true)
}

impl CudaForward {
    /// Runs a fused single-sequence step's layers in one persistent launch
    /// (`TAPTREE_CUDA_PERSIST=1` starts with it on) or in five launches
    /// each (the default). Either way the results are the same bits.
    pub fn set_persistent(&mut self, on: bool) {
        self.persist.on = on;
        self.graph = None;
    }

    /// Limits the persistent launch's grid to `blocks` (0: as many as the
    /// GPU holds at once, at most the widest step's); from
    /// `TAPTREE_CUDA_PERSIST_BLOCKS` unless set. Any grid gives the same
    /// bits.
    pub fn set_persistent_blocks(&mut self, blocks: usize) {
        self.persist.cap = blocks;
        self.graph = None;
    }

    /// Has each persistent launch note when each block arrived at and left
    /// each barrier, for [`Self::persistent_timeline`] (a decode graph is
    /// captured again, with or without the notes).
    pub fn set_persistent_timeline(&mut self, on: bool) -> Result<(), CudaError> {
        // Room for any grid: at most 32 blocks per SM.
        let most = ops::timeline_len(self.config.n_layer, 32 * self.dev.sm_count());
        self.persist.stamps = if on {
            Some(ops::upload(&self.dev, &vec![0u64; most])?)
        } else {
            None
        };
        self.graph = None;
        Ok(())
    }

    /// The last persistent launch's timeline ([`ops::timeline_len`] values,
    /// nanoseconds) and its grid's blocks, once the stream is done; `None`
    /// unless asked for and run.
    pub fn persistent_timeline(&self) -> Result<Option<(usize, Vec<u64>)>, CudaError> {
        let p = &self.persist;
        let Some(t) = &p.stamps else {
            return Ok(None);
        };
        if p.blocks == 0 || t.len() < ops::timeline_len(self.config.n_layer, p.blocks) {
            return Ok(None);
        }
        let s = self.dev.stream();
        let v = s
            .clone_dtoh(t)
            .map_err(|e| CudaError::driver("copy the timeline", e))?;
        Ok(Some((p.blocks, v)))
    }

    /// How many runs were encoded with the persistent launch so far (a
    /// decode graph captured with it counts once, not once per replay).
    pub fn persistent_runs(&self) -> u64 {
        self.persist.runs
    }
}
