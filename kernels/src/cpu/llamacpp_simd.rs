//! The lane orders of llama.cpp's attention arithmetic, which depend on the
//! x86 vector width its CPU backend was compiled for.
//!
//! llama-cpp-python builds llama.cpp with `GGML_NATIVE`: `-march=native` on
//! the machine that installs it. Where that machine has AVX-512 (ggml's
//! `__AVX512F__`, with DQ, as every AVX-512 CPU has), ggml's f16 dot products
//! and its soft max run on 16-lane vectors; otherwise (AVX2, F16C, FMA) on 8.
//! The products and exponentials are the same arithmetic either way, but
//! their sums group differently and the two `ggml_v_expf` differ in their
//! last step, so a recomputation must know which build ran. A llama.cpp
//! capture records it (`llama_print_system_info`, [`GgmlSimd::from_system_info`]);
//! taptree's own `--precision llamacpp` forward follows the
//! `TAPTREE_LLAMACPP_SIMD` switch, or this CPU.
//!
//! Read from the llama.cpp that llama-cpp-python 0.3.36 vendors
//! (ggml-org/llama.cpp@0c1e57098): `ggml_vec_dot_f16` (vec.cpp, with
//! `GGML_F16_DOT_*` of simd-mappings.h), `tinyBLAS<KN>` (llamafile/sgemm.cpp,
//! `hsum`), `ggml_vec_soft_max_f32` and `ggml_v_expf` (vec.cpp, vec.h), and
//! GCC's `_mm512_reduce_add_ps` (avx512fintrin.h: the upper 256 bits onto the
//! lower, then the upper 128, then lanes `(0+2) + (1+3)`).

use crate::ggml_build::GgmlSimd;

/// The horizontal sum of eight f32 lanes as ggml's AVX2 code does it
/// (`hsum` in tinyBLAS, the soft max's per-vector sum): the high half
/// onto the low, then `(a0 + a2) + (a1 + a3)`.
#[inline(always)]
pub(crate) fn hsum8(l: [f32; 8]) -> f32 {
    let a = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (a[0] + a[2]) + (a[1] + a[3])
}

/// The horizontal sum of `W` (8 or 16) lanes: [`hsum8`], or GCC's
/// `_mm512_reduce_add_ps` (lanes 8..16 onto 0..8, then [`hsum8`]).
#[inline(always)]
fn hsum<const W: usize>(l: &[f32; W]) -> f32 {
    if W == 8 {
        return hsum8(std::array::from_fn(|i| l[i]));
    }
    hsum8(std::array::from_fn(|i| l[i] + l[i + 8]))
}

/// A dot product of f16 values (held in f32, so each product is exact) in
/// the order of the kernel llama.cpp picks for a matmul of `rows` rows on a
/// `simd` build: tinyBLAS (`llamafile_sgemm`, two rows or more) keeps one
/// accumulator of a vector's lanes and [`hsum`]s it; one row goes through
/// `ggml_vec_dot_f16`, four accumulators folded pairwise, then the
/// build's reduce. Lengths are padded with zeros to whole vectors, as
/// llama.cpp's padded cache is.
pub(crate) fn dot_f16(a: &[f32], b: &[f32], rows: usize, simd: GgmlSimd) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if super::rows_avx::block_loops() {
            // SAFETY: AVX2 and FMA checked.
            return unsafe { dot_f16_fma(a, b, rows, simd) };
        }
    }
    dot_f16_of(a, b, rows, simd)
}

/// [`dot_f16_of`] compiled with FMA, whose `mul_add`s are then
/// instructions rather than calls to `fmaf`: the same bits.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f16_fma(a: &[f32], b: &[f32], rows: usize, simd: GgmlSimd) -> f32 {
    dot_f16_of(a, b, rows, simd)
}

#[inline(always)]
fn dot_f16_of(a: &[f32], b: &[f32], rows: usize, simd: GgmlSimd) -> f32 {
    match simd {
        GgmlSimd::Avx2 => dot_f16_in::<8>(a, b, rows),
        GgmlSimd::Avx512 => dot_f16_in::<16>(a, b, rows),
    }
}

