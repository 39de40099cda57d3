//! GGML tensor types, their block layouts, and dequantization to f32.
//!
//! Dequantization follows ggml's reference `dequantize_row_*` functions
//! operation for operation (f16 scales widened exactly, products formed in
//! the same order, no fused multiply-add), so the result is bit-identical to
//! ggml's and to the `gguf` Python package's `gguf.quants.dequantize`; a test
//! checks that on every tensor of the real model.

use half::f16;
use rayon::prelude::*;

use crate::model::QTensor;

/// A GGML tensor type (the ids are GGUF's `ggml_type` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                256
            }
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }

    /// Whether the type is block-quantized (not a plain float type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
        }
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// Bytes of a row of `n` elements (`n` a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.type_size()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Why bytes could not be dequantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{ggml_type}: {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        ggml_type: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("Q8_K: {n} activations are not a whole number of 256-element blocks")]
    PartialQ8KBlock { n: usize },
    #[error("{ggml_type}: {n} elements need {expected} bytes, got {got}")]
    ByteLength {
        ggml_type: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
}

/// Dequantizes `data` (whole blocks of `ty`) into `out`, one element per
/// slot of `out`. Single-threaded: use [`dequantize_rows`] for matrices.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check(ty, data.len(), out.len())?;
    dequantize_unchecked(ty, data, out);
    Ok(())
}

/// Dequantizes a row-major matrix of rows of `cols` elements, in parallel
/// over rows (a row is the unit the forwards ask for).
pub fn dequantize_rows(
    ty: GgmlType,
    data: &[u8],
    cols: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check(ty, data.len(), out.len())?;
    if cols == 0 || out.is_empty() {
        return Ok(());
    }
    check(ty, ty.row_bytes(cols), cols)?;
    let row_bytes = ty.row_bytes(cols);
    // Batch rows so that each rayon task has enough work to amortize itself.
    let rows_per_task = (16384 / cols).max(1);
    out.par_chunks_mut(cols * rows_per_task)
        .zip(data.par_chunks(row_bytes * rows_per_task))
        .for_each(|(o, d)| dequantize_unchecked(ty, d, o));
    Ok(())
}

