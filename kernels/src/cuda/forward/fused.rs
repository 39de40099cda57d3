//! The fused pass: an unarmed forward of one sequence (decode's CUDA graph
//! among them) in five launches per layer instead of twelve, each bitwise
//! the unfused launches' result (`cuda_forward.rs::fused_equals_unfused`).
//!
//! A layer: attn_norm, q/k/v, RoPE and the cache write in one launch
//! ([`ops::qkv_rope_tabled`], RoPE's cosines and sines computed once per
//! forward by [`ops::rope_table`]); attention split over 16-dimension
//! slices of each head ([`ops::attention_split_at`], which also asks L2 for
//! the weights of the layer's three matmuls after it); o_proj and the residual add
//! ([`ops::matmul_fused`]); ffn_norm, gate/up and SwiGLU
//! ([`ops::gate_up_swiglu`]); ffn_down and the residual add. The output
//! norm runs inside the logits' matmul
//! ([`ops::matmul_streamed`]: a few blocks per SM, each normalizing once). The intermediate tensors the taps
//! name (a norm's output, q/k/v before RoPE, gate and up, o_proj and
//! ffn_down before their adds) are never written, so an armed forward runs
//! unfused (`encode.rs`), as do the forms this pass does not cover: several
//! sequences at once, int8 activations, the families with q/k norms, post
//! norms, RoPE over halves or GeGLU (Gemma 3).

use super::{CudaForward, Group, KvCache, Scratch, StepIo, WeightsOnDevice};
use crate::cuda::device::Device;
use crate::cuda::ops::{self, AttentionShape, Norm, QkvOut};
use crate::cuda::CudaError;
use model::{FfnActivation, LlamaConfig, RopeStyle};

impl CudaForward {
    /// Whether [`Self::encode_fused`] can run `groups` (`rows` rows): fusion
    /// on, no tap armed, one sequence, f32 activations everywhere, a llama
    /// layer (no extra norm weights either), and the widest input's rows fitting a block's shared memory.
    pub(super) fn fusable(&self, groups: &[Group], rows: usize) -> bool {
        let c = &self.config;
        let f = &c.family;
        let a = self.acts;
        let widest = c.n_embd.max(c.n_head * c.head_dim).max(c.n_ff);
        self.fused
            && !capture::is_armed()
            && groups.len() == 1
            && !(a.attn || a.ffn_up || a.ffn_down || a.logits)
            && !f.qk_norm
            && !f.post_norms
            && self.w.layers.iter().all(|l| {
                // The tapped pass applies these norms wherever their
                // weights exist, whatever the family says.
                l.q_norm.is_none()
                    && l.k_norm.is_none()
                    && l.post_attn_norm.is_none()
                    && l.post_ffn_norm.is_none()
            })
            && f.rope == RopeStyle::Interleaved
            && f.ffn == FfnActivation::Silu
            && c.head_dim.is_multiple_of(2)
            && ops::fused_fits(widest, rows)
    }

    /// The forward over one group's `rows` rows, fused (see the module
    /// comment). With `graphed`, attention sizes its scores for the cache's
    /// whole capacity, as in the unfused pass.
    pub(super) fn encode_fused(
        &mut self,
        groups: &[Group],
        rows: usize,
        graphed: bool,
        io: StepIo,
    ) -> Result<(), CudaError> {
        let dev = self.dev.clone();
        let c = self.config.clone();
        let g = &groups[0];
        let d = c.n_embd;
        let w = &self.w;
        let sc = self
            .scratch
            .as_mut()
            .expect("scratch allocated before encode");
        let cache = self.caches.get_mut(&g.slot).expect("cache ensured above");
        let max_keys = if graphed {
            cache.capacity
        } else {
            g.start_pos + g.rows
        };
        match io {
            StepIo::Device => {
                super::encode::embed(&dev, &c, &w.token_embd, sc, rows)?;
                // RoPE's cosines and sines once for every layer, where they
                // share a base (else each launch computes its own).
                if let Some(base) = self.shared_rope_base {
                    let table = &mut sc.rope.slice_mut(..rows * c.head_dim);
                    ops::rope_table(&dev, &sc.pos.slice(..rows), table, rows, c.head_dim, base)?;
                }
            }
            StepIo::Mapped { input, .. } | StepIo::Chained { input, .. } => {
                let mut table = sc.rope.slice_mut(..c.head_dim);
                let rope = self.shared_rope_base.map(|b| (&mut table, b));
                // SAFETY: `input` is the step buffer's device address, as
                // `StepIo::Mapped` and `StepIo::Chained` vouch.
                unsafe {
                    ops::step_start(
                        &dev,
                        input,
                        &mut sc.pos.slice_mut(..1),
                        &w.token_embd,
                        &mut sc.x.slice_mut(..d),
                        rope,
                        c.head_dim,
                    )
                }?;
            }
        }
        let tabled = self.shared_rope_base.is_some();
        let persisted = rows == 1
            && super::persist::layers(&dev, &mut self.persist, &c, sc, cache, g.start_pos, tabled)?;
        if !persisted {
            layers_fused(&dev, &c, w, sc, cache, g, rows, max_keys, tabled)?;
        }
        let output_norm = w.output_norm.as_view();
        let norm = Some(Norm {
            weight: &output_norm,
            eps: c.rms_eps,
        });
        let x = sc.x.slice(..rows * d);
        match io {
            StepIo::Device => ops::matmul_streamed(
                &dev,
                w.output(),
                &x,
                norm,
                &mut sc.logits.slice_mut(..rows * c.vocab_size),
                rows,
                self.logits,
            ),
            // SAFETY: `logits` is the logits buffer's device address, as
            // `StepIo::Mapped` vouches.
            StepIo::Mapped { logits, .. } => unsafe {
                ops::matmul_streamed_mapped(&dev, w.output(), &x, norm, logits, rows, self.logits)
            },
            StepIo::Chained { input, toks } => {
                let logits = &mut sc.logits.slice_mut(..c.vocab_size);
                ops::matmul_streamed(&dev, w.output(), &x, norm, logits, 1, self.logits)?;
                // SAFETY: `input` and `toks` as `StepIo::Chained` vouches.
                unsafe { ops::step_next(&dev, &sc.logits.slice(..c.vocab_size), input, toks) }
            }
        }
    }
}

