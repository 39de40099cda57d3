//! [`CudaForward`]: the decoder forward on the GPU (llama, or the family its
//! [`ModelFamily`](model::ModelFamily) describes: Gemma 3's extra norms, RoPE over halves, GeGLU,
//! scaled embedding and sliding windows), tapped stage by stage with the CPU
//! forward's stage names.
//!
//! Weights stay in their file formats on the device and are decoded inside
//! the matmul kernels. Activations live in per-forward scratch buffers grown
//! to the largest row count seen; each sequence (slot) has its own KV cache.
//! A run is a list of row groups, one per sequence: a prefill is one group of
//! many rows, a batched decode step `m` groups of one row. Every op except
//! attention and the cache writes runs once over all rows of all groups.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, PinnedHostSlice};

use super::device::Device;
use super::ops::{self, DeviceMatrix, QuantizedActs};
use super::taps::TapRing;

use super::CudaError;
use crate::forward::{Forward, ForwardError, Precision};
use crate::switches::Switches;
use model::{LlamaConfig, ModelWeights, QTensor};

mod chain;
pub(crate) mod encode;
mod fused;
mod graph;
mod persist;
mod setup;

pub(crate) use setup::{check_model, kv_capacity, Acts};

/// A captured decode step and what it was captured against.
struct DecodeGraph {
    key: GraphKey,
    graph: cudarc::driver::CudaGraph,
    /// Whether it runs the mapped step (`graph.rs`).
    mapped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GraphKey {
    slot: Option<u32>,
    generation: u64,
}

struct LayerOnDevice {
    attn_norm: CudaSlice<f32>,
    wq: DeviceMatrix,
    wk: DeviceMatrix,
    wv: DeviceMatrix,
    wo: DeviceMatrix,
    ffn_norm: CudaSlice<f32>,
    w_gate: DeviceMatrix,
    w_up: DeviceMatrix,
    w_down: DeviceMatrix,
    /// The family's extra norms (`[head_dim]` for q/k, `[n_embd]` after
    /// attention and the FFN); `None` where it has none.
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    post_attn_norm: Option<CudaSlice<f32>>,
    post_ffn_norm: Option<CudaSlice<f32>>,
}

struct WeightsOnDevice {
    token_embd: DeviceMatrix,
    layers: Vec<LayerOnDevice>,
    output_norm: CudaSlice<f32>,
    /// `None` when the output is tied to the token embedding.
    output: Option<DeviceMatrix>,
}

impl WeightsOnDevice {
    fn output(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

/// Keys and values of one sequence, `[n_layer, capacity, kv_width]` each.
struct KvCache {
    len: usize,
    capacity: usize,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
}

/// Activation buffers for up to `rows` rows.
struct Scratch {
    rows: usize,
    x: CudaSlice<f32>,
    x2: CudaSlice<f32>,
    h: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    /// The q/k norms' outputs, swapped with `q` and `k` after them.
    q2: CudaSlice<f32>,
    k2: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    o: CudaSlice<f32>,
    g: CudaSlice<f32>,
    u: CudaSlice<f32>,
    s: CudaSlice<f32>,
    dn: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// RoPE's cosines and sines at the rows' positions (the fused pass).
    rope: CudaSlice<f32>,
    qa: QuantizedActs,
    /// The run's token ids and positions, where the kernels (and a graph
    /// replaying them) read them.
    tok: CudaSlice<u32>,
    pos: CudaSlice<u32>,
}

/// Where a fused forward's token and position come from and where its
/// logits go.
#[derive(Debug, Clone, Copy)]
enum StepIo {
    /// From `tok` and `pos` of the scratch (uploaded before the forward),
    /// into its `logits`.
    Device,
    /// The mapped decode step (`graph.rs`): read from and written to
    /// page-locked host memory, through these device addresses of the
    /// forward's step buffer (token, position) and its row of logits,
    /// which live as long as any graph recording them.
    Mapped { input: u64, logits: u64 },
    /// A chained greedy step (`chain.rs`): the token and position read from
    /// `input`, a device buffer, the logits into the scratch's, and their
    /// greedy token written back to `input` for the next step (its
    /// position one past) and into `toks` at the step's position.
    Chained { input: u64, toks: u64 },
}

/// The rows of one sequence in a run.
#[derive(Debug, Clone)]
struct Group {
    slot: Option<u32>,
    /// First row of the group in the run's buffers.
    row: usize,
    rows: usize,
    start_pos: usize,
}

impl Group {
    fn pos(&self) -> Range<u32> {
        self.start_pos as u32..(self.start_pos + self.rows) as u32
    }
}

/// The instrumented CUDA forward (f32 and q8 precisions).
pub struct CudaForward {
    dev: Arc<Device>,
    config: LlamaConfig,
    precision: Precision,
    acts: Acts,
    w: WeightsOnDevice,
    caches: BTreeMap<Option<u32>, KvCache>,
    scratch: Option<Scratch>,
    /// Page-locked host buffers the taps copy through, asynchronously.
    ring: TapRing,
    /// A page-locked buffer of one row of logits, which each run's logits
    /// are copied through (into pageable memory the driver stages the copy).
    logits_host: Option<PinnedHostSlice<f32>>,
    /// A page-locked token and position, a decode graph's inputs
    /// (`graph.rs`).
    step_host: Option<PinnedHostSlice<u32>>,
    /// Whether a decode graph holds its step's copies (`graph.rs`).
    graph_copies: bool,
    /// Whether a decode graph reads its inputs from, and writes its logits
    /// into, the page-locked buffers themselves (`graph.rs`, `mappable`).
    mapped_step: bool,
    /// How the fused pass's logits matmul is spread
    /// ([`ops::matmul_streamed`]).
    logits: ops::Streaming,
    /// RoPE's base where every layer rotates with the same one: the fused
    /// pass then computes the cosines and sines once per forward.
    shared_rope_base: Option<f32>,
    /// Whether a single sequence's untapped decode step runs as a CUDA graph.
    graphs: bool,
    /// Whether an untapped forward of one sequence runs fused (`fused.rs`).
    fused: bool,
    /// The last decode step's graph, and what it was captured against.
    graph: Option<DecodeGraph>,
    /// Bumped whenever a buffer a graph names is (re)allocated or dropped.
    generation: u64,
    /// Decode steps run as a graph replay so far.
    replays: u64,
    /// Of them, the mapped steps' (`graph.rs`).
    mapped_replays: u64,
    /// Runs made fused so far (graph replays of a fused step included).
    fused_runs: u64,
    /// The persistent decode step (`persist.rs`).
    persist: persist::Persist,
    /// Whether greedy decoding of one sequence runs chained on the device
    /// (`chain.rs`).
    chained: bool,
    /// The chained steps' token and position, and their tokens
    /// (`chain.rs`).
    chain: Option<chain::ChainBuffers>,
    /// Decode steps run chained so far.
    chained_steps: u64,
}

/// How the fused pass's logits matmul is spread, unless set otherwise.
/// (4 blocks per SM, 2 stages: 19.0 us against 24.3 for one block per 16
/// logits on an H200; more stages or blocks did not help, docs/PERFORMANCE.md.)
const LOGITS: ops::Streaming = ops::Streaming {
    blocks_per_sm: 4,
    stages: 2,
};

/// RoPE's base where every layer of `c` rotates with the same one.
fn shared_rope_base(c: &LlamaConfig) -> Option<f32> {
    let mut bases = (0..c.n_layer).map(|l| c.family.attention(l, c.rope_base).rope_base);
    let first = bases.next()?;
    bases
        .all(|b| b.to_bits() == first.to_bits())
        .then_some(first)
}

/// A norm weight as f32 on the device.
pub(crate) fn norm_weight(dev: &Device, t: &QTensor) -> Result<CudaSlice<f32>, CudaError> {
    let host = t
        .to_f32()
        .map_err(|e| CudaError::Shape(format!("{}: {e}", t.name)))?;
    ops::upload(dev, &host)
}

impl CudaForward {
    /// Uploads `weights` to `dev` and opens a forward at `precision` (`f32` or
    /// `q8`; the f64 truth runs on the CPU backend only).
    pub fn new(
        dev: Arc<Device>,
        weights: &ModelWeights,
        precision: Precision,
        switches: &Switches,
    ) -> Result<CudaForward, ForwardError> {
        if precision == Precision::F64 {
            return Err(ForwardError::Unsupported(
                "cuda: precision f64 (the truth) runs on the cpu backend only".into(),
            ));
        }
        if precision == Precision::LlamaCpp {
            return Err(ForwardError::Unsupported(
                "cuda: precision llamacpp (llama.cpp's CPU arithmetic) runs on the cpu backend only"
                    .into(),
            ));
        }
        let c = &weights.config;
        check_model(weights)?;
        switches.check(precision)?;
        let acts = Acts::resolve(switches, precision);
        let opt = |t: &Option<QTensor>| t.as_ref().map(|t| norm_weight(&dev, t)).transpose();
        let m = |t: &QTensor| DeviceMatrix::upload(&dev, t);
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                Ok(LayerOnDevice {
                    attn_norm: norm_weight(&dev, &l.attn_norm)?,
                    wq: m(&l.wq)?,
                    wk: m(&l.wk)?,
                    wv: m(&l.wv)?,
                    wo: m(&l.wo)?,
                    ffn_norm: norm_weight(&dev, &l.ffn_norm)?,
                    w_gate: m(&l.w_gate)?,
                    w_up: m(&l.w_up)?,
                    w_down: m(&l.w_down)?,
                    q_norm: opt(&l.extra_norms.q_norm)?,
                    k_norm: opt(&l.extra_norms.k_norm)?,
                    post_attn_norm: opt(&l.extra_norms.post_attn_norm)?,
                    post_ffn_norm: opt(&l.extra_norms.post_ffn_norm)?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let w = WeightsOnDevice {
            token_embd: m(&weights.token_embd)?,
            layers,
            output_norm: norm_weight(&dev, &weights.output_norm)?,
            output: weights.output.as_ref().map(m).transpose()?,
        };
        dev.warm_up()?;
        let persist = persist::Persist::new(&dev, &w, c)?;
        Ok(CudaForward {
            dev,
            config: c.clone(),
            precision,
            acts,
            w,
            caches: BTreeMap::new(),
            scratch: None,
            ring: TapRing::default(),
            logits_host: None,
            step_host: None,
            graph_copies: !matches!(
                std::env::var("TAPTREE_CUDA_GRAPH_COPIES").as_deref(),
                Ok("0" | "off")
            ),
            mapped_step: !matches!(
                std::env::var("TAPTREE_CUDA_MAPPED_STEP").as_deref(),
                Ok("0" | "off")
            ),
            logits: LOGITS,
            shared_rope_base: shared_rope_base(c),
            graphs: !matches!(
                std::env::var("TAPTREE_CUDA_GRAPHS").as_deref(),
                Ok("0" | "off")
            ),
            fused: !matches!(
                std::env::var("TAPTREE_CUDA_FUSED").as_deref(),
                Ok("0" | "off")
            ),
            graph: None,
            generation: 0,
            replays: 0,
            mapped_replays: 0,
            fused_runs: 0,
            persist,
            chained: !matches!(
                std::env::var("TAPTREE_CUDA_CHAIN").as_deref(),
                Ok("0" | "off")
            ),
            chain: None,
            chained_steps: 0,
        })
    }

    /// The device this forward runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Runs a single sequence's untapped decode steps as a CUDA graph (the
    /// default; `TAPTREE_CUDA_GRAPHS=0` starts with it off) or launch by
    /// launch. Either way the results are the same bits.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on;
        self.graph = None;
    }

    /// Runs an untapped forward of one sequence fused, five launches a
    /// layer (the default; `TAPTREE_CUDA_FUSED=0` starts with it off), or
    /// launch by launch as an armed one. Either way the results are the
    /// same bits.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on;
        self.graph = None;
    }

    /// How the fused pass's kernels are launched (see
    /// [`EarlyLaunch`](super::device::EarlyLaunch)); every mode gives the
    /// same bits. This sets the device's switch, shared by every forward
    /// on it.
    pub fn set_early_launch(&mut self, mode: super::device::EarlyLaunch) {
        self.dev.set_early_launch(mode);
        self.graph = None;
    }

    /// Puts a decode step's token and position uploads and its logits'
    /// download inside its CUDA graph (the default;
    /// `TAPTREE_CUDA_GRAPH_COPIES=0` starts with it off), or leaves them
    /// calls of their own. Either way the results are the same bits.
    pub fn set_graph_copies(&mut self, on: bool) {
        self.graph_copies = on;
        self.graph = None;
    }

    /// Lets a decode step's graph, where it holds the step's copies and
    /// runs fused, drop the copies: its first launch reads the token and
    /// position from the page-locked step buffer, and the logits' launch
    /// writes into the page-locked logits buffer (the default;
    /// `TAPTREE_CUDA_MAPPED_STEP=0` keeps the copies). Either way the
    /// results are the same bits.
    pub fn set_mapped_step(&mut self, on: bool) {
        self.mapped_step = on;
        self.graph = None;
    }

    /// How the fused pass's logits matmul is spread
    /// ([`ops::matmul_streamed`]: 4 blocks per SM, 2 stages unless set;
    /// 0 blocks for one block per 16 logits, [`ops::matmul_fused`]). Every
    /// choice gives the same bits.
    pub fn set_logits_streaming(&mut self, how: ops::Streaming) {
        self.logits = how;
        self.graph = None;
    }

    /// How many decode steps ran as a graph replay so far.
    pub fn graph_replays(&self) -> u64 {
        self.replays
    }

    /// How many decode steps ran as a mapped graph so far (their token,
    /// position and logits read and written in page-locked memory by the
    /// kernels: [`Self::set_mapped_step`]).
    pub fn mapped_replays(&self) -> u64 {
        self.mapped_replays
    }

    /// How many runs (a prefill, a decode step) ran fused so far.
    pub fn fused_runs(&self) -> u64 {
        self.fused_runs
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ForwardError> {
        crate::forward::check_tokens(&self.config, tokens)
    }

    fn check_group(
        &self,
        slot: Option<u32>,
        rows: usize,
        start: usize,
    ) -> Result<(), ForwardError> {
        let cached = self.caches.get(&slot).map_or(0, |c| c.len);
        crate::forward::check_positions(&self.config, slot, rows, start, cached)
    }

    fn ensure_scratch(&mut self, rows: usize) -> Result<(), CudaError> {
        if self.scratch.as_ref().is_some_and(|s| s.rows >= rows) {
            return Ok(());
        }
        let rows = rows.next_power_of_two();
        let c = &self.config;
        let s = self.dev.stream();
        let a = |n: usize| {
            s.alloc_zeros::<f32>(rows * n)
                .map_err(|e| CudaError::driver("alloc activations", e))
        };
        let (d, qw, kvw) = (c.n_embd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let widest = d.max(qw).max(c.n_ff);
        self.scratch = Some(Scratch {
            rows,
            x: a(d)?,
            x2: a(d)?,
            h: a(d)?,
            q: a(qw)?,
            k: a(kvw)?,
            q2: a(qw)?,
            k2: a(kvw)?,
            v: a(kvw)?,
            att: a(qw)?,
            o: a(d)?,
            g: a(c.n_ff)?,
            u: a(c.n_ff)?,
            s: a(c.n_ff)?,
            dn: a(d)?,
            logits: a(c.vocab_size)?,
            rope: a(c.head_dim)?,
            qa: QuantizedActs::alloc(&self.dev, rows * widest.div_ceil(32) * 32)?,
            tok: s
                .alloc_zeros::<u32>(rows)
                .map_err(|e| CudaError::driver("alloc tokens", e))?,
            pos: s
                .alloc_zeros::<u32>(rows)
                .map_err(|e| CudaError::driver("alloc positions", e))?,
        });
        self.generation += 1;
        Ok(())
    }

    /// Makes the cache of `slot` hold at least `needed` positions, keeping
    /// the first `keep`.
    fn ensure_cache(
        &mut self,
        slot: Option<u32>,
        needed: usize,
        keep: usize,
    ) -> Result<(), CudaError> {
        let c = &self.config;
        let kvw = c.n_head_kv * c.head_dim;
        if self.caches.get(&slot).is_some_and(|k| k.capacity >= needed) {
            if let Some(k) = self.caches.get_mut(&slot) {
                k.len = keep;
            }
            return Ok(());
        }
        let capacity = kv_capacity(c, needed);
        let s = self.dev.stream().clone();
        let alloc = || {
            s.alloc_zeros::<f32>(c.n_layer * capacity * kvw)
                .map_err(|e| CudaError::driver("alloc KV cache", e))
        };
        let (mut k, mut v) = (alloc()?, alloc()?);
        if let Some(old) = self.caches.get(&slot) {
            let n = keep.min(old.len) * kvw;
            for l in 0..c.n_layer {
                let (src, dst) = (l * old.capacity * kvw, l * capacity * kvw);
                s.memcpy_dtod(&old.k.slice(src..src + n), &mut k.slice_mut(dst..dst + n))
                    .map_err(|e| CudaError::driver("grow KV cache", e))?;
                s.memcpy_dtod(&old.v.slice(src..src + n), &mut v.slice_mut(dst..dst + n))
                    .map_err(|e| CudaError::driver("grow KV cache", e))?;
            }
        }
        self.generation += 1;
        self.caches.insert(
            slot,
            KvCache {
                len: keep,
                capacity,
                k,
                v,
            },
        );
        Ok(())
    }

    /// Runs `tokens` as `groups` and returns the logits of each group's last
    /// row: a single sequence's decode step through its CUDA graph when
    /// nothing is tapped, anything else launch by launch.
    fn run(&mut self, tokens: &[u32], groups: &[Group]) -> Result<Vec<Vec<f32>>, CudaError> {
        let rows = tokens.len();
        for g in groups {
            self.ensure_cache(g.slot, g.start_pos + g.rows, g.start_pos)?;
        }
        self.ensure_scratch(rows)?;
        let positions: Vec<u32> = groups.iter().flat_map(|g| g.pos()).collect();
        if self.fusable(groups, rows) {
            self.fused_runs += 1;
        }
        let graphable = self.graphs && groups.len() == 1 && rows == 1 && !capture::is_armed();
        let copies = graphable && self.graph_copies;
        if copies {
            self.ensure_host_buffers()?;
            self.set_step_inputs(tokens[0], positions[0])?;
        } else {
            let sc = self.scratch.as_mut().expect("scratch allocated above");
            let s = self.dev.stream();
            let up = |e| CudaError::driver("copy tokens to device", e);
            s.memcpy_htod(tokens, &mut sc.tok.slice_mut(..rows))
                .map_err(up)?;
            s.memcpy_htod(&positions, &mut sc.pos.slice_mut(..rows))
                .map_err(up)?;
        }
        if graphable {
            self.replay_decode(groups, copies)?;
        } else {
            self.encode(groups, rows, false)?;
        }
        for g in groups {
            if let Some(cache) = self.caches.get_mut(&g.slot) {
                cache.len = g.start_pos + g.rows;
            }
        }
        self.ring.drain()?;
        if copies {
            return Ok(vec![self.graph_logits()?]);
        }
        groups
            .iter()
            .map(|g| self.logits_of(g.row + g.rows - 1))
            .collect()
    }
}

impl Forward for CudaForward {
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
        self.check_tokens(tokens)?;
        self.check_group(slot, tokens.len(), start_pos)?;
        let group = Group {
            slot,
            row: 0,
            rows: tokens.len(),
            start_pos,
        };
        let mut logits = self.run(tokens, &[group])?;
        Ok(logits.pop().expect("one group, one row of logits"))
    }

    /// One forward over all slots: every matmul, norm and elementwise op runs
    /// once over the `m` rows; attention and the cache writes run per slot.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        if tokens.len() != positions.len() {
            return Err(ForwardError::Unsupported(format!(
                "decode batch of {} tokens for {} positions",
                tokens.len(),
                positions.len()
            )));
        }
        self.check_tokens(tokens)?;
        let groups: Vec<Group> = positions
            .iter()
            .enumerate()
            .map(|(i, &p)| Group {
                slot: Some(i as u32),
                row: i,
                rows: 1,
                start_pos: p,
            })
            .collect();
        for g in &groups {
            self.check_group(g.slot, 1, g.start_pos)?;
        }
        Ok(self.run(tokens, &groups)?)
    }

    fn greedy_steps(
        &mut self,
        first: u32,
        pos: usize,
        steps: usize,
        stop: &[u32],
    ) -> Option<Result<Vec<u32>, ForwardError>> {
        self.greedy_chain(first, pos, steps, stop).transpose()
    }

    fn reset(&mut self) {
        self.caches.clear();
        self.graph = None;
        self.generation += 1;
    }
}
