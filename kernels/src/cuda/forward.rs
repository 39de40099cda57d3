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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PinnedHostSlice};

use super::device::Device;
use super::ops::{self, AttentionShape, DeviceMatrix, QuantizedActs};
use super::CudaError;
use crate::forward::{Forward, ForwardError, Precision};
use crate::stages as st;
use crate::switches::{ActPrecision, Family, Switches};
use model::{FfnActivation, LlamaConfig, ModelWeights, QTensor};

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
    qa: QuantizedActs,
}

/// Whether each matmul family sees int8 activations.
#[derive(Debug, Clone, Copy)]
struct Acts {
    attn: bool,
    ffn_up: bool,
    ffn_down: bool,
    logits: bool,
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
    /// Page-locked host memory the taps copy through: a device-to-host copy
    /// into pageable memory runs at a fraction of the bus's speed.
    staging: Option<PinnedHostSlice<f32>>,
}

fn norm_weight(dev: &Device, t: &QTensor) -> Result<CudaSlice<f32>, CudaError> {
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
        crate::forward::check_config(c)?;
        switches.check(precision)?;
        if weights
            .layers
            .iter()
            .any(|l| l.bq.is_some() || l.bk.is_some() || l.bv.is_some())
        {
            return Err(ForwardError::Unsupported(
                "cuda: q/k/v projection biases (Qwen2) run on the cpu backend only".into(),
            ));
        }
        let q8 = |f| switches.resolve(f, precision) == ActPrecision::Q8;
        let acts = Acts {
            attn: q8(Family::Attn),
            ffn_up: q8(Family::FfnUp),
            ffn_down: q8(Family::FfnDown),
            logits: q8(Family::Logits),
        };
        if let Some(t) = k_quant_under_q8(weights, acts) {
            return Err(ForwardError::Unsupported(format!(
                "cuda: int8 activations against K-quant weights ({}, {}: Q8_K blocks of 256) run on the cpu backend only; use --precision f32",
                t.name, t.ggml_type
            )));
        }
        let fam = &c.family;
        if fam.qk_norm
            && weights
                .layers
                .iter()
                .any(|l| l.extra_norms.q_norm.is_none() || l.extra_norms.k_norm.is_none())
        {
            return Err(ForwardError::Unsupported(format!(
                "cuda: the {} family has q/k norms but a layer lacks their weights",
                c.arch
            )));
        }
        if fam.post_norms
            && weights.layers.iter().any(|l| {
                l.extra_norms.post_attn_norm.is_none() || l.extra_norms.post_ffn_norm.is_none()
            })
        {
            return Err(ForwardError::Unsupported(format!(
                "cuda: the {} family has post norms but a layer lacks their weights",
                c.arch
            )));
        }
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
        Ok(CudaForward {
            dev,
            config: c.clone(),
            precision,
            acts,
            w,
            caches: BTreeMap::new(),
            scratch: None,
            staging: None,
        })
    }

    /// The device this forward runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
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
            qa: QuantizedActs::alloc(&self.dev, rows * widest.div_ceil(32) * 32)?,
        });
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
        let capacity = needed
            .next_power_of_two()
            .max(64)
            .min(c.context_length.max(needed));
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

    /// Runs `tokens` as `groups` and returns the logits of each group's last row.
    fn run(&mut self, tokens: &[u32], groups: &[Group]) -> Result<Vec<Vec<f32>>, CudaError> {
        let rows = tokens.len();
        for g in groups {
            self.ensure_cache(g.slot, g.start_pos + g.rows, g.start_pos)?;
        }
        self.ensure_scratch(rows)?;
        let dev = self.dev.clone();
        let c = self.config.clone();
        let (d, qw, kvw, ff) = (
            c.n_embd,
            c.n_head * c.head_dim,
            c.n_head_kv * c.head_dim,
            c.n_ff,
        );
        let acts = self.acts;
        let w = &self.w;
        let caches = &mut self.caches;
        let sc = self.scratch.as_mut().expect("scratch allocated above");
        let mut taps = Taps {
            dev: &dev,
            groups,
            staging: &mut self.staging,
        };

        let positions: Vec<u32> = groups.iter().flat_map(|g| g.pos()).collect();
        let tok_dev = ops::upload(&dev, tokens)?;
        let pos_dev = ops::upload(&dev, &positions)?;

        ops::embedding(
            &dev,
            &w.token_embd,
            &tok_dev.as_view(),
            &mut sc.x.slice_mut(..rows * d),
        )?;
        let fam = &c.family;
        if fam.embed_scale {
            // Rounded to f32 first, as the CPU forward does.
            let scale = (d as f64).sqrt() as f32;
            ops::scale(&dev, &mut sc.x.slice_mut(..rows * d), scale, rows * d)?;
        }
        taps.tap(st::EMBEDDING, None, &sc.x, d)?;

        for (l, lw) in w.layers.iter().enumerate() {
            let li = Some(l as u32);
            ops::rms_norm(
                &dev,
                &sc.x.as_view(),
                &lw.attn_norm.as_view(),
                &mut sc.h.slice_mut(..),
                rows,
                c.rms_eps,
            )?;
            taps.tap(st::ATTN_NORM, li, &sc.h, d)?;
            matmuls(
                &dev,
                &[&lw.wq, &lw.wk, &lw.wv],
                &sc.h,
                &mut [sc.q.slice_mut(..), sc.k.slice_mut(..), sc.v.slice_mut(..)],
                &mut sc.qa,
                rows,
                acts.attn,
            )?;
            taps.tap(st::Q_PROJ, li, &sc.q, qw)?;
            taps.tap(st::K_PROJ, li, &sc.k, kvw)?;
            taps.tap(st::V_PROJ, li, &sc.v, kvw)?;
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                // One norm per head: rows of head_dim.
                ops::rms_norm(
                    &dev,
                    &sc.q.slice(..rows * qw),
                    &qn.as_view(),
                    &mut sc.q2.slice_mut(..rows * qw),
                    rows * c.n_head,
                    c.rms_eps,
                )?;
                std::mem::swap(&mut sc.q, &mut sc.q2);
                taps.tap(st::Q_NORM, li, &sc.q, qw)?;
                ops::rms_norm(
                    &dev,
                    &sc.k.slice(..rows * kvw),
                    &kn.as_view(),
                    &mut sc.k2.slice_mut(..rows * kvw),
                    rows * c.n_head_kv,
                    c.rms_eps,
                )?;
                std::mem::swap(&mut sc.k, &mut sc.k2);
                taps.tap(st::K_NORM, li, &sc.k, kvw)?;
            }
            let la = fam.attention(l, c.rope_base);
            ops::rope_qk_styled(
                &dev,
                fam.rope,
                &mut sc.q.slice_mut(..rows * qw),
                &mut sc.k.slice_mut(..rows * kvw),
                &pos_dev.as_view(),
                c.n_head,
                c.n_head_kv,
                c.head_dim,
                la.rope_base,
            )?;
            taps.tap(st::Q_ROPE, li, &sc.q, qw)?;
            taps.tap(st::K_ROPE, li, &sc.k, kvw)?;

            for g in groups {
                let cache = caches.get_mut(&g.slot).expect("cache ensured above");
                let base = l * cache.capacity * kvw;
                let dst = base + g.start_pos * kvw..base + (g.start_pos + g.rows) * kvw;
                let src = g.row * kvw..(g.row + g.rows) * kvw;
                let s = dev.stream();
                s.memcpy_dtod(
                    &sc.k.slice(src.clone()),
                    &mut cache.k.slice_mut(dst.clone()),
                )
                .map_err(|e| CudaError::driver("write K cache", e))?;
                s.memcpy_dtod(&sc.v.slice(src), &mut cache.v.slice_mut(dst))
                    .map_err(|e| CudaError::driver("write V cache", e))?;
                let keys = base..base + (g.start_pos + g.rows) * kvw;
                ops::attention_windowed(
                    &dev,
                    &sc.q.slice(g.row * qw..(g.row + g.rows) * qw),
                    &cache.k.slice(keys.clone()),
                    &cache.v.slice(keys),
                    &mut sc.att.slice_mut(g.row * qw..(g.row + g.rows) * qw),
                    AttentionShape {
                        rows: g.rows,
                        pos0: g.start_pos,
                        n_head: c.n_head,
                        n_kv: c.n_head_kv,
                        head_dim: c.head_dim,
                    },
                    la.window,
                )?;
            }
            taps.tap(st::ATTN, li, &sc.att, qw)?;
            matmul(
                &dev, &lw.wo, &sc.att, &mut sc.o, &mut sc.qa, rows, acts.attn,
            )?;
            taps.tap(st::O_PROJ, li, &sc.o, d)?;
            // After o_proj its input h is spent: the post norm writes there.
            let o = match &lw.post_attn_norm {
                Some(pn) => {
                    ops::rms_norm(
                        &dev,
                        &sc.o.as_view(),
                        &pn.as_view(),
                        &mut sc.h.slice_mut(..),
                        rows,
                        c.rms_eps,
                    )?;
                    taps.tap(st::POST_ATTN_NORM, li, &sc.h, d)?;
                    &sc.h
                }
                None => &sc.o,
            };
            ops::add(
                &dev,
                &sc.x.as_view(),
                &o.as_view(),
                &mut sc.x2.slice_mut(..),
                rows * d,
            )?;
            taps.tap(st::POST_ATTN_RESIDUAL, li, &sc.x2, d)?;

            ops::rms_norm(
                &dev,
                &sc.x2.as_view(),
                &lw.ffn_norm.as_view(),
                &mut sc.h.slice_mut(..),
                rows,
                c.rms_eps,
            )?;
            taps.tap(st::FFN_NORM, li, &sc.h, d)?;
            matmuls(
                &dev,
                &[&lw.w_gate, &lw.w_up],
                &sc.h,
                &mut [sc.g.slice_mut(..), sc.u.slice_mut(..)],
                &mut sc.qa,
                rows,
                acts.ffn_up,
            )?;
            taps.tap(st::FFN_GATE, li, &sc.g, ff)?;
            taps.tap(st::FFN_UP, li, &sc.u, ff)?;
            let (gate, stage) = match fam.ffn {
                FfnActivation::Silu => (ops::swiglu as GateOp, st::FFN_SWIGLU),
                FfnActivation::GeluTanh => (ops::geglu as GateOp, st::FFN_GEGLU),
            };
            gate(
                &dev,
                &sc.g.as_view(),
                &sc.u.as_view(),
                &mut sc.s.slice_mut(..),
                rows * ff,
            )?;
            taps.tap(stage, li, &sc.s, ff)?;
            matmul(
                &dev,
                &lw.w_down,
                &sc.s,
                &mut sc.dn,
                &mut sc.qa,
                rows,
                acts.ffn_down,
            )?;
            taps.tap(st::FFN_DOWN, li, &sc.dn, d)?;
            let dn = match &lw.post_ffn_norm {
                Some(pn) => {
                    ops::rms_norm(
                        &dev,
                        &sc.dn.as_view(),
                        &pn.as_view(),
                        &mut sc.h.slice_mut(..),
                        rows,
                        c.rms_eps,
                    )?;
                    taps.tap(st::POST_FFN_NORM, li, &sc.h, d)?;
                    &sc.h
                }
                None => &sc.dn,
            };
            ops::add(
                &dev,
                &sc.x2.as_view(),
                &dn.as_view(),
                &mut sc.x.slice_mut(..),
                rows * d,
            )?;
            taps.tap(st::POST_FFN_RESIDUAL, li, &sc.x, d)?;
        }
        for g in groups {
            if let Some(cache) = caches.get_mut(&g.slot) {
                cache.len = g.start_pos + g.rows;
            }
        }

        ops::rms_norm(
            &dev,
            &sc.x.as_view(),
            &w.output_norm.as_view(),
            &mut sc.h.slice_mut(..),
            rows,
            c.rms_eps,
        )?;
        taps.tap(st::FINAL_NORM, None, &sc.h, d)?;
        matmul(
            &dev,
            w.output(),
            &sc.h,
            &mut sc.logits,
            &mut sc.qa,
            rows,
            acts.logits,
        )?;
        taps.tap(st::LOGITS, None, &sc.logits, c.vocab_size)?;

        groups
            .iter()
            .map(|g| {
                let last = g.row + g.rows - 1;
                ops::download(
                    &dev,
                    &sc.logits
                        .slice(last * c.vocab_size..(last + 1) * c.vocab_size),
                )
            })
            .collect()
    }
}

