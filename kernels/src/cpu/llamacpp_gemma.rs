//! `--precision llamacpp` for Gemma 3: the ops llama.cpp's CPU backend runs
//! for that family where they differ from llama's, read from the llama.cpp
//! that llama-cpp-python 0.3.36 vendors (ggml-org/llama.cpp@0c1e57098,
//! x86-64 with AVX2, F16C and FMA; `src/models/gemma3.cpp`, `ggml-cpu`).
//!
//! - **GeGLU** ([`geglu`]): ggml's CPU backend is compiled with
//!   `GGML_GELU_FP16`, so `ggml_vec_geglu_f32` does not evaluate the tanh
//!   approximation: it rounds the gate to f16 and looks GELU up in
//!   `ggml_table_gelu_f16`, a table of f16 results built at start-up from
//!   `0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))`
//!   ([`gelu_table`]); a gate at or below -10 gives 0, at or above 10 the
//!   gate itself. The C is compiled as GNU C, whose default
//!   `-ffp-contract=fast` fuses `1.0f + (GELU_COEF_A*x)*x` into one FMA:
//!   the table built so equals llama.cpp's in all 65,536 entries, the one
//!   built without that fusion differs in one (`tests/llamacpp_gemma.rs`
//!   reads llama.cpp's table and checks).
//! - **RoPE over halves** ([`rope_halves`]): `LLAMA_ROPE_TYPE_NEOX` pairs
//!   dimension `i` with `i + head_dim / 2`, with the same f32 walk of the
//!   angle as llama's ([`super::llamacpp::rope_cache`]); base 10,000 on the
//!   sliding-window layers, the file's `rope.freq_base` on the global ones.
//! - **Attention** ([`attn_graph`], [`super::llamacpp::attention_in`]): the
//!   graph scales the roped queries by `f_attention_scale = 1/sqrt(head_dim)`
//!   (`ggml_scale`, f32) before the F16 `kq` product and soft-maxes with
//!   `kq_scale = 1`; the sliding-window layers mask keys `window` or more
//!   positions back (`LLAMA_SWA_TYPE_STANDARD`).
//! - What Gemma shares with llama in this mode: the norms (f32, sum of
//!   squares in `ggml_float`), the embedding scale (`ggml_scale` by
//!   `sqrtf(n_embd)`, the f32 rounding of `sqrt(640)` either way), the q/k
//!   norms (the same RMSNorm over each head's 256 values), the F16 K/V cache,
//!   and the activation blocks of [`super::llamacpp::quantize_row`]: Q8_0
//!   for the Q5_0 and Q8_0 weights, and for the K-quants (Q4_K, Q6_K)
//!   `quantize_row_q8_K_ref`, which is what the x86 build's
//!   `quantize_row_q8_K` calls. Q4_K weights are repacked on AVX2
//!   (`q4_K_8x8_q8_K`), whose 4-row activation quantizer
//!   (`ggml_quantize_mat_q8_K_4x8`) differs from the reference only in which
//!   sign wins when `+amax` and `-amax` both occur in one 256-block; that tie
//!   is not modelled.

use std::sync::OnceLock;

use half::f16;

use super::llamacpp::{f16_round, rope_cache, AttnGraph, GgmlSimd};
use super::Real;
use model::{FfnActivation, LlamaConfig, ModelFamily, RopeStyle};

/// ggml's `GELU_COEF_A` and `SQRT_2_OVER_PI` (f32 constants).
const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4_f64 as f32;

/// `ggml_gelu_f32` as GCC compiles it for x86-64 with FMA (the inner
/// `1 + a x^2` contracted): the values of llama.cpp's GELU table before
/// their f16 rounding.
pub fn gelu_f32(x: f32) -> f32 {
    let inner = (SQRT_2_OVER_PI * x) * (GELU_COEF_A * x).mul_add(x, 1.0);
    (0.5f32 * x) * (1.0 + inner.tanh())
}