/// [`dot_f16`]'s arithmetic on `W` lanes.
#[inline(always)]
fn dot_f16_in<const W: usize>(a: &[f32], b: &[f32], rows: usize) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    if rows >= 2 {
        let mut acc = [0f32; W];
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            acc[i % W] = x.mul_add(*y, acc[i % W]);
        }
        return hsum(&acc);
    }
    let mut acc = [[0f32; W]; 4];
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (j, l) = ((i / W) % 4, i % W);
        acc[j][l] = x.mul_add(*y, acc[j][l]);
    }
    let l: [f32; W] = std::array::from_fn(|k| (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]));
    if W == 16 {
        return hsum(&l);
    }
    // AVX2's `GGML_F32x8_REDUCE`: the halves added, then `hadd` twice.
    let t = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// The lanes of one vector of the soft max on a `simd` build.
pub(crate) fn lanes(simd: GgmlSimd) -> usize {
    match simd {
        GgmlSimd::Avx2 => 8,
        GgmlSimd::Avx512 => 16,
    }
}

/// The soft max's exponentials in place, `p[i] = v_expf(p[i] - max)`, and
/// their sum: each vector [`hsum`]ed, the vectors summed in f64
/// (`ggml_vec_soft_max_f32`). `p`'s length must be a whole number of the
/// build's vectors.
pub(crate) fn exp_sum(p: &mut [f32], max: f32, simd: GgmlSimd) -> f64 {
    debug_assert!(p.len().is_multiple_of(lanes(simd)));
    #[cfg(target_arch = "x86_64")]
    {
        if super::rows_avx::block_loops() {
            // SAFETY: AVX2 and FMA checked.
            return unsafe { exp_sum_fma(p, max, simd) };
        }
    }
    exp_sum_of(p, max, simd)
}

/// [`exp_sum_of`] compiled with FMA (instructions, not `fmaf` calls).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_fma(p: &mut [f32], max: f32, simd: GgmlSimd) -> f64 {
    exp_sum_of(p, max, simd)
}

#[inline(always)]
fn exp_sum_of(p: &mut [f32], max: f32, simd: GgmlSimd) -> f64 {
    match simd {
        GgmlSimd::Avx2 => exp_sum_in::<8>(p, max, v_expf),
        GgmlSimd::Avx512 => exp_sum_in::<16>(p, max, v_expf_avx512),
    }
}

#[inline(always)]
fn exp_sum_in<const W: usize>(p: &mut [f32], max: f32, exp: fn(f32) -> f32) -> f64 {
    let mut sum = 0f64;
    for chunk in p.chunks_exact_mut(W) {
        for s in chunk.iter_mut() {
            *s = exp(*s - max);
        }
        let v: &[f32; W] = (&*chunk).try_into().unwrap();
        sum += hsum(v) as f64;
    }
    sum
}

/// The range reduction both `ggml_v_expf` share: `n = round(x / ln 2)` (by
/// the `0x1.8p23` shift, `z`), `b = x - n ln 2` in two FMAs, and the
/// polynomial's terms of degree 2 and up, `j2`. Returns `(z, n, b, j2)`.
#[inline(always)]
fn expf_reduce(x: f32) -> (f32, f32, f32, f32) {
    let c = |bits: u32| f32::from_bits(bits);
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r); // x / ln 2 + r
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j2 = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)));
    (z, n, b, j2)
}

/// `expf` as ggml's AVX2 `ggml_v_expf` computes it, one lane: a degree-5
/// polynomial after range reduction by `n = round(x / ln 2)`, with the
/// special scaling of `|n| > 126` (so large negative `x` gives exact zeros).
#[inline(always)]
pub(crate) fn v_expf(x: f32) -> f32 {
    let (z, n, b, j2) = expf_reduce(x);
    let j = j2.mul_add(b * b, f32::from_bits(0x3f7f_fff6) * b);
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `expf` as ggml's AVX-512 `ggml_v_expf` computes it, one lane: the same
/// reduction and polynomial, its last term `c1 b + 1` (where AVX2 adds the
/// 1 by `j k + k`), scaled by `_mm512_scalef_ps(j, n)` (one rounding of
/// `j 2^n`, so subnormal results round once), and 0 or infinity beyond
/// `|n| > 192`.
#[inline(always)]
pub(crate) fn v_expf_avx512(x: f32) -> f32 {
    let (_, n, b, j2) = expf_reduce(x);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let j = j2.mul_add(b * b, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    (j as f64 * (n as f64).exp2()) as f32
}

#[cfg(test)]
mod tests;