/// The gated product of the FFN: `ops::swiglu` or `ops::geglu`.
type GateOp = fn(
    &Device,
    &CudaView<f32>,
    &CudaView<f32>,
    &mut CudaViewMut<f32>,
    usize,
) -> Result<(), CudaError>;

/// The first K-quant weight a family with int8 activations would multiply:
/// the CPU quantizes those activations to Q8_K (blocks of 256), which the
/// kernels here do not.
fn k_quant_under_q8(w: &ModelWeights, acts: Acts) -> Option<&QTensor> {
    let k = |t: &&QTensor| t.ggml_type.block_size() == 256;
    let attn = w.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo]);
    let up = w.layers.iter().flat_map(|l| [&l.w_gate, &l.w_up]);
    let down = w.layers.iter().map(|l| &l.w_down);
    let logits = std::iter::once(w.output.as_ref().unwrap_or(&w.token_embd));
    let mut found = None;
    for (on, mut ts) in [
        (
            acts.attn,
            Box::new(attn) as Box<dyn Iterator<Item = &QTensor>>,
        ),
        (acts.ffn_up, Box::new(up)),
        (acts.ffn_down, Box::new(down)),
        (acts.logits, Box::new(logits)),
    ] {
        if on && found.is_none() {
            found = ts.find(k);
        }
    }
    found
}

