//! Quantization as ggml's reference `quantize_row_*_ref` functions do it:
//! the fixtures' weights and the q8 activation paths.

use half::f16;

use super::ggml_type::{check, GgmlType, QuantError};

/// Quantizes `x` to Q8_0 as ggml's `quantize_row_q8_0_ref` does.
pub fn quantize_q8_0(x: &[f32]) -> Result<Vec<u8>, QuantError> {
    check(GgmlType::Q8_0, GgmlType::Q8_0.row_bytes(x.len()), x.len())?;
    let mut out = Vec::with_capacity(GgmlType::Q8_0.row_bytes(x.len()));
    for block in x.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|v| (v * id).round() as i8 as u8));
    }
    Ok(out)
}

/// One block of llama.cpp's `block_q8_K`: the activation format its K-quant
/// dot products (`ggml_vec_dot_q4_K_q8_K`, `..._q6_K_q8_K`, ...) take.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockQ8K {
    /// f32 scale: `x ~ d * q`.
    pub d: f32,
    /// The quantized values, one per element, `-127..=127`.
    pub qs: [i8; 256],
    /// Sums of each 16 values of `qs` (what the dots use for the mins term).
    pub bsums: [i16; 16],
}

/// Quantizes a row of activations to Q8_K as llama.cpp's
/// `quantize_row_q8_K_ref` does: per block of 256, the value of largest
/// magnitude `max` (the first one, on ties) maps to exactly -127 through
/// `iscale = -127 / max`, every value to `nearest_int(iscale * x)` (round
/// half to even, ggml's `nearest_int`) capped at 127, and `d = 1 / iscale`.
/// An all-zero block is all zeros with `d = 0`.
///
/// Unlike Q8_0's `amax / 127`, the sign of the scale follows the outlier, and
/// the scale is kept in f32, not f16.
pub fn quantize_row_q8_k(x: &[f32]) -> Result<Vec<BlockQ8K>, QuantError> {
    if !x.len().is_multiple_of(256) {
        return Err(QuantError::PartialQ8KBlock { n: x.len() });
    }
    Ok(x.chunks_exact(256)
        .map(|b| {
            let mut max = 0f32;
            let mut amax = 0f32;
            for &v in b {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let mut blk = BlockQ8K {
                d: 0.0,
                qs: [0; 256],
                bsums: [0; 16],
            };
            if amax == 0.0 {
                return blk;
            }
            let iscale = -127.0f32 / max;
            for (q, &v) in blk.qs.iter_mut().zip(b) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (s, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            blk.d = 1.0 / iscale;
            blk
        })
        .collect())
}

/// Quantizes `x` to Q4_1 as ggml's `quantize_row_q4_1_ref` does.
pub fn quantize_q4_1(x: &[f32]) -> Result<Vec<u8>, QuantError> {
    check(GgmlType::Q4_1, GgmlType::Q4_1.row_bytes(x.len()), x.len())?;
    let mut out = Vec::with_capacity(GgmlType::Q4_1.row_bytes(x.len()));
    for block in x.chunks_exact(32) {
        let min = block.iter().fold(f32::MAX, |a, &v| a.min(v));
        let max = block.iter().fold(-f32::MAX, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let q0 = (((block[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((block[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            out.push(q0 | (q1 << 4));
        }
    }
    Ok(out)
}

/// Encodes `x` in a float type (F32, F16 round-to-nearest-even, BF16
/// round-to-nearest-even as ggml's `ggml_compute_fp32_to_bf16`).
pub fn encode_float(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    Some(match ty {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => x
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => return None,
    })
}
