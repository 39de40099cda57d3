//! The q8 matmul against llama.cpp's integer dot products, written out here
//! block by block: `block_q8_0` / `block_q8_1` activations (int8, f16 scale,
//! and for Q8_1 the f16 `s = d * sum(q)`) times Q8_0 and Q4_1 weight blocks,
//! `sumi * d_w * d_x (+ m_w * s_x)`. Our q8 path dots the int8 activations
//! with the dequantized weights instead; the two must agree to f32 rounding,
//! far inside the int8 error they both model.

use half::f16;
use kernels::cpu::matmul::{matmul, matmul_with_mins, Act, Matrix};
use kernels::quant::{quantize_q4_1, quantize_q8_0};
use kernels::{GgmlType, QTensor};

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
        data: bytes,
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

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q8_0() {
    check(GgmlType::Q8_0);
}

#[test]
fn q8_matches_llama_cpp_integer_dot_on_q4_1() {
    check(GgmlType::Q4_1);
}