/// `y = x W^T`, through int8 activations when `q8` and the weight is
/// block-quantized (float weights have no integer dot product to feed).
fn matmul(
    dev: &Device,
    w: &DeviceMatrix,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    qa: &mut QuantizedActs,
    rows: usize,
    q8: bool,
) -> Result<(), CudaError> {
    matmuls(dev, &[w], x, &mut [y.slice_mut(..)], qa, rows, q8)
}

/// `ys[i] = x W_i^T` for matrices sharing their input: in f32 one launch for
/// all of them; in q8 the input quantized once, then one integer matmul each.
fn matmuls(
    dev: &Device,
    ws: &[&DeviceMatrix],
    x: &CudaSlice<f32>,
    ys: &mut [CudaViewMut<f32>],
    qa: &mut QuantizedActs,
    rows: usize,
    q8: bool,
) -> Result<(), CudaError> {
    let cols = ws[0].cols;
    let x = x.slice(..rows * cols);
    if q8 && ws.iter().any(|w| w.ggml_type.is_quantized()) {
        ops::quantize_q8(dev, &x, qa, rows * cols)?;
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            if w.ggml_type.is_quantized() {
                ops::matmul_q8(dev, w, qa, y, rows)?;
            } else {
                ops::matmul_f32(dev, w, &x, y, rows)?;
            }
        }
        Ok(())
    } else if ws.len() > 1 {
        ops::matmul_f32_many(dev, ws, &x, ys, rows)
    } else {
        ops::matmul_f32(dev, ws[0], &x, &mut ys[0], rows)
    }
}

