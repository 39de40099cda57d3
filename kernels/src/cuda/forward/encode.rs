//! One pass of the CUDA forward over a run's rows: the kernels launched in
//! forward order, each stage tapped as it is written. `encode` walks the
//! layers; a layer is its attention half (norm, projections, RoPE, the cache
//! and attention, o_proj and the residual) and its FFN half.

use std::collections::BTreeMap;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use super::{Acts, CudaForward, Group, KvCache, LayerOnDevice, Scratch};
use crate::cuda::device::Device;
use crate::cuda::ops::{self, AttentionShape, DeviceMatrix, QuantizedActs};
use crate::cuda::q8::{self, Q8Dot};
use crate::cuda::taps::TapRing;
use crate::cuda::CudaError;
use crate::stages as st;
use model::{FfnActivation, LayerAttention, LlamaConfig};

impl CudaForward {
    /// Launches the whole forward over `groups` (`rows` rows), tapping each
    /// stage; fused (`fused.rs`) where nothing is tapped and the run allows. With `graphed`, attention sizes its scores for the cache's
    /// whole capacity (a graph replays at later positions).
    pub(super) fn encode(
        &mut self,
        groups: &[Group],
        rows: usize,
        graphed: bool,
    ) -> Result<(), CudaError> {
        if self.fusable(groups, rows) {
            return self.encode_fused(groups, rows, graphed, super::StepIo::Device);
        }
        let dev = self.dev.clone();
        let c = self.config.clone();
        let d = c.n_embd;
        let w = &self.w;
        let sc = self
            .scratch
            .as_mut()
            .expect("scratch allocated before encode");
        let mut taps = Taps {
            dev: &dev,
            groups,
            ring: &mut self.ring,
        };

        embed(&dev, &c, &w.token_embd, sc, rows)?;
        taps.tap(st::EMBEDDING, None, &sc.x, d)?;

        for (l, lw) in w.layers.iter().enumerate() {
            let layer = Layer {
                dev: &dev,
                c: &c,
                acts: self.acts,
                l,
                la: c.family.attention(l, c.rope_base),
                lw,
                rows,
                graphed,
            };
            layer.qkv(sc, &mut taps)?;
            layer.attend(sc, &mut self.caches, groups)?;
            layer.attn_out(sc, &mut taps)?;
            layer.ffn(sc, &mut taps)?;
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
            self.acts.logits,
        )?;
        taps.tap(st::LOGITS, None, &sc.logits, c.vocab_size)
    }
}

/// The run's token rows embedded into `sc.x` (scaled where the family
/// scales them): the first launches of both passes.
pub(super) fn embed(
    dev: &Device,
    c: &LlamaConfig,
    table: &DeviceMatrix,
    sc: &mut Scratch,
    rows: usize,
) -> Result<(), CudaError> {
    let d = c.n_embd;
    ops::embedding(
        dev,
        table,
        &sc.tok.slice(..rows),
        &mut sc.x.slice_mut(..rows * d),
    )?;
    if c.family.embed_scale {
        // Rounded to f32 first, as the CPU forward does.
        let scale = (d as f64).sqrt() as f32;
        ops::scale(dev, &mut sc.x.slice_mut(..rows * d), scale, rows * d)?;
    }
    Ok(())
}

/// One layer of one pass: what its launches need besides the buffers.
struct Layer<'a> {
    dev: &'a Device,
    c: &'a LlamaConfig,
    acts: Acts,
    l: usize,
    /// The layer's RoPE base and window.
    la: LayerAttention,
    lw: &'a LayerOnDevice,
    rows: usize,
    graphed: bool,
}