/// The layers of a fused forward, five launches each (see the module
/// comment): `sc.x` in, the last layer's output in `sc.x`.
#[allow(clippy::too_many_arguments)]
fn layers_fused(
    dev: &Device,
    c: &LlamaConfig,
    w: &WeightsOnDevice,
    sc: &mut Scratch,
    cache: &mut KvCache,
    g: &Group,
    rows: usize,
    max_keys: usize,
    tabled: bool,
) -> Result<(), CudaError> {
    let (d, qw, kvw, ff) = (
        c.n_embd,
        c.n_head * c.head_dim,
        c.n_head_kv * c.head_dim,
        c.n_ff,
    );
    let pos = sc.pos.slice(..rows);
    let table = sc.rope.slice(..rows * c.head_dim);
    let table = tabled.then_some(&table);
    for (l, lw) in w.layers.iter().enumerate() {
        let la = c.family.attention(l, c.rope_base);
        let layer = l * cache.capacity * kvw..(l + 1) * cache.capacity * kvw;
        let attn_norm = lw.attn_norm.as_view();
        ops::qkv_rope_tabled(
            dev,
            [&lw.wq, &lw.wk, &lw.wv],
            &sc.x.slice(..rows * d),
            Some(Norm {
                weight: &attn_norm,
                eps: c.rms_eps,
            }),
            QkvOut {
                q: &mut sc.q.slice_mut(..rows * qw),
                k_cache: &mut cache.k.slice_mut(layer.clone()),
                v_cache: &mut cache.v.slice_mut(layer.clone()),
            },
            &pos,
            table,
            c.head_dim,
            la.rope_base,
            rows,
        )?;
        ops::attention_split_at(
            dev,
            &sc.q.slice(..rows * qw),
            &cache.k.slice(layer.clone()),
            &cache.v.slice(layer),
            &mut sc.att.slice_mut(..rows * qw),
            &pos,
            AttentionShape {
                rows,
                pos0: g.start_pos,
                n_head: c.n_head,
                n_kv: c.n_head_kv,
                head_dim: c.head_dim,
            },
            la.window,
            max_keys,
            &[&lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down],
        )?;
        ops::matmul_fused(
            dev,
            &lw.wo,
            &sc.att.slice(..rows * qw),
            None,
            Some(&sc.x.slice(..rows * d)),
            &mut sc.x2.slice_mut(..rows * d),
            rows,
        )?;
        let ffn_norm = lw.ffn_norm.as_view();
        ops::gate_up_swiglu(
            dev,
            &lw.w_gate,
            &lw.w_up,
            &sc.x2.slice(..rows * d),
            Some(Norm {
                weight: &ffn_norm,
                eps: c.rms_eps,
            }),
            &mut sc.s.slice_mut(..rows * ff),
            rows,
        )?;
        ops::matmul_fused(
            dev,
            &lw.w_down,
            &sc.s.slice(..rows * ff),
            None,
            Some(&sc.x2.slice(..rows * d)),
            &mut sc.x.slice_mut(..rows * d),
            rows,
        )?;
    }
    Ok(())
}