fn check(ty: GgmlType, bytes: usize, n: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    if n % block != 0 {
        return Err(QuantError::PartialBlock {
            ggml_type: ty,
            n,
            block,
        });
    }
    let expected = ty.row_bytes(n);
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ggml_type: ty,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn dequantize_unchecked(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let blocks = data
        .chunks_exact(ty.type_size())
        .zip(out.chunks_exact_mut(ty.block_size()));
    match ty {
        GgmlType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        GgmlType::BF16 => {
            for (b, y) in blocks {
                y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                for j in 0..16 {
                    y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qs = &b[4..20];
                for j in 0..16 {
                    y[j] = (qs[j] & 0x0F) as f32 * d + m;
                    y[j + 16] = (qs[j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = ((qs[j] & 0x0F) as u32 | xh0) as i32 - 16;
                    let x1 = ((qs[j] >> 4) as u32 | xh1) as i32 - 16;
                    y[j] = x0 as f32 * d;
                    y[j + 16] = x1 as f32 * d;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
                    *yj = q as i8 as f32 * d;
                }
            }
        }
        GgmlType::Q4_K => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales = &b[4..16];
                let qs = &b[16..144];
                for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc0, m0) = scale_min_k4(2 * chunk, scales);
                    let (sc1, m1) = scale_min_k4(2 * chunk + 1, scales);
                    let (d0, dm0) = (d * sc0 as f32, dmin * m0 as f32);
                    let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
                    for l in 0..32 {
                        y[l] = d0 * (q[l] & 0x0F) as f32 - dm0;
                        y[l + 32] = d1 * (q[l] >> 4) as f32 - dm1;
                    }
                }
            }
        }
        GgmlType::Q2_K => {
            for (b, y) in blocks {
                let scales = &b[0..16];
                let d = f16_at(b, 80);
                let dmin = f16_at(b, 82);
                // Two halves of 128: each reads 32 bytes of `qs` four times,
                // two bits at a time, in sub-blocks of 16 with their own
                // 4-bit scale and min.
                for (half, (q, y)) in b[16..80]
                    .chunks_exact(32)
                    .zip(y.chunks_exact_mut(128))
                    .enumerate()
                {
                    for j in 0..4 {
                        let shift = 2 * j;
                        for (k, (q16, y16)) in q
                            .chunks_exact(16)
                            .zip(y[32 * j..32 * j + 32].chunks_exact_mut(16))
                            .enumerate()
                        {
                            let sc = scales[8 * half + 2 * j + k];
                            let (dl, ml) = (d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
                            for (yl, ql) in y16.iter_mut().zip(q16) {
                                *yl = dl * ((ql >> shift) & 3) as f32 - ml;
                            }
                        }
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            for (b, y) in blocks {
                let hmask = &b[0..32];
                let d = f16_at(b, 108);
                let scales = q3_k_scales(&b[96..108]);
                for (half, (q, y)) in b[32..96]
                    .chunks_exact(32)
                    .zip(y.chunks_exact_mut(128))
                    .enumerate()
                {
                    for j in 0..4 {
                        let shift = 2 * j;
                        // The high bit of each value lives in `hmask`, one
                        // bit plane per 32 values; a clear bit subtracts 4.
                        let m = 1u8 << (4 * half + j);
                        for k in 0..2 {
                            let dl = d * (scales[8 * half + 2 * j + k] as i32 - 32) as f32;
                            for l in 16 * k..16 * k + 16 {
                                let low = ((q[l] >> shift) & 3) as i32;
                                let high = if hmask[l] & m != 0 { 0 } else { 4 };
                                y[32 * j + l] = dl * (low - high) as f32;
                            }
                        }
                    }
                }
            }
        }
        GgmlType::Q5_K => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales = &b[4..16];
                let qh = &b[16..48];
                let qs = &b[48..176];
                for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc0, m0) = scale_min_k4(2 * chunk, scales);
                    let (sc1, m1) = scale_min_k4(2 * chunk + 1, scales);
                    let (d0, dm0) = (d * sc0 as f32, dmin * m0 as f32);
                    let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (u0, u1) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
                    for l in 0..32 {
                        let h0 = if qh[l] & u0 != 0 { 16 } else { 0 };
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        y[l] = d0 * ((q[l] & 0x0F) + h0) as f32 - dm0;
                        y[l + 32] = d1 * ((q[l] >> 4) + h1) as f32 - dm1;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, y) in blocks {
                let ql = &b[0..128];
                let qh = &b[128..192];
                let sc = &b[192..208];
                let d = f16_at(b, 208);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    let sc = &sc[8 * half..];
                    let y = &mut y[128 * half..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                        y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                        y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                        y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block, unpacked from its 12 bytes as
/// ggml's `kmask1`/`kmask2` shuffle lays them out: the low four bits of
/// scale `i` are the low (i < 8) or high nibble of byte `i % 8`, the high two
/// bits are bits `2 * (i / 4)..` of byte `8 + i % 4`.
fn q3_k_scales(s: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = low | (high << 4);
    }
    out
}

/// The 6-bit scale and min of sub-block `j` of a K-quant block (ggml's
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

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
    if x.len() % 256 != 0 {
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

impl QTensor {
    /// The raw bytes of row `row`.
    ///
    /// # Panics
    /// When `row >= self.rows()`.
    pub fn row_bytes(&self, row: usize) -> &[u8] {
        let n = self.ggml_type.row_bytes(self.cols());
        &self.data[row * n..(row + 1) * n]
    }

    /// The whole tensor as f32, row-major, dequantized in parallel over rows.
    pub fn to_f32(&self) -> Result<Vec<f32>, QuantError> {
        let mut out = vec![0f32; self.numel()];
        dequantize_rows(self.ggml_type, &self.data, self.cols(), &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    fn deq(ty: GgmlType, data: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; data.len() / ty.type_size() * ty.block_size()];
        dequantize(ty, data, &mut out).unwrap();
        out
    }

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut b = f16b(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = deq(GgmlType::Q8_0, &b);
        assert_eq!(y[0], -8.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 7.5);
    }

    #[test]
    fn q4_0_and_q4_1_put_low_nibbles_first() {
        let mut b = f16b(2.0).to_vec();
        b.extend([0x9Fu8; 16]); // low nibble 15, high nibble 9
        let y = deq(GgmlType::Q4_0, &b);
        assert_eq!((y[0], y[15], y[16], y[31]), (14.0, 14.0, 2.0, 2.0));

        let mut b = f16b(0.25).to_vec();
        b.extend(f16b(-1.0));
        b.extend([0x40u8; 16]);
        let y = deq(GgmlType::Q4_1, &b);
        assert_eq!((y[0], y[16]), (-1.0, 0.0));
    }

    #[test]
    fn q5_0_takes_the_fifth_bit_from_qh() {
        let mut b = f16b(1.0).to_vec();
        // bit 0 (element 0) and bit 16 (element 16) set
        b.extend(0x0001_0001u32.to_le_bytes());
        b.extend([0x00u8; 16]);
        let y = deq(GgmlType::Q5_0, &b);
        assert_eq!((y[0], y[1], y[16], y[17]), (0.0, -16.0, 0.0, -16.0));
    }

    #[test]
    fn q4_k_uses_six_bit_scales_and_mins() {
        let mut b = f16b(1.0).to_vec();
        b.extend(f16b(0.5));
        // sub-block 0: scale 3, min 2; sub-block 4 (upper encoding): scale
        // 0x15 | (1 << 4) from byte 0's top bits.
        let mut scales = [0u8; 12];
        scales[0] = 3 | (1 << 6);
        scales[4] = 2;
        scales[8] = 0x05;
        b.extend(scales);
        b.extend([0x21u8; 128]); // low nibble 1, high nibble 2
        let y = deq(GgmlType::Q4_K, &b);
        assert_eq!(y[0], 3.0 * 1.0 - 0.5 * 2.0);
        // sub-block 1 (high nibbles of the first 32 bytes): scale 0, min 0
        assert_eq!(y[32], 0.0);
        // sub-block 4: scale 5 | 16 = 21, min 0 | (0 << 4) = 0
        assert_eq!(y[128], 21.0);
    }

    #[test]
    fn q6_k_centres_six_bit_values_at_32() {
        let mut b = vec![0u8; 210];
        b[192..208].fill(1); // every sub-block scale 1
        b[208..210].copy_from_slice(&f16b(0.5));
        let y = deq(GgmlType::Q6_K, &b);
        assert!(y.iter().all(|&v| v == -16.0));
        b[0] = 0x0F;
        b[128] = 0x03; // high two bits of element 0
        assert_eq!(deq(GgmlType::Q6_K, &b)[0], (63.0 - 32.0) * 0.5);
    }

    #[test]
    fn float_types_convert_exactly() {
        assert_eq!(
            deq(GgmlType::F16, &f16b(-0.333)),
            [f16::from_f32(-0.333).to_f32()]
        );
        // smallest f16 subnormal
        assert_eq!(deq(GgmlType::F16, &[1, 0]), [2f32.powi(-24)]);
        assert_eq!(deq(GgmlType::BF16, &[0x80, 0x3F]), [1.0]);
        assert_eq!(deq(GgmlType::F32, &1.5f32.to_le_bytes()), [1.5]);
    }

    #[test]
    fn partial_blocks_and_wrong_lengths_are_errors() {
        let mut out = vec![0f32; 31];
        let e = dequantize(GgmlType::Q8_0, &[0; 34], &mut out).unwrap_err();
        assert!(e.to_string().contains("31 elements"), "{e}");
        let mut out = vec![0f32; 32];
        let e = dequantize(GgmlType::Q8_0, &[0; 33], &mut out).unwrap_err();
        assert!(e.to_string().contains("need 34 bytes, got 33"), "{e}");
    }

    #[test]
    fn parallel_rows_equal_serial() {
        let cols = 64;
        let rows = 300;
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 - 50.0)
            .collect();
        let q = quantize_q4_1(&x).unwrap();
        let mut serial = vec![0f32; rows * cols];
        dequantize(GgmlType::Q4_1, &q, &mut serial).unwrap();
        let mut par = vec![0f32; rows * cols];
        dequantize_rows(GgmlType::Q4_1, &q, cols, &mut par).unwrap();
        assert_eq!(serial, par);
    }

    #[test]
    fn quantizers_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        for (ty, q) in [
            (GgmlType::Q8_0, quantize_q8_0(&x).unwrap()),
            (GgmlType::Q4_1, quantize_q4_1(&x).unwrap()),
        ] {
            let y = deq(ty, &q);
            let step = if ty == GgmlType::Q8_0 {
                3.0 / 127.0
            } else {
                6.0 / 15.0
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= step * 0.5 + 1e-2, "{ty}: {a} vs {b}");
            }
        }
        // an all-equal block has a zero scale and still decodes
        let y = deq(GgmlType::Q4_1, &quantize_q4_1(&[2.0; 32]).unwrap());
        assert!(y.iter().all(|&v| v == 2.0));
    }
}