impl Layer<'_> {
    fn li(&self) -> Option<u32> {
        Some(self.l as u32)
    }

    /// attn_norm, q/k/v, the q/k norms where the family has them, RoPE.
    fn qkv(&self, sc: &mut Scratch, taps: &mut Taps) -> Result<(), CudaError> {
        let (dev, c, lw, rows, li) = (self.dev, self.c, self.lw, self.rows, self.li());
        let (qw, kvw) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        ops::rms_norm(
            dev,
            &sc.x.as_view(),
            &lw.attn_norm.as_view(),
            &mut sc.h.slice_mut(..),
            rows,
            c.rms_eps,
        )?;
        taps.tap(st::ATTN_NORM, li, &sc.h, c.n_embd)?;
        matmuls(
            dev,
            &[&lw.wq, &lw.wk, &lw.wv],
            &sc.h,
            &mut [sc.q.slice_mut(..), sc.k.slice_mut(..), sc.v.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.attn,
        )?;
        taps.tap(st::Q_PROJ, li, &sc.q, qw)?;
        taps.tap(st::K_PROJ, li, &sc.k, kvw)?;
        taps.tap(st::V_PROJ, li, &sc.v, kvw)?;
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            // One norm per head: rows of head_dim.
            ops::rms_norm(
                dev,
                &sc.q.slice(..rows * qw),
                &qn.as_view(),
                &mut sc.q2.slice_mut(..rows * qw),
                rows * c.n_head,
                c.rms_eps,
            )?;
            std::mem::swap(&mut sc.q, &mut sc.q2);
            taps.tap(st::Q_NORM, li, &sc.q, qw)?;
            ops::rms_norm(
                dev,
                &sc.k.slice(..rows * kvw),
                &kn.as_view(),
                &mut sc.k2.slice_mut(..rows * kvw),
                rows * c.n_head_kv,
                c.rms_eps,
            )?;
            std::mem::swap(&mut sc.k, &mut sc.k2);
            taps.tap(st::K_NORM, li, &sc.k, kvw)?;
        }
        ops::rope_qk_styled(
            dev,
            c.family.rope,
            &mut sc.q.slice_mut(..rows * qw),
            &mut sc.k.slice_mut(..rows * kvw),
            &sc.pos.slice(..rows),
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            self.la.rope_base,
        )?;
        taps.tap(st::Q_ROPE, li, &sc.q, qw)?;
        taps.tap(st::K_ROPE, li, &sc.k, kvw)
    }

    /// Each sequence's keys and values written to its cache, then its
    /// queries attending over the cache (into `sc.att`).
    fn attend(
        &self,
        sc: &mut Scratch,
        caches: &mut BTreeMap<Option<u32>, KvCache>,
        groups: &[Group],
    ) -> Result<(), CudaError> {
        let (dev, c, l) = (self.dev, self.c, self.l);
        let (qw, kvw) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let pos_dev = sc.pos.slice(..self.rows);
        for g in groups {
            let cache = caches.get_mut(&g.slot).expect("cache ensured above");
            let layer = l * cache.capacity * kvw..(l + 1) * cache.capacity * kvw;
            let gpos = pos_dev.slice(g.row..g.row + g.rows);
            let src = g.row * kvw..(g.row + g.rows) * kvw;
            ops::kv_write(
                dev,
                &sc.k.slice(src.clone()),
                &sc.v.slice(src),
                &mut cache.k.slice_mut(layer.clone()),
                &mut cache.v.slice_mut(layer.clone()),
                &gpos,
                kvw,
            )?;
            let max_keys = if self.graphed {
                cache.capacity
            } else {
                g.start_pos + g.rows
            };
            ops::attention_at(
                dev,
                &sc.q.slice(g.row * qw..(g.row + g.rows) * qw),
                &cache.k.slice(layer.clone()),
                &cache.v.slice(layer),
                &mut sc.att.slice_mut(g.row * qw..(g.row + g.rows) * qw),
                &gpos,
                AttentionShape {
                    rows: g.rows,
                    pos0: g.start_pos,
                    n_head: c.n_head,
                    n_kv: c.n_head_kv,
                    head_dim: c.head_dim,
                },
                self.la.window,
                max_keys,
            )?;
        }
        Ok(())
    }

    /// attn tapped, o_proj, the post-attention norm where the family has
    /// one, the residual add (into `sc.x2`).
    fn attn_out(&self, sc: &mut Scratch, taps: &mut Taps) -> Result<(), CudaError> {
        let (dev, c, lw, rows, li) = (self.dev, self.c, self.lw, self.rows, self.li());
        let d = c.n_embd;
        taps.tap(st::ATTN, li, &sc.att, c.n_head * c.head_dim)?;
        matmul(
            dev,
            &lw.wo,
            &sc.att,
            &mut sc.o,
            &mut sc.qa,
            rows,
            self.acts.attn,
        )?;
        taps.tap(st::O_PROJ, li, &sc.o, d)?;
        // After o_proj its input h is spent: the post norm writes there.
        let o = match &lw.post_attn_norm {
            Some(pn) => {
                ops::rms_norm(
                    dev,
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
            dev,
            &sc.x.as_view(),
            &o.as_view(),
            &mut sc.x2.slice_mut(..),
            rows * d,
        )?;
        taps.tap(st::POST_ATTN_RESIDUAL, li, &sc.x2, d)
    }

    /// ffn_norm, gate and up, the gated product, down, the post-FFN norm
    /// where the family has one, the residual add (back into `sc.x`).
    fn ffn(&self, sc: &mut Scratch, taps: &mut Taps) -> Result<(), CudaError> {
        let (dev, c, lw, rows, li) = (self.dev, self.c, self.lw, self.rows, self.li());
        let (d, ff) = (c.n_embd, c.n_ff);
        ops::rms_norm(
            dev,
            &sc.x2.as_view(),
            &lw.ffn_norm.as_view(),
            &mut sc.h.slice_mut(..),
            rows,
            c.rms_eps,
        )?;
        taps.tap(st::FFN_NORM, li, &sc.h, d)?;
        matmuls(
            dev,
            &[&lw.w_gate, &lw.w_up],
            &sc.h,
            &mut [sc.g.slice_mut(..), sc.u.slice_mut(..)],
            &mut sc.qa,
            rows,
            self.acts.ffn_up,
        )?;
        taps.tap(st::FFN_GATE, li, &sc.g, ff)?;
        taps.tap(st::FFN_UP, li, &sc.u, ff)?;
        let (gate, stage) = gate_op(c.family.ffn);
        gate(
            dev,
            &sc.g.as_view(),
            &sc.u.as_view(),
            &mut sc.s.slice_mut(..),
            rows * ff,
        )?;
        taps.tap(stage, li, &sc.s, ff)?;
        matmul(
            dev,
            &lw.w_down,
            &sc.s,
            &mut sc.dn,
            &mut sc.qa,
            rows,
            self.acts.ffn_down,
        )?;
        taps.tap(st::FFN_DOWN, li, &sc.dn, d)?;
        let dn = match &lw.post_ffn_norm {
            Some(pn) => {
                ops::rms_norm(
                    dev,
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
            dev,
            &sc.x2.as_view(),
            &dn.as_view(),
            &mut sc.x.slice_mut(..),
            rows * d,
        )?;
        taps.tap(st::POST_FFN_RESIDUAL, li, &sc.x, d)
    }
}

/// The gated product of the FFN: `ops::swiglu` or `ops::geglu`.
pub(crate) type GateOp = fn(
    &Device,
    &CudaView<f32>,
    &CudaView<f32>,
    &mut CudaViewMut<f32>,
    usize,
) -> Result<(), CudaError>;

/// The FFN's gated product for `ffn` and the stage it is tapped as.
pub(crate) fn gate_op(ffn: FfnActivation) -> (GateOp, &'static str) {
    match ffn {
        FfnActivation::Silu => (ops::swiglu as GateOp, st::FFN_SWIGLU),
        FfnActivation::GeluTanh => (ops::geglu as GateOp, st::FFN_GEGLU),
    }
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
pub(crate) fn matmuls(
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
        // The input quantized once per activation format its weights need
        // (Q8_0 blocks of 32, Q8_K blocks of 256), as the CPU does per weight.
        let mut held: Option<usize> = None;
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            let Some(dot) = Q8Dot::of(w.ggml_type) else {
                ops::matmul_f32(dev, w, &x, y, rows)?;
                continue;
            };
            if held != Some(dot.block()) {
                match dot.block() {
                    256 => q8::quantize_q8_k(dev, &x, qa, rows * cols)?,
                    _ => ops::quantize_q8(dev, &x, qa, rows * cols)?,
                }
                held = Some(dot.block());
            }
            match dot {
                Q8Dot::Dp4a => ops::matmul_q8(dev, w, qa, y, rows)?,
                Q8Dot::Ordered { .. } => q8::matmul_q8_ordered(dev, w, qa, y, rows)?,
            }
        }
        Ok(())
    } else if ws.len() > 1 {
        ops::matmul_f32_many(dev, ws, &x, ys, rows)
    } else {
        ops::matmul_f32(dev, ws[0], &x, &mut ys[0], rows)
    }
}

/// The taps of one run: its device, its row groups, the tap ring.
struct Taps<'a> {
    dev: &'a Device,
    groups: &'a [Group],
    ring: &'a mut TapRing,
}

impl Taps<'_> {
    /// Taps `buf` (`[rows, width]` over all groups) once per group: the copy
    /// to the host happens only for the groups the capture wants.
    fn tap(
        &mut self,
        stage: &'static str,
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
            let view = buf.slice(g.row * width..(g.row + g.rows) * width);
            let id = capture::TapId::new(stage, layer, g.pos(), g.slot);
            self.ring.tap(self.dev, id, &view, width)?;
        }
        Ok(())
    }
}
