//! Activation rows quantized to int8 per block of the weight's block size,
//! as llama.cpp quantizes a matmul's input (the `q8` mode; see
//! [`super::matmul`] for the dot product that reads them).

use super::Real;

/// An activation row quantized per block: integer values (held as `T`, so the
/// block dot reuses [`super::rows::dot`] exactly), one scale per block, and for 32-blocks
/// the rounding of `block_q8_1`'s f16 sum `s = d * sum(q)` against
/// `f16(d) * sum(q)` (what a Q4_1 dot's min term sees).
#[derive(Debug, Clone)]
pub struct QuantRow<T> {
    /// The quantized values, held as `T` (integers).
    pub q: Vec<T>,
    /// One scale per block: a value is `q * d`.
    pub d: Vec<T>,
    /// Per block: `block_q8_1`'s f16 sum `s` minus `f16(d) * sum(q)` for
    /// 32-blocks, 0 for other block sizes.
    pub s_err: Vec<T>,
}

/// Quantizes `x` to int8 per block of `block` elements, in f32 as llama.cpp
/// does for the weight's dot product: `quantize_row_q8_0`/`q8_1` for 32-blocks
/// (`d = amax / 127` stored as f16, `q = round(x / d)`), and for 256-blocks
/// (K-quant weights) `quantize_row_q8_K` through
/// [`model::quant::quantize_row_q8_k`] (`d = -max / 127` in f32, round half
/// to even).
pub fn quantize_row<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    assert!(
        block > 0 && x.len().is_multiple_of(block),
        "row of {} is not a multiple of block {block}",
        x.len()
    );
    if block == 256 {
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let blocks = model::quant::quantize_row_q8_k(&xf).expect("whole blocks, checked above");
        return QuantRow {
            q: blocks
                .iter()
                .flat_map(|b| b.qs.iter().map(|&v| T::from_f32(v as f32)))
                .collect(),
            d: blocks.iter().map(|b| T::from_f32(b.d)).collect(),
            s_err: vec![T::ZERO; blocks.len()],
        };
    }
    #[cfg(target_arch = "x86_64")]
    if super::rows_avx::block_loops() {
        // SAFETY: the CPU has AVX2 (checked by `block_loops`).
        return unsafe { quantize_blocks_avx2(x, block) };
    }
    quantize_blocks(x, block)
}

/// [`quantize_blocks`] compiled for AVX2: `round` becomes a few vector
/// instructions instead of a call to the C library's `roundf` per value
/// (both round half away from zero, exactly), and the rest the same
/// operations in the same order: the same values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_blocks_avx2<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    quantize_blocks(x, block)
}

/// [`quantize_row`] for blocks other than 256.
#[inline(always)]
fn quantize_blocks<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::with_capacity(x.len() / block);
    let mut s_err = Vec::with_capacity(x.len() / block);
    for b in x.chunks_exact(block) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for v in b {
            let r = (v.to_f32() * inv).round().clamp(-127.0, 127.0);
            sum += r as i32;
            q.push(T::from_f32(r));
        }
        // block_q8_0/q8_1 store the scale as f16, block_q8_K as f32; the
        // quantized values above use the unrounded scale, as llama.cpp does.
        if block == 32 {
            let stored = half::f16::from_f32(scale).to_f32();
            let s = half::f16::from_f32(sum as f32 * scale).to_f32();
            d.push(T::from_f32(stored));
            s_err.push(T::from_f64(s as f64 - stored as f64 * sum as f64));
        } else {
            d.push(T::from_f32(scale));
            s_err.push(T::ZERO);
        }
    }
    QuantRow { q, d, s_err }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 build of the loop gives the portable build's values, on
    /// rows whose scaled values fall exactly halfway between integers
    /// (where rounding half away from zero and half to even part) and on
    /// others; a changed input moves its block's values.
    #[test]
    fn the_vector_build_rounds_as_the_portable_one() {
        // Block 0: amax 127, so x / d = x: halves round away from zero.
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        x[31] = 127.0;
        x.extend((0..64).map(|i| ((i as f32) * 0.37).sin() * 3.0));
        let got = quantize_row(&x, 32);
        let want = quantize_blocks(&x, 32);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.q), bits(&want.q));
        assert_eq!(bits(&got.d), bits(&want.d));
        assert_eq!(bits(&got.s_err), bits(&want.s_err));
        assert_eq!(got.q[0], -16.0, "-15.5 rounds away from zero");
        assert_eq!(got.q[2], -14.0, "-13.5 rounds away from zero");
        let mut y = x.clone();
        y[40] += 0.5;
        let moved = quantize_row(&y, 32);
        assert_ne!(bits(&moved.q[32..64]), bits(&got.q[32..64]));
        assert_eq!(bits(&moved.q[..32]), bits(&got.q[..32]));
    }
}
