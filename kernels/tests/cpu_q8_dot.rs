//! The q8 matmul against llama.cpp's integer dot products, written out here
//! block by block: `block_q8_0` / `block_q8_1` activations (int8, f16 scale,
//! and for Q8_1 the f16 `s = d * sum(q)`) times Q8_0 and Q4_1 weight blocks,
//! `sumi * d_w * d_x (+ m_w * s_x)`; and `block_q8_K` activations (int8 per
//! 256, f32 scale, sums of 16) times Q4_K and Q6_K weight blocks, with the
//! 6-bit sub-block scales (and Q4_K's mins against the activations' 16-sums)
//! applied in integers and eight f32 lanes, as `ggml_vec_dot_q4_K_q8_K` and
//! `ggml_vec_dot_q6_K_q8_K` do. Our q8 path dots the int8 activations with
//! the dequantized weights instead; the two must agree to f32 rounding, far
//! inside the int8 error they both model.

use half::f16;
use kernels::cpu::matmul::{matmul, matmul_with_mins, Act};
use kernels::cpu::qmatrix::Matrix;
use model::quant::{quantize_q4_1, quantize_q8_0, quantize_row_q8_k, BlockQ8K};
use model::{GgmlType, QTensor};

fn seq(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

/// llama.cpp's `quantize_row_q8_1_ref` for one 32-block: (q, d, s).
fn q8_1(x: &[f32]) -> (Vec<i32>, f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<i32> = x.iter().map(|v| (v * id).round() as i32).collect();
    let sum: i32 = q.iter().sum();
    (
        q,
        f16::from_f32(d).to_f32(),
        f16::from_f32(sum as f32 * d).to_f32(),
    )
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_1_q8_1`, generic versions.
fn integer_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut sumf = 0f32;
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let (qx, dx, sx) = q8_1(xb);
        let blk = &row[b * ty.type_size()..(b + 1) * ty.type_size()];
        match ty {
            GgmlType::Q8_0 => {
                let sumi: i32 = (0..32).map(|j| qx[j] * blk[2 + j] as i8 as i32).sum();
                sumf += sumi as f32 * (f16_at(blk, 0) * dx);
            }
            GgmlType::Q4_1 => {
                let sumi: i32 = (0..16)
                    .map(|j| {
                        qx[j] * (blk[4 + j] & 0xF) as i32 + qx[j + 16] * (blk[4 + j] >> 4) as i32
                    })
                    .sum();
                sumf += (f16_at(blk, 0) * dx) * sumi as f32 + f16_at(blk, 2) * sx;
            }
            _ => unreachable!(),
        }
    }
    sumf
}

fn check(ty: GgmlType) {
    let (rows, cols) = (24, 256);
    let wf = seq(rows * cols, 11, 0.2);
    let bytes = match ty {
        GgmlType::Q8_0 => quantize_q8_0(&wf).unwrap(),
        _ => quantize_q4_1(&wf).unwrap(),
    };
    let t = QTensor {
        name: format!("w.{ty}"),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: bytes.into(),
    };
    let w = Matrix {
        rows,
        cols,
        data: t.to_f32().unwrap(),
        block: 32,
    };
    let mins: Option<Vec<f32>> = (ty == GgmlType::Q4_1).then(|| {
        t.data
            .chunks_exact(20)
            .map(|b| f16::from_le_bytes([b[2], b[3]]).to_f32())
            .collect()
    });
    // A plain row, and one with a massive activation crushing block 0.
    let plain = seq(cols, 5, 2.0);
    let mut outlier = plain.clone();
    outlier[3] = -3000.0;
    for x in [plain, outlier] {
        let ours = matmul_with_mins(&x, 1, &w, mins.as_deref(), Act::Q8);
        let float = matmul(&x, 1, &w, Act::Float);
        let scale = float.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut worst_float = 0f32;
        for (r, (y, f)) in ours.iter().zip(&float).enumerate() {
            let reference = integer_dot(ty, t.row_bytes(r), &x);
            assert!(
                (y - reference).abs() <= 2e-6 * scale.max(1.0) * 32.0,
                "{ty} row {r}: ours {y}, integer dot {reference}"
            );
            worst_float = worst_float.max((f - reference).abs());
        }
        // The tolerance is tight enough to tell q8 from float.
        assert!(
            worst_float > 2e-6 * scale.max(1.0) * 32.0,
            "{ty}: float within {worst_float}"
        );
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K block's 12 scale bytes.
fn q4_k_scale_min(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)) as i32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32,
        )
    }
}

/// The integer dot of one K-quant weight row with Q8_K activations: per
/// block, `sum_l (d_w * d_x) * lane[l]` over eight i32 lanes of
/// `scale * q_w * q_x`, minus `(dmin_w * d_x) * sum(bsums * mins)` for Q4_K.
fn integer_dot_k(ty: GgmlType, row: &[u8], x: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for (b, y) in x.iter().enumerate() {
        let blk = &row[b * ty.type_size()..(b + 1) * ty.type_size()];
        // Weight integers and the scale of each group of 16.
        let mut a = [0i32; 256];
        let mut scale16 = [0i32; 16];
        let (d, mins_term) = match ty {
            GgmlType::Q4_K => {
                let qs = &blk[16..144];
                for (j, chunk) in qs.chunks_exact(32).enumerate() {
                    for l in 0..32 {
                        a[64 * j + l] = (chunk[l] & 0xF) as i32;
                        a[64 * j + 32 + l] = (chunk[l] >> 4) as i32;
                    }
                }
                let mut sumi = 0i32;
                for j in 0..8 {
                    let (sc, m) = q4_k_scale_min(j, &blk[4..16]);
                    scale16[2 * j] = sc;
                    scale16[2 * j + 1] = sc;
                    sumi += (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32) * m;
                }
                let dmin = f16_at(blk, 2) * y.d;
                (f16_at(blk, 0) * y.d, dmin * sumi as f32)
            }
            GgmlType::Q6_K => {
                for half in 0..2 {
                    let ql = &blk[64 * half..];
                    let qh = &blk[128 + 32 * half..];
                    let a = &mut a[128 * half..];
                    for l in 0..32 {
                        a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    }
                }
                for (j, s) in scale16.iter_mut().enumerate() {
                    *s = blk[192 + j] as i8 as i32;
                }
                (f16_at(blk, 208) * y.d, 0.0)
            }
            _ => unreachable!(),
        };
        let mut lanes = [0i32; 8];
        for i in 0..256 {
            lanes[i % 8] += scale16[i / 16] * (y.qs[i] as i32 * a[i]);
        }
        for (s, l) in sums.iter_mut().zip(lanes) {
            *s += d * l as f32;
        }
        sumf -= mins_term;
    }
    sumf + sums.iter().sum::<f32>()
}

/// Random K-quant blocks with small finite f16 scales.
fn k_quant_row_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut data: Vec<u8> = (0..rows * ty.row_bytes(cols))
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect();
    for blk in data.chunks_exact_mut(ty.type_size()) {
        match ty {
            GgmlType::Q4_K => {
                blk[0..2].copy_from_slice(&f16::from_f32(0.002).to_le_bytes());
                blk[2..4].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
            }
            _ => blk[208..210].copy_from_slice(&f16::from_f32(0.0005).to_le_bytes()),
        }
    }
    data
}

fn check_k(ty: GgmlType) {
    let (rows, cols) = (24, 512);
    let t = QTensor {
        name: format!("w.{ty}"),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: k_quant_row_bytes(ty, rows, cols, 3).into(),
    };
    let w = Matrix {
        rows,
        cols,
        data: t.to_f32().unwrap(),
        block: 256,
    };
    let plain = seq(cols, 5, 2.0);
    let mut outlier = plain.clone();
    outlier[3] = -3000.0;
    for x in [plain, outlier] {
        let qx = quantize_row_q8_k(&x).unwrap();
        let ours = matmul(&x, 1, &w, Act::Q8);
        let float = matmul(&x, 1, &w, Act::Float);
        let scale = float.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tol = 2e-6 * scale.max(1.0) * 32.0;
        let mut worst_float = 0f32;
        for (r, (y, f)) in ours.iter().zip(&float).enumerate() {
            let reference = integer_dot_k(ty, t.row_bytes(r), &qx);
            assert!(
                (y - reference).abs() <= tol,
                "{ty} row {r}: ours {y}, integer dot {reference}"
            );
            worst_float = worst_float.max((f - reference).abs());
        }
        assert!(worst_float > tol, "{ty}: float within {worst_float} of q8");
    }
}

#[test]
fn q8_k_follows_llama_cpp_rounding_and_sign() {
    // The largest magnitude maps to exactly -127 whatever its sign; ties
    // round to even; the scale is f32 `1 / iscale`.
    let mut x = vec![0f32; 256];
    x[0] = 2.54; // iscale = -127 / 2.54 = -50
    x[1] = 0.01; // -0.5 -> -0 (even)
    x[2] = 0.03; // -1.5 -> -2 (even)
    x[3] = -2.54; // +127
    let b = &quantize_row_q8_k(&x).unwrap()[0];
    assert_eq!(&b.qs[..4], &[-127, 0, -2, 127]);
    assert_eq!(b.d, 1.0 / (-127.0f32 / 2.54));
    assert_eq!(b.bsums[0], -2);
    // A negative outlier flips the scale's sign, not the values' meaning.
    x[5] = -10.0;
    let b = &quantize_row_q8_k(&x).unwrap()[0];
    assert_eq!(b.qs[5], -127);
    assert!(b.d > 0.0 && (b.qs[0] as f32 * b.d - 2.54).abs() < 0.04);
    // An all-zero block; a partial block is an error.
    assert_eq!(quantize_row_q8_k(&[0.0; 256]).unwrap()[0].d, 0.0);
    assert!(quantize_row_q8_k(&[1.0; 255]).is_err());
}

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q4_k() {
    check_k(GgmlType::Q4_K);
}

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q6_k() {
    check_k(GgmlType::Q6_K);
}

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q8_0() {
    check(GgmlType::Q8_0);
}

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q4_1() {
    check(GgmlType::Q4_1);
}