static TAP_COPY_BYTES: AtomicU64 = AtomicU64::new(0);
static TAP_COPY_NANOS: AtomicU64 = AtomicU64::new(0);

/// Bytes the GPU taps copied to the host so far in this process, and the
/// time those copies took (the device-to-host copy alone: the stream is
/// drained before the clock starts, and the hand-off to the capture writer
/// is not counted). The tap throughput of docs/PERFORMANCE.md.
pub fn tap_copy_stats() -> (u64, Duration) {
    (
        TAP_COPY_BYTES.load(Ordering::Relaxed),
        Duration::from_nanos(TAP_COPY_NANOS.load(Ordering::Relaxed)),
    )
}

/// The taps of one run: its device, its row groups, the staging buffer.
struct Taps<'a> {
    dev: &'a Device,
    groups: &'a [Group],
    staging: &'a mut Option<PinnedHostSlice<f32>>,
}

impl Taps<'_> {
    /// Taps `buf` (`[rows, width]` over all groups) once per group: the copy
    /// to the host happens only for the groups the capture wants.
    fn tap(
        &mut self,
        stage: &str,
        layer: Option<u32>,
        buf: &CudaSlice<f32>,
        width: usize,
    ) -> Result<(), CudaError> {
        if !capture::is_armed() {
            return Ok(());
        }
        for g in self.groups {
            if !capture::wants(stage, layer, g.pos(), g.slot) {
                continue;
            }
            let n = g.rows * width;
            let view: CudaView<f32> = buf.slice(g.row * width..g.row * width + n);
            let s = self.dev.stream();
            let sync = |e| CudaError::driver("synchronize", e);
            s.synchronize().map_err(sync)?;
            if self.staging.as_ref().is_none_or(|p| p.len() < n) {
                // SAFETY: page-locked memory of n.next_power_of_two() floats;
                // only the part a copy has just written is ever read.
                let p = unsafe {
                    self.dev
                        .context()
                        .alloc_pinned_with_flags::<f32>(n.next_power_of_two(), 0)
                }
                .map_err(|e| CudaError::driver("alloc pinned tap buffer", e))?;
                *self.staging = Some(p);
            }
            let pinned = self.staging.as_mut().expect("staging allocated above");
            // An exact-length slice: cudarc copies as many elements as the
            // destination holds.
            let host = &mut pinned
                .as_mut_slice()
                .map_err(|e| CudaError::driver("pinned tap buffer", e))?[..n];
            let t0 = Instant::now();
            s.memcpy_dtoh(&view, host)
                .map_err(|e| CudaError::driver("copy tap to host", e))?;
            s.synchronize().map_err(sync)?;
            TAP_COPY_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            TAP_COPY_BYTES.fetch_add((n * 4) as u64, Ordering::Relaxed);
            capture::tap(stage, layer, g.pos(), g.slot, &[g.rows, width], host);
        }
        Ok(())
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

    fn reset(&mut self) {
        self.caches.clear();
    }
}
