use half::f16;
use rayon::prelude::*;

use super::ggml_type::{check, GgmlType, QuantError};

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
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            dequantize_k(ty, blocks)
        }
    }
}

/// The K-quants (256-element super-blocks), as ggml's `dequantize_row_q*_K`:
/// one function per format, each dequantizing one super-block.
fn dequantize_k<'a>(ty: GgmlType, blocks: impl Iterator<Item = (&'a [u8], &'a mut [f32])>) {
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::Q2_K => q2_k_block,
        GgmlType::Q3_K => q3_k_block,
        GgmlType::Q4_K => q4_k_block,
        GgmlType::Q5_K => q5_k_block,
        GgmlType::Q6_K => q6_k_block,
        _ => unreachable!("{ty} is not a K-quant"),
    };
    for (b, y) in blocks {
        block(b, y);
    }
}

/// One Q4_K super-block `b` into its 256 weights `y`.
fn q4_k_block(b: &[u8], y: &mut [f32]) {
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

/// One Q2_K super-block `b` into its 256 weights `y`.
fn q2_k_block(b: &[u8], y: &mut [f32]) {
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

/// One Q3_K super-block `b` into its 256 weights `y`.
fn q3_k_block(b: &[u8], y: &mut [f32]) {
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

/// One Q5_K super-block `b` into its 256 weights `y`.
fn q5_k_block(b: &[u8], y: &mut [f32]) {
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

/// One Q6_K super-block `b` into its 256 weights `y`.
fn q6_k_block(b: &[u8], y: &mut [f32]) {
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