/// `ggml_table_gelu_f16`: for every f16 bit pattern `i`, the f16 of
/// [`gelu_f32`] of that f16's value.
pub fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| f16::from_f32(gelu_f32(f16::from_bits(i).to_f32())).to_bits())
            .collect()
    })
}

/// `gelu(gate) * up` as `ggml_vec_geglu_f32` with `GGML_GELU_FP16`: the
/// gate rounded to f16 indexes [`gelu_table`], the f16 result widened and
/// multiplied by `up` in f32; `gate <= -10` gives 0, `gate >= 10` gives
/// `gate * up`.
pub fn geglu<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    let table = gelu_table();
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            let (g, u) = (g.to_f32(), u.to_f32());
            let y = if g <= -10.0 {
                0.0
            } else if g >= 10.0 {
                g * u
            } else {
                let i = f16::from_f32(g).to_bits() as usize;
                f16::from_bits(table[i]).to_f32() * u
            };
            T::from_f32(y)
        })
        .collect()
}

/// RoPE over halves as ggml's `rope_f32` with `LLAMA_ROPE_TYPE_NEOX` (no
/// scaling): dimension `i` of each head rotates with `i + head_dim / 2` by
/// the f32 angle of [`rope_cache`], in f32 with the FMAs of
/// [`super::llamacpp::rope`].
pub fn rope_halves<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    let half = head_dim / 2;
    let mut cs = vec![(0f32, 0f32); half];
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        rope_cache(start + r, head_dim, base, &mut cs);
        for head in row.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
            for ((a, b), (c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(&cs) {
                let (x0, x1) = (a.to_f32(), b.to_f32());
                *a = T::from_f32(x0.mul_add(*c, -(x1 * s)));
                *b = T::from_f32(x0.mul_add(*s, x1 * c));
            }
        }
    }
}

/// llama.cpp's RoPE for a family's pair layout.
pub fn rope_styled<T: Real>(
    style: RopeStyle,
    x: &mut [T],
    width: usize,
    start: usize,
    head_dim: usize,
    base: f32,
) {
    match style {
        RopeStyle::Interleaved => super::llamacpp::rope(x, width, start, head_dim, base),
        RopeStyle::Halves => rope_halves(x, width, start, head_dim, base),
    }
}

/// Gemma 3's attention graph for a layer with `window` (`None`: global):
/// queries scaled by `1 / sqrt(head_dim)` in f32, scores unscaled, on a
/// `simd` build.
pub fn attn_graph(head_dim: usize, window: Option<usize>, simd: GgmlSimd) -> AttnGraph {
    AttnGraph {
        query_scale: Some(1.0f32 / (head_dim as f32).sqrt()),
        window,
        simd,
    }
}

/// The attention graph llama.cpp builds for `cfg`'s layer `l` on a `simd`
/// build, or `None` for a family whose llama.cpp graph this mode does not
/// model.
pub fn graph_of(cfg: &LlamaConfig, l: usize, simd: GgmlSimd) -> Option<AttnGraph> {
    if cfg.family == ModelFamily::llama() {
        return Some(AttnGraph::llama(simd));
    }
    if cfg.arch == "gemma3" {
        let la = cfg.family.attention(l, cfg.rope_base);
        return Some(attn_graph(cfg.head_dim, la.window, simd));
    }
    None
}

/// Whether this mode models llama.cpp's graph for `cfg`'s family.
pub fn modelled(cfg: &LlamaConfig) -> bool {
    graph_of(cfg, 0, GgmlSimd::Avx2).is_some()
}

/// The gate's product in llama.cpp's arithmetic for a family.
pub fn gated<T: Real>(act: FfnActivation, gate: &[T], up: &[T]) -> Vec<T> {
    match act {
        FfnActivation::Silu => super::ffn::swiglu(gate, up),
        FfnActivation::GeluTanh => geglu(gate, up),
    }
}

