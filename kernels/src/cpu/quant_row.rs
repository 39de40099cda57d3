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
