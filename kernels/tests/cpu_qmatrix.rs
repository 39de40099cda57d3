//! Matmuls over weights held in their quantized blocks equal, bit for bit,
//! the same matmuls over the weights dequantized to f32, in every activation
//! mode and at every grouping the inner loops use (one to nine activation
//! rows; weight row counts that leave a remainder of the groups of four and
//! of the 16-row chunks), and with activations quantized once and shared.

use kernels::cpu::matmul::{matmul_with_mins, Act, Linear, Matrix, Quantized};
use kernels::cpu::qmatrix::{QMatrix, Weight};
use model::quant::{quantize_q4_1, quantize_q8_0};
use model::GgmlType;

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

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn q4_1_mins(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(20)
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect()
}

/// The quantized weight and its dequantized twin.
fn pair(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Matrix) {
    let wf = seq(rows * cols, seed, 0.2);
    let bytes = match ty {
        GgmlType::Q8_0 => quantize_q8_0(&wf).unwrap(),
        // Q4_0 blocks made of Q4_1's scale and nibbles (its minimum dropped).
        GgmlType::Q4_0 => quantize_q4_1(&wf)
            .unwrap()
            .chunks_exact(20)
            .flat_map(|b| b[..2].iter().chain(&b[4..]).copied())
            .collect(),
        _ => quantize_q4_1(&wf).unwrap(),
    };
    let mut data = vec![0f32; rows * cols];
    model::quant::dequantize(ty, &bytes, &mut data).unwrap();
    let q = QMatrix {
        rows,
        cols,
        ty,
        bytes: bytes.into(),
    };
    let m = Matrix {
        rows,
        cols,
        data,
        block: 32,
    };
    (q, m)
}

#[test]
fn quantized_weights_give_the_dequantized_bits() {
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        // 37 rows: two 16-row chunks and a chunk of 5 (a group of 4 and 1).
        let (rows, cols) = (37, 96);
        let (q, m) = pair(ty, rows, cols, 3);
        let mins = (ty == GgmlType::Q4_1).then(|| q4_1_mins(&q.bytes));
        for n in 1..=9 {
            let x = seq(n * cols, 100 + n as u64, 2.0);
            for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
                let a = matmul_with_mins(&x, n, &q, mins.as_deref(), act);
                let b = matmul_with_mins(&x, n, &m, mins.as_deref(), act);
                assert_eq!(bits(&a), bits(&b), "{ty} n {n} {act:?}");
                // Row r of a batch equals row r alone (decode = prefill).
                for r in [0, n - 1] {
                    let one = matmul_with_mins(&x[r * cols..][..cols], 1, &q, mins.as_deref(), act);
                    assert_eq!(
                        bits(&one),
                        bits(&a[r * rows..][..rows]),
                        "{ty} n {n} row {r}"
                    );
                }
            }
            // f64 activations too.
            let x64: Vec<f64> = x.iter().map(|&v| v as f64 * 1.1).collect();
            let a = matmul_with_mins(&x64, n, &q, None, Act::Float);
            let b = matmul_with_mins(&x64, n, &m, None, Act::Float);
            assert_eq!(a, b, "{ty} n {n} f64");
        }
    }
}

#[test]
fn a_changed_weight_block_changes_the_result() {
    // The comparison above can fail: one nibble changed in the quantized
    // bytes moves the outputs of its row.
    let (mut q, m) = pair(GgmlType::Q4_1, 8, 64, 5);
    q.bytes[4] ^= 0x01;
    let x = seq(64, 9, 1.0);
    let a = matmul_with_mins(&x, 1, &q, None, Act::Float);
    let b = matmul_with_mins(&x, 1, &m, None, Act::Float);
    assert_ne!(bits(&a[..1]), bits(&b[..1]));
    assert_eq!(bits(&a[1..]), bits(&b[1..]));
}

#[test]
fn activations_quantized_once_give_the_same_bits() {
    let (q1, _) = pair(GgmlType::Q4_1, 20, 64, 7);
    let (q2, _) = pair(GgmlType::Q4_1, 12, 64, 8);
    let lin = |q: QMatrix| Linear {
        mins: Some(q4_1_mins(&q.bytes)),
        m: Weight::Quant(q),
        bias: None,
    };
    let (l1, l2) = (lin(q1), lin(q2));
    for n in [1, 5] {
        let x = seq(n * 64, 11, 3.0);
        for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
            let shared = Quantized::for_weights(&x, n, act, &[&l1, &l2]);
            for l in [&l1, &l2] {
                let alone = l.apply(&x, n, act);
                let with = l.apply_shared(&x, n, act, Some(&shared));
                assert_eq!(bits(&alone), bits(&with), "n {n} {act:?}");
            }
        }
    }
}
