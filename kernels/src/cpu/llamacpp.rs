//! `--precision llamacpp`: the CPU forward with llama.cpp's own CPU
//! arithmetic wherever it differs from the plain `q8` model of it.
//!
//! Each rule below is read from the llama.cpp that llama-cpp-python 0.3.36
//! vendors (ggml-org/llama.cpp@0c1e57098, built for x86-64 with AVX2, F16C
//! and FMA, with llama-cpp-python's F16 K/V cache):
//!
//! - **Activation blocks** ([`quantize_row`]): a matmul against a Q8_0 weight
//!   quantizes its activations to `block_q8_0`, against Q4_1 to `block_q8_1`,
//!   both through the AVX2 `quantize_row_q8_0`/`q8_1`: `d = amax / 127`
//!   stored as f16, but the values are scaled by `id = 127 / amax` (not
//!   `1 / d`) and rounded half to even (`_mm256_round_ps`), not half away
//!   from zero as the reference `roundf` does; `block_q8_1` adds
//!   `s = f16(d * sum q)`. K-quant weights take Q8_K blocks through
//!   `q8`'s rule, which is `quantize_row_q8_K_ref`, the quantizer the x86
//!   build calls (see `super::llamacpp_gemma` for the repacked Q4_K).
//! - **RoPE** ([`rope`]): `ggml_rope_cache_init` walks the angle in f32,
//!   `theta_{i+1} = theta_i * powf(base, -2 / n_dims)` from `theta_0 = pos`,
//!   and takes `cosf`/`sinf` of that; the reference computes each angle in
//!   f64. The rotation's `x0*cos - x1*sin` is compiled with one FMA each. The difference grows with the position (3.7e-7 relative RMS over
//!   SmolLM2's first 37 positions, ten times what remains with this rule).
//! - **Attention** ([`attention`]): keys and values live in an F16 cache;
//!   `kq = mul_mat(k, q)` converts `q` to f16 (an F16 weight's dot type is
//!   F16), the scores are scaled and soft-maxed in f32 (the sum in f64, as
//!   `ggml_float`, the exponential ggml's vectorized `ggml_v_expf`), and
//!   `kqv = mul_mat(v, kq)` converts the probabilities to f16 before their
//!   dot with the f16 values; both products sum in the lane order of the
//!   kernel llama.cpp picks, on 8 lanes or 16 as the build's vector width
//!   ([`GgmlSimd`], `super::llamacpp_simd`). Each f16 rounding is 2^-11 relative: far above
//!   what an f32 recomputation of the op could tell apart from its truth.
//! - **Flash attention** ([`flash_attention`], `TAPTREE_LLAMACPP_FLASH_ATTN=1`):
//!   the per-row kernel llama.cpp runs for fewer than 64 query rows, whose
//!   softmax-weighted values accumulate in f16. Its tiled f32 kernel for 64
//!   rows or more is not modelled (the forward refuses such a batch).
//!
//! Gemma 3's ops (GeGLU's f16 table, RoPE over halves, the queries scaled
//! before attention, the sliding window: [`AttnGraph`]) are in
//! `super::llamacpp_gemma`.
//!
//! - **Matmuls on Q4_1 and Q8_0 weights** ([`super::llamacpp_dot`]):
//!   llama.cpp's own integer dot, `ggml_vec_dot_q4_1_q8_1` /
//!   `ggml_vec_dot_q8_0_q8_0` (and `tinyBLAS_Q0_AVX`, the same arithmetic,
//!   for a Q8_0 prefill): exact integer block sums over eight lanes, one
//!   FMA per block and lane, llama.cpp's horizontal sum. Every matmul of
//!   SmolLM2 recomputes llama.cpp's bits.
//!
//! What stays as in the reference forward is f32 arithmetic that llama.cpp
//! orders differently: the sums of matmuls on other quantized weights
//! (Q4_0, Q5_0, the K-quants), the norms, SwiGLU's vectorized exponential.
//! That is at most 4.2e-7 relative RMS (Gemma 3's Q4_K o_proj), inside the
//! 1e-6 at which `tests/llamacpp.rs` holds every op of a llama.cpp tree to
//! this forward.

use half::f16;

use super::attention::Heads;
use super::llamacpp_simd::{dot_f16, exp_sum, lanes};
use super::quant_row::QuantRow;
use super::Real;
pub use crate::ggml_build::GgmlSimd;

/// Rounds to f16 and back, round-to-nearest-even (F16C's `vcvtps2ph` with
/// rounding mode 0, which `GGML_CPU_FP32_TO_FP16` is on x86).
#[inline(always)]
pub fn f16_round<T: Real>(v: T) -> T {
    T::from_f32(f16::from_f32(v.to_f32()).to_f32())
}

