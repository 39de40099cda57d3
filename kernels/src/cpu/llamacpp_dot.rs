//! `--precision llamacpp`'s quantized matmuls summed as llama.cpp sums them.
//!
//! For a Q4_1 weight (activations in `block_q8_1`) and a Q8_0 weight
//! (activations in `block_q8_0`), llama.cpp's CPU backend built for x86-64
//! with AVX2, FMA and F16C (ggml-org/llama.cpp@0c1e57098, as
//! llama-cpp-python 0.3.36 vendors it) computes each output as
//! `ggml_vec_dot_q4_1_q8_1` / `ggml_vec_dot_q8_0_q8_0` do:
//!
//! - per 32-block `b`, the integer products of weight and activation quants
//!   are summed exactly (`maddubs` then `madd` with ones: eight 32-bit
//!   lanes, lane `j` holding the four products of elements `4j..4j + 4`;
//!   for Q4_1 the low nibbles are elements 0..16, the high ones 16..32),
//!   converted to f32 (exact), and accumulated per lane as
//!   `acc[j] = fma(d_w * d_a, sum[j], acc[j])`, `d_w * d_a` one f32 product
//!   of the two f16 scales;
//! - Q4_1's minimum term is a scalar `summs = fma(m_w, s_a, summs)` over
//!   the blocks in order (the compiled `summs += m * s`: GCC contracts it,
//!   `vfmadd231ss` in the shipped library), `s_a = f16(d_a * sum q_a)` being
//!   `block_q8_1`'s stored sum;
//! - the output is `hsum(acc) (+ summs)`, `hsum` folding the high half of
//!   the lanes onto the low, then `(a0 + a2) + (a1 + a3)`
//!   (`llamacpp_simd::hsum8`).
//!
//! For a prefill, llama.cpp first offers a matmul to `llamafile_sgemm`,
//! which on AVX2 takes Q8_0 (with Q8_0 activations), Q4_0, Q5_0 and IQ4_NL
//! weights, but not Q4_1: Q4_1 matmuls always run the per-row dot above;
//! Q8_0's (SmolLM2's tied output) run `tinyBLAS_Q0_AVX`, whose per-block
//! arithmetic and final `hsum` are the same expressions in the same order,
//! so one model serves both. Not modelled here (they keep the reference
//! f32 order of [`super::rows`]): other quantized weights (Q4_0, which
//! llama.cpp repacks to `q4_0x8` on AVX2, Q5_0, and the K-quants of
//! Gemma 3), and AVX-512/VNNI builds of llama.cpp (whose integer sums are
//! the same, but whose `hsum` and lane count are not).
//!
//! Each output is the same bits whatever computes it: the portable loop
//! ([`dot`], `f32::mul_add` for the FMAs), or the AVX2 tiles of
//! `avx` (four weight rows against one activation row for a
//! decode, two against four for a prefill), and whatever the thread count.

use half::f16;
use model::quant::GgmlType;

use super::llamacpp_simd::hsum8;
use super::qmatrix::{f16_at, WeightRows};
use super::quant_row::QuantRow;
use super::Real;

/// One activation row in llama.cpp's `block_q8_0`/`block_q8_1` form: the
/// int8 quants, and per 32-block the f16 scale `d` and `block_q8_1`'s f16
/// sum `s = f16(d_unrounded * sum q)`, both held as f32.
#[derive(Debug, Clone, Default)]
pub struct ActBlocks {
    /// The quants, 32 per block.
    pub qs: Vec<i8>,
    /// Per block, the f16 scale.
    pub d: Vec<f32>,
    /// Per block, the f16 sum `s` (what a Q4_1 dot's minimum term reads).
    pub s: Vec<f32>,
}

impl ActBlocks {
    /// The blocks of a row quantized by [`super::llamacpp::quantize_row`]
    /// with block 32. `s` is recovered exactly from the row's `s_err`
    /// (`s - d * sum q`, rounded to `T`): `d * sum q` is exact, and the
    /// rounding of `s_err` (2^-24 of a value within 2^-10 of `s`) is far
    /// below half a step of f16 at `s`, so rounding `d * sum q + s_err` to
    /// f16 gives `s` back (a test checks it against `s` computed directly).
    pub fn of<T: Real>(row: &QuantRow<T>) -> ActBlocks {
        assert_eq!(row.q.len(), row.d.len() * 32, "a row of 32-blocks");
        let qs: Vec<i8> = row.q.iter().map(|v| v.to_f32() as i8).collect();
        let d: Vec<f32> = row.d.iter().map(|v| v.to_f32()).collect();
        let s = qs
            .chunks_exact(32)
            .zip(&d)
            .zip(&row.s_err)
            .map(|((q, d), e)| {
                let sum: i32 = q.iter().map(|&v| v as i32).sum();
                f16::from_f64(*d as f64 * sum as f64 + e.to_f64()).to_f32()
            })
            .collect();
        ActBlocks { qs, d, s }
    }
}

/// Where a matmul sums as llama.cpp does (`llama`: `--precision
/// llamacpp`) and some of its weights are of a type whose sums
/// [`fill_chunk`] models (`any_modelled`, [`models`]), its activation rows
/// quantized in 32-blocks (`q`) in llama.cpp's blocks; `None` otherwise
/// (Gemma's Q5_0 and Q4_0 groups never read them).
pub(crate) fn rows_for<T: Real>(
    llama: bool,
    any_modelled: bool,
    block: usize,
    q: Option<&[QuantRow<T>]>,
) -> Option<Vec<ActBlocks>> {
    match (llama && any_modelled, block, q) {
        (true, 32, Some(q)) => Some(q.iter().map(ActBlocks::of).collect()),
        _ => None,
    }
}

