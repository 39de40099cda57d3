//! The CUDA forward split over `N` tensor-parallel ranks (`taptree capture
//! --backend cuda --tp N`): the CPU tensor-parallel forward's split
//! ([`crate::cpu::tp`], the same [`TpPlan`]) and taps, with each rank's ops
//! on a GPU.
//!
//! **Devices.** By default rank `r` runs on GPU `r` and the row-parallel
//! partial sums are added by NCCL ([`reduce::Reducer::Nccl`]); a host with
//! fewer GPUs than ranks is refused. `TAPTREE_CUDA_TP=shared` puts every
//! rank on one GPU (`TAPTREE_CUDA_DEVICE`, default 0) and adds the partial
//! sums on the device in rank order, `((p0 + p1) + p2) + ...`: everything
//! but NCCL, on one GPU.
//!
//! **Threads.** One host thread drives every rank, in lockstep with the
//! CPU tensor-parallel forward: each rank's launches are enqueued on its
//! own device's stream (asynchronous, so the GPUs run at once), and each
//! all-reduce is one NCCL group of the ranks' `ncclAllReduce` calls (NCCL's
//! pattern for several GPUs from one thread). So the taps come in the CPU
//! forward's order and no communicator crosses a thread.
//!
//! **Ops per rank.** Replicated (every rank, the same bits): embedding,
//! norms, residual adds; the final norm and the logits on rank 0 only.
//! Column-parallel: q/k/v (the query heads' rows and the KV heads they
//! read), RoPE, attention per KV head held over the query heads reading it,
//! gate/up and the gated product. Row-parallel: o_proj and ffn_down over
//! the rank's columns, then the all-reduce. Every op is the one-GPU
//! forward's kernel ([`crate::cuda::ops`]).
//!
//! **Taps** (when armed and selected; copied to the host synchronously,
//! unlike the one-GPU forward's ring): the replicated stages from rank 0
//! without a rank, the column-parallel ones per rank with their shard (KV
//! heads by their owner only), the partial sums `o_proj_partial` /
//! `ffn_down_partial` per rank, the all-reduced `o_proj` / `ffn_down` once:
//! the keys of the CPU tensor-parallel tree, so `taptree diff` compares a
//! CUDA TP=2 tree with a CPU TP=2 tree row by row and unshards it against
//! TP=1.

mod attend;
mod buffers;
pub mod reduce;
mod step;
mod taps;
pub mod weights;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cpu::tp::plan::TpPlan;
use crate::cuda::device::{driver_present, Device};
use crate::cuda::forward::Acts;
use crate::cuda::CudaError;
use crate::forward::{Forward, ForwardError, Precision};
use crate::switches::{Switches, TpSkip};
use buffers::RankCache;
use model::{LlamaConfig, ModelWeights};
use reduce::Reducer;
use step::Rank;
use taps::At;
use weights::RankWeights;

/// The variable that picks where the ranks run: `nccl` (the default, one
/// GPU per rank) or `shared` (every rank on one GPU, no NCCL).
pub const DEVICES_VAR: &str = "TAPTREE_CUDA_TP";

/// Where the ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpDevices {
    /// Rank `r` on GPU `r`, the all-reduce through NCCL.
    Nccl,
    /// Every rank on one GPU, the all-reduce a device-side sum in rank order.
    Shared,
}

impl TpDevices {
    /// From [`DEVICES_VAR`].
    pub fn from_env() -> Result<TpDevices, ForwardError> {
        match std::env::var(DEVICES_VAR).as_deref() {
            Err(_) | Ok("" | "nccl") => Ok(TpDevices::Nccl),
            Ok("shared") => Ok(TpDevices::Shared),
            Ok(v) => Err(ForwardError::Unsupported(format!(
                "{DEVICES_VAR}: bad value {v:?}: expected nccl (one GPU per rank) or shared (every rank on one GPU)"
            ))),
        }
    }
}

/// What one rank's layer half reads besides its buffers.
struct Half<'a> {
    pub c: &'a LlamaConfig,
    pub acts: Acts,
    pub l: usize,
    pub rank: usize,
    pub group: usize,
    pub start: usize,
    pub at: &'a At,
}

/// The CUDA forward over `N` tensor-parallel ranks (see the module doc).
pub struct CudaTpForward {
    config: LlamaConfig,
    precision: Precision,
    acts: Acts,
    plan: TpPlan,
    skip: Option<TpSkip>,
    devices: TpDevices,
    ranks: Vec<Rank>,
    reducer: Reducer,
    /// Per slot: its cached length and every rank's KV cache.
    caches: BTreeMap<Option<u32>, (usize, Vec<RankCache>)>,
}