/// Rounds K or V rows to f16 as llama.cpp's F16 cache stores them.
pub fn f16_rows<T: Real>(x: &[T]) -> Vec<T> {
    x.iter().map(|v| f16_round(*v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geglu_looks_gelu_up_by_the_f16_of_the_gate() {
        // 1.0001 rounds to f16 1.0: the result is gelu(1.0) rounded to f16.
        let y = geglu(&[1.0001f32, -10.0, 10.0, 0.0], &[1.0, 3.0, 2.0, 5.0]);
        let g1 = f16::from_f32(gelu_f32(1.0)).to_f32();
        assert_eq!(y[0], g1);
        assert_ne!(g1, gelu_f32(1.0001));
        assert_eq!(y[1], 0.0);
        assert_eq!(y[2], 20.0);
        assert_eq!(y[3], 0.0);
        // Near the tanh formula, to f16's step.
        let exact = super::super::ffn::geglu(&[0.7f64], &[1.0])[0];
        let got = geglu(&[0.7f32], &[1.0])[0] as f64;
        assert!((got - exact).abs() < 1e-3 * exact.abs(), "{got} vs {exact}");
    }

    #[test]
    fn rope_halves_pairs_i_with_i_plus_half() {
        let (hd, base) = (8, 10_000f32);
        let mut x: Vec<f32> = (0..hd).map(|i| i as f32 + 1.0).collect();
        rope_halves(&mut x, hd, 3, hd, base);
        let mut cs = vec![(0f32, 0f32); hd / 2];
        rope_cache(3, hd, base, &mut cs);
        let (c, s) = cs[1];
        assert_eq!(x[1], 2f32.mul_add(c, -(6.0 * s)));
        assert_eq!(x[5], 2f32.mul_add(s, 6.0 * c));
        // The reference (f64 angles) is close, not equal.
        let mut y: Vec<f64> = (0..hd).map(|i| i as f64 + 1.0).collect();
        super::super::rope::rope_halves(&mut y, hd, 3, hd, base);
        for (a, b) in x.iter().zip(&y) {
            assert!((*a as f64 - b).abs() < 1e-5);
        }
    }

    #[test]
    fn gemma_attention_masks_the_window_as_a_hand_computation_does() {
        use super::super::attention::Heads;
        use super::super::llamacpp::attention_in;
        let heads = Heads {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 4,
        };
        let q = [
            3.0e-4f32, 0.5, -0.25, 1.0, 0.1, 0.2, 0.3, 0.4, 1.0, 1.0, 1.0, 1.0,
        ];
        let k: Vec<f32> = (0..12).map(|i| f16_round(i as f32 * 0.37 - 2.0)).collect();
        let v: Vec<f32> = (0..12).map(|i| f16_round(i as f32 * 0.11)).collect();
        let global = attention_in(&q, 3, 0, &k, &v, heads, attn_graph(4, None, GgmlSimd::Avx2));
        let windowed = attention_in(
            &q,
            3,
            0,
            &k,
            &v,
            heads,
            attn_graph(4, Some(2), GgmlSimd::Avx2),
        );
        // Rows 0 and 1 see at most 2 positions: the window changes nothing.
        assert_eq!(global[..8], windowed[..8]);
        // Row 2 sees positions 1 and 2 only: position 0's value is gone.
        assert_ne!(global[8..], windowed[8..]);
        let by_hand = {
            let qs: Vec<f32> = q[8..].iter().map(|x| f16_round(x * 0.5)).collect();
            let s: Vec<f32> = (1..3)
                .map(|t| (0..4).map(|d| qs[d] * k[t * 4 + d]).sum::<f32>())
                .collect();
            let m = s[0].max(s[1]);
            let e: Vec<f64> = s.iter().map(|x| ((x - m) as f64).exp()).collect();
            let z: f64 = e.iter().sum();
            (0..4)
                .map(|d| {
                    (1..3)
                        .map(|t| e[t - 1] / z * v[t * 4 + d] as f64)
                        .sum::<f64>()
                })
                .collect::<Vec<f64>>()
        };
        for (a, b) in windowed[8..].iter().zip(&by_hand) {
            assert!((*a as f64 - b).abs() < 2e-3, "{a} vs {b}");
        }
    }
}