/// Whether `w` is held in blocks of a type [`fill_chunk`] models.
pub(crate) fn models<W: WeightRows>(w: &W) -> bool {
    w.rows() > 0 && w.blocks(0).is_some_and(|(ty, _)| modelled(ty))
}

/// Whether llama.cpp's integer dot is modelled for weights of `ty`.
pub fn modelled(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// The portable loop: one weight row `w` (whole blocks of `ty`, Q4_1 or
/// Q8_0) dotted with activation row `a` as llama.cpp's AVX2 dot does (see
/// the module doc), bit for bit.
pub fn dot(ty: GgmlType, w: &[u8], a: &ActBlocks) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (b, blk) in w.chunks_exact(ty.type_size()).enumerate() {
        let qa = &a.qs[b * 32..][..32];
        let mut sum = [0i32; 8];
        match ty {
            GgmlType::Q4_1 => {
                for (i, q) in blk[4..20].iter().enumerate() {
                    sum[i / 4] += (q & 0x0F) as i32 * qa[i] as i32;
                    sum[4 + i / 4] += (q >> 4) as i32 * qa[16 + i] as i32;
                }
                summs = f16_at(blk, 2).mul_add(a.s[b], summs);
            }
            GgmlType::Q8_0 => {
                for (i, q) in blk[2..34].iter().enumerate() {
                    sum[i / 4] += *q as i8 as i32 * qa[i] as i32;
                }
            }
            t => panic!("{t}: llama.cpp's integer dot is modelled for Q4_1 and Q8_0 only"),
        }
        let dd = f16_at(blk, 0) * a.d[b];
        for (l, s) in acc.iter_mut().zip(sum) {
            *l = dd.mul_add(s as f32, *l);
        }
    }
    match ty {
        GgmlType::Q4_1 => hsum8(acc) + summs,
        _ => hsum8(acc),
    }
}

/// Whether the AVX2 tiles run here (AVX2, F16C and FMA).
#[inline(always)]
fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::rows_avx::block_loops()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `RW` weight rows against `RA` activation rows, `y[i][r]`: the AVX2 tile
/// where it runs (`simd`, [`simd`]'s answer, asked once per chunk), else
/// [`dot`] per output (the same bits).
///
/// # Safety
/// `simd` is true only where [`simd`] is.
#[inline(always)]
unsafe fn tile<const RW: usize, const RA: usize>(
    simd: bool,
    ty: GgmlType,
    w: [&[u8]; RW],
    a: [&ActBlocks; RA],
) -> [[f32; RA]; RW] {
    #[cfg(target_arch = "x86_64")]
    {
        if simd {
            // SAFETY: AVX2, F16C and FMA checked (the caller's `simd`); every row of `w` is whole
            // blocks of `ty` (a QMatrix row) with a block of `a` for each.
            return unsafe { avx::tile(ty, w, a) };
        }
    }
    let _ = simd;
    w.map(|wr| a.map(|ar| dot(ty, wr, ar)))
}

/// Weight rows per prefill tile (against four activation rows; one row a
/// tile measured the same at one thread).
const PW: usize = 2;

/// Fills `out` (`[k, n]`, transposed) with output features `first..first +
/// k` of the matmul of `weights` with its activation rows in llama.cpp's blocks (`acts`),
/// when its weight is held in blocks of a modelled type; returns false,
/// having written nothing, when it is not.
pub(crate) fn fill_chunk<T: Real, W: WeightRows>(
    weights: &W,
    acts: &[ActBlocks],
    first: usize,
    out: &mut [T],
) -> bool {
    let n = acts.len();
    let k = out.len() / n.max(1);
    let ty = match weights.blocks(first) {
        Some((ty, _)) if modelled(ty) => ty,
        _ => return false,
    };
    let nb = weights.cols() / 32;
    assert!(
        acts.iter()
            .all(|a| a.d.len() == nb && a.s.len() == nb && a.qs.len() == nb * 32),
        "activation blocks"
    );
    let row = |o: usize| weights.blocks(o).expect("a quantized weight").1;
    let simd = simd();
    // SAFETY (each `tile` below): `simd` is `simd()`'s answer.
    let mut put = |o: usize, r: usize, v: f32| out[o * n + r] = T::from_f32(v);
    let mut o = 0;
    if n < 4 {
        // Decode: four weight rows share each activation block.
        while o + 4 <= k {
            let w = [0, 1, 2, 3].map(|j| row(first + o + j));
            for (r, a) in acts.iter().enumerate() {
                let y = unsafe { tile(simd, ty, w, [a]) };
                for (j, yj) in y.iter().enumerate() {
                    put(o + j, r, yj[0]);
                }
            }
            o += 4;
        }
    } else {
        // Prefill: two weight rows against four activation rows, the last
        // activation row repeated to fill a four (its extra sums dropped).
        let quad = |r: usize| [0, 1, 2, 3].map(|t| &acts[(r + t).min(n - 1)]);
        while o + PW <= k {
            let w: [&[u8]; PW] = std::array::from_fn(|j| row(first + o + j));
            for r in (0..n).step_by(4) {
                let y = unsafe { tile(simd, ty, w, quad(r)) };
                for (j, yj) in y.iter().enumerate() {
                    for (t, v) in yj.iter().enumerate().take(n - r) {
                        put(o + j, r + t, *v);
                    }
                }
            }
            o += PW;
        }
    }
    for o in o..k {
        for (r, a) in acts.iter().enumerate() {
            put(o, r, unsafe { tile(simd, ty, [row(first + o)], [a]) }[0][0]);
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod avx;

#[cfg(test)]
mod tests;