fn gpu_ordinal() -> Result<usize, ForwardError> {
    match std::env::var("TAPTREE_CUDA_DEVICE") {
        Ok(v) => v.trim().parse::<usize>().map_err(|_| {
            ForwardError::Device(format!(
                "TAPTREE_CUDA_DEVICE: bad value {v:?}: expected a GPU index"
            ))
        }),
        Err(_) => Ok(0),
    }
}

fn check_model(weights: &ModelWeights, precision: Precision, n: usize) -> Result<(), ForwardError> {
    if matches!(precision, Precision::F64 | Precision::LlamaCpp) {
        return Err(ForwardError::Unsupported(format!(
            "--tp {n}: cuda runs f32 and q8; precision {precision} runs on the cpu backend only"
        )));
    }
    crate::cuda::forward::check_model(weights)
}

impl CudaTpForward {
    /// Splits `weights` over `n` ranks and uploads each rank's share to its
    /// GPU, where [`TpDevices::from_env`] says.
    pub fn new(
        weights: &ModelWeights,
        precision: Precision,
        switches: &Switches,
        n: usize,
    ) -> Result<CudaTpForward, ForwardError> {
        let devices = TpDevices::from_env()?;
        CudaTpForward::on(weights, precision, switches, n, devices)
    }

    /// [`CudaTpForward::new`] with the ranks on `devices`.
    pub fn on(
        weights: &ModelWeights,
        precision: Precision,
        switches: &Switches,
        n: usize,
        devices: TpDevices,
    ) -> Result<CudaTpForward, ForwardError> {
        check_model(weights, precision, n)?;
        switches.check(precision)?;
        let config = weights.config.clone();
        let plan = TpPlan::for_weights(weights, n)?;
        let skip = switches.tp_skip();
        plan.check_skip(skip, config.n_layer)?;
        if !driver_present() {
            return Err(CudaError::NoDriver {
                searched: cudarc::get_lib_name_candidates("cuda").join(", "),
            }
            .into());
        }
        let (devs, reducer) = match devices {
            TpDevices::Shared => {
                let dev = Device::open(gpu_ordinal()?)?;
                (vec![dev; n], Reducer::one_device())
            }
            TpDevices::Nccl => {
                let count = cudarc::driver::CudaContext::device_count()
                    .map_err(|e| CudaError::driver("count GPUs", e))?
                    as usize;
                if count < n {
                    return Err(ForwardError::Unsupported(format!(
                        "--tp {n}: {count} GPU(s) visible, and each rank takes a GPU of its own ({DEVICES_VAR}=shared runs every rank on one GPU, without NCCL)"
                    )));
                }
                let devs = (0..n).map(Device::open).collect::<Result<Vec<_>, _>>()?;
                let reducer = Reducer::nccl(&devs)?;
                (devs, reducer)
            }
        };
        let acts = Acts::resolve(switches, precision);
        let ranks = devs
            .iter()
            .zip(&plan.ranks)
            .enumerate()
            .map(|(r, (dev, p))| {
                dev.warm_up()?;
                Ok(Rank {
                    dev: dev.clone(),
                    plan: p.clone(),
                    w: RankWeights::upload(dev, weights, p, r)?,
                    scratch: None,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(CudaTpForward {
            config,
            precision,
            acts,
            plan,
            skip,
            devices,
            ranks,
            reducer,
            caches: BTreeMap::new(),
        })
    }

    /// The split.
    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }

    /// Where the ranks run.
    pub fn devices(&self) -> TpDevices {
        self.devices
    }

    /// The devices, rank by rank (one repeated under [`TpDevices::Shared`]).
    pub fn rank_devices(&self) -> Vec<Arc<Device>> {
        self.ranks.iter().map(|r| r.dev.clone()).collect()
    }
}

impl Forward for CudaTpForward {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn backend(&self) -> &'static str {
        "cuda"
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
        let cached = self.caches.get(&slot).map_or(0, |c| c.0);
        crate::forward::check_positions(&self.config, slot, tokens.len(), start_pos, cached)?;
        Ok(self.run(slot, tokens, start_pos)?)
    }

    /// The slots' steps one after another, as the CPU tensor-parallel
    /// forward runs them.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        crate::forward::decode_slot_by_slot(self, tokens, positions)
    }

    fn reset(&mut self) {
        self.caches.clear();
    }
}