/// Quantizes `x` per block of `block` as llama.cpp's AVX2
/// `quantize_row_q8_0`/`quantize_row_q8_1` do (see the module doc); blocks
/// of any other size take `q8`'s rule ([`super::quant_row::quantize_row`]).
pub fn quantize_row<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    let mut out = QuantRow::default();
    quantize_row_into(x, block, &mut out);
    out
}

/// [`quantize_row`] written into `out`, whose vectors are reused.
pub fn quantize_row_into<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    if block != 32 {
        return super::quant_row::quantize_row_into(x, block, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if super::rows_avx::block_loops() {
            // SAFETY: AVX2 (and with it SSE4.1's `roundps`) checked.
            return unsafe { quantize_row_avx2(x, block, out) };
        }
    }
    quantize_row_32(x, block, out)
}

/// [`quantize_row_32`] compiled for AVX2, where rounding half to even is an
/// instruction (`roundss`) rather than a call: the same bits.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    quantize_row_32(x, block, out)
}

/// [`quantize_row`] for 32-blocks.
#[inline(always)]
fn quantize_row_32<T: Real>(x: &[T], block: usize, out: &mut QuantRow<T>) {
    assert!(
        x.len().is_multiple_of(block),
        "row of {} is not a multiple of block {block}",
        x.len()
    );
    let nb = x.len() / block;
    out.clear();
    let QuantRow { q, d, s_err } = out;
    q.reserve(x.len());
    d.reserve(nb);
    s_err.reserve(nb);
    for b in x.chunks_exact(block) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
        let scale = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for v in b {
            // |v * id| <= 127 up to one rounding, so no clamp is needed, and
            // ggml has none (`_mm256_packs_epi16` would saturate anyway).
            let r = (v.to_f32() * id).round_ties_even();
            sum += r as i32;
            q.push(T::from_f32(r));
        }
        let stored = f16::from_f32(scale).to_f32();
        let s = f16::from_f32(scale * sum as f32).to_f32();
        d.push(T::from_f32(stored));
        s_err.push(T::from_f64(s as f64 - stored as f64 * sum as f64));
    }
}

/// Interleaved-pair RoPE as ggml's `rope_f32` with llama.cpp's
/// `LLAMA_ROPE_TYPE_NORM` (no scaling): the angle of pair `i` is walked in
/// f32 from the position by `powf(base, -2 / head_dim)` ([`rope_cache`]), and
/// the rotation is done in f32 with `cosf`/`sinf` of it, as GCC compiles
/// ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos` (contracted:
/// `vfmsub231ss`/`vfmadd132ss` in the shipped library): `fma(x0, cos,
/// -(x1*sin))` and `fma(x0, sin, x1*cos)`.
pub fn rope<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    let mut cs = vec![(0f32, 0f32); head_dim / 2];
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        rope_cache(start + r, head_dim, base, &mut cs);
        for head in row.chunks_exact_mut(head_dim) {
            for (i, (c, s)) in cs.iter().enumerate() {
                let (x0, x1) = (head[2 * i].to_f32(), head[2 * i + 1].to_f32());
                head[2 * i] = T::from_f32(x0.mul_add(*c, -(x1 * s)));
                head[2 * i + 1] = T::from_f32(x0.mul_add(*s, x1 * c));
            }
        }
    }
}

/// `ggml_rope_cache_init` without scaling: the `(cosf, sinf)` of each pair's
/// angle at `pos`, the angle walked in f32 from `theta_0 = pos` by
/// `theta_{i+1} = theta_i * powf(base, -2 / head_dim)`.
pub fn rope_cache(pos: usize, head_dim: usize, base: f32, cs: &mut [(f32, f32)]) {
    let theta_scale = base.powf(-2.0f32 / head_dim as f32);
    let mut theta = pos as f32;
    for c in cs.iter_mut() {
        *c = (theta.cos(), theta.sin());
        theta *= theta_scale;
    }
}

/// Where a family's llama.cpp graph applies attention's scale, its mask, and
/// the vector width of the build that runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnGraph {
    /// `Some(s)`: the graph scales the roped queries by `s` in f32
    /// (`ggml_scale`, Gemma 3's `f_attention_scale`) and soft-maxes the
    /// scores unscaled (`kq_scale = 1`); `None`: the scores are scaled by
    /// `kq_scale = 1.0f / sqrtf(head_dim)` (llama).
    pub query_scale: Option<f32>,
    /// Sliding window: a query at `p` sees `p + 1 - window ..= p`
    /// (llama.cpp's `LLAMA_SWA_TYPE_STANDARD` masks `p - p0 >= window`).
    pub window: Option<usize>,
    /// The vector width of the build that runs the graph: the lane order of
    /// its sums (see [`GgmlSimd`]).
    pub simd: GgmlSimd,
}

impl AttnGraph {
    /// llama's graph on a `simd` build: scores scaled by
    /// `1 / sqrt(head_dim)`, causal only.
    pub fn llama(simd: GgmlSimd) -> AttnGraph {
        AttnGraph {
            query_scale: None,
            window: None,
            simd,
        }
    }
}

/// One attention layer's geometry, as both attention kernels index it.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    heads: Heads,
    q_width: usize,
    kv_width: usize,
    group: usize,
    /// The scores' scale: `kq_scale = 1.0f / sqrtf(float(n_embd_head))`,
    /// or 1 when the graph scaled the queries.
    scale: f32,
    /// The queries' scale, applied in f32 before their f16 rounding.
    q_scale: Option<f32>,
    window: Option<usize>,
    /// The build's vector width (the sums' lane order).
    simd: GgmlSimd,
}

impl Geometry {
    fn of(heads: Heads, graph: AttnGraph) -> Geometry {
        Geometry {
            simd: graph.simd,
            heads,
            q_width: heads.n_head * heads.head_dim,
            kv_width: heads.n_head_kv * heads.head_dim,
            group: heads.n_head / heads.n_head_kv,
            scale: match graph.query_scale {
                Some(_) => 1.0,
                None => 1.0f32 / (heads.head_dim as f32).sqrt(),
            },
            q_scale: graph.query_scale,
            window: graph.window,
        }
    }

    /// The first position row `r` (at position `start + r`) sees.
    fn first_seen(&self, start: usize, r: usize) -> usize {
        self.window.map_or(0, |w| (start + r + 1).saturating_sub(w))
    }

    /// Query row `r` of head `h`, scaled in f32 if the graph scales it, then
    /// rounded to f16 (an F16 key's dot type).
    fn query_f16<T: Real>(&self, q: &[T], r: usize, h: usize, out: &mut Vec<f32>) {
        let d = self.heads.head_dim;
        out.clear();
        let q = q[r * self.q_width + h * d..][..d].iter();
        match self.q_scale {
            Some(s) => out.extend(q.map(|x| f16_round(x.to_f32() * s))),
            None => out.extend(q.map(|x| f16_round(x.to_f32()))),
        }
    }

    /// Cached row `t` of KV head `kvh` (keys or values), widened to f32.
    fn cached<T: Real>(&self, kv: &[T], t: usize, kvh: usize, out: &mut Vec<f32>) {
        let d = self.heads.head_dim;
        out.clear();
        out.extend(
            kv[t * self.kv_width + kvh * d..][..d]
                .iter()
                .map(|x| x.to_f32()),
        );
    }

    /// Runs `body(scratch, r, h, kvh, out)` for every query row `r` of `n`
    /// and head `h`, in parallel; `out` is that row's head of the result.
    fn per_head<T: Real, S: Default + Send>(
        &self,
        n: usize,
        body: impl Fn(&mut S, usize, usize, usize, &mut [T]) + Sync + Send,
    ) -> Vec<T> {
        let _p = super::profile::op(super::profile::Op::Attention);
        let mut out = vec![T::ZERO; n * self.q_width];
        // On the forward's team, as its other regions (rayon's threads here
        // would share the cores with the team's, spinning after the q/k/v
        // matmuls); a task's scratch is its own.
        super::par::chunks_map(&mut out, self.heads.head_dim, |i, o| {
            let (r, h) = (i / self.heads.n_head, i % self.heads.n_head);
            body(&mut S::default(), r, h, h / self.group, o)
        });
        out
    }
}

/// llama.cpp's attention without flash attention over an F16 K/V cache:
/// `q` (`[n, n_head * head_dim]`, row `r` at position `start + r`) is
/// rounded to f16, `k` and `v` (`[start + n, n_head_kv * head_dim]`) must
/// already hold f16 values (the cache stores them so: see [`f16_round`]).
/// `kq = mul_mat(k, q)` and `kqv = mul_mat(v, kq)` sum in the order of the
/// kernel llama.cpp runs for `n` rows (`dot_f16`); `soft_max_ext` scales
/// in f32, exponentiates with `ggml_v_expf` and sums per vector into an
/// f64 total; the probabilities are rounded to f16 before they weight the
/// values. Row `r` sees positions `0..=start + r`: the padded, masked cache
/// cells contribute exact zeros in llama.cpp, and do here. llama's graph:
/// [`attention_in`] with [`AttnGraph::llama`].
pub fn attention<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
    simd: GgmlSimd,
) -> Vec<T> {
    attention_in(q, n, start, k, v, heads, AttnGraph::llama(simd))
}

/// [`attention`] in the graph of a family: where the scale is applied, and
/// the sliding window's mask (masked cells are exact zeros, as the padded
/// ones).
pub fn attention_in<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
    graph: AttnGraph,
) -> Vec<T> {
    let g = Geometry::of(heads, graph);
    let (head_dim, cells) = (heads.head_dim, start + n);
    // The values of each KV head transposed, `[head_dim, cells]`: the rows
    // `kqv = mul_mat(v, kq)` dots with the probabilities (the cache keeps
    // V transposed for it).
    let vt: Vec<Vec<f32>> = (0..heads.n_head_kv)
        .map(|h| {
            let mut t = vec![0f32; head_dim * cells];
            for c in 0..cells {
                for d in 0..head_dim {
                    t[d * cells + c] = v[c * g.kv_width + h * head_dim + d].to_f32();
                }
            }
            t
        })
        .collect();
    g.per_head(
        n,
        |(qh16, kh, p): &mut (Vec<f32>, Vec<f32>, Vec<f32>), r, h, kvh, o: &mut [T]| {
            g.query_f16(q, r, h, qh16);
            // Whole vectors of scores (the build's width); the masked tail is -inf.
            p.clear();
            let w = lanes(g.simd);
            p.resize(cells.div_ceil(w) * w, f32::NEG_INFINITY);
            let mut max = f32::NEG_INFINITY;
            let first = g.first_seen(start, r);
            for (t, s) in p.iter_mut().enumerate().take(start + r + 1).skip(first) {
                g.cached(k, t, kvh, kh);
                *s = dot_f16(kh, qh16, n, g.simd) * g.scale;
                max = max.max(*s);
            }
            let sum = exp_sum(p, max, g.simd);
            let inv = (1.0 / sum) as f32;
            for x in p.iter_mut() {
                *x = f16_round(*x * inv);
            }
            let vt = &vt[kvh];
            for (d, o) in o.iter_mut().enumerate() {
                *o = T::from_f32(dot_f16(
                    &vt[d * cells..(d + 1) * cells],
                    &p[..cells],
                    n,
                    g.simd,
                ));
            }
        },
    )
}

/// Query rows from which llama.cpp's CPU flash attention switches to its
/// tiled f32 kernel (`GGML_FA_TILE_Q`), which [`flash_attention`] does not
/// model.
pub const FLASH_ATTN_TILE_ROWS: usize = 64;

/// llama.cpp's CPU flash attention over an F16 K/V cache, as
/// `ggml_compute_forward_flash_attn_ext_f16_one_chunk` runs it for fewer
/// than [`FLASH_ATTN_TILE_ROWS`] query rows: `q` rounded to f16, each score
/// a `ggml_vec_dot_f16` scaled in f32, an online softmax with `expf`, and
/// the weighted values accumulated **in f16**: on a new maximum the
/// accumulator is rescaled (`f16(acc * e^(M_old - M))`), then each value row
/// is added as `f16(v * e^(s - M) + acc)`; the f32 sum of weights divides at
/// the end. Masked cells are skipped. `k` and `v` must hold f16 values.
/// llama's graph: [`flash_attention_in`] with [`AttnGraph::llama`].
pub fn flash_attention<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
    simd: GgmlSimd,
) -> Vec<T> {
    flash_attention_in(q, n, start, k, v, heads, AttnGraph::llama(simd))
}

/// [`flash_attention`] in the graph of a family (see [`attention_in`]).
pub fn flash_attention_in<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
    graph: AttnGraph,
) -> Vec<T> {
    let g = Geometry::of(heads, graph);
    g.per_head(
        n,
        |(qh16, kh, vh, acc): &mut (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>),
         r,
         h,
         kvh,
         o: &mut [T]| {
            g.query_f16(q, r, h, qh16);
            acc.clear();
            acc.resize(heads.head_dim, 0.0);
            let (mut sum, mut max) = (0f32, f32::NEG_INFINITY);
            for t in g.first_seen(start, r)..start + r + 1 {
                g.cached(k, t, kvh, kh);
                let s = dot_f16(kh, qh16, 1, g.simd) * g.scale;
                let (mut ms, mut vs) = (1f32, 1f32);
                if s > max {
                    ms = (max - s).exp();
                    max = s;
                    for a in acc.iter_mut() {
                        *a = f16_round(*a * ms);
                    }
                } else {
                    vs = (s - max).exp();
                }
                g.cached(v, t, kvh, vh);
                for (a, x) in acc.iter_mut().zip(vh.iter()) {
                    *a = f16_round(x.mul_add(vs, *a));
                }
                sum = sum.mul_add(ms, vs);
            }
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, a) in o.iter_mut().zip(acc.iter()) {
                *o = T::from_f32(*a * inv);
            }
        },
    )
}

#[cfg(test)]
mod tests;
