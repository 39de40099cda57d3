//! Matmuls over weights held in their quantized blocks equal, bit for bit,
//! the same matmuls over the weights dequantized to f32, in every activation
//! mode and at every grouping the inner loops use (one to nine activation
//! rows; weight row counts that leave a remainder of the groups of four and
//! of the 16-row chunks), and in the one-region group the forward runs
//! q/k/v and gate/up through. The exception is `--precision llamacpp` on
//! Q4_1 and Q8_0 weights, whose sums are llama.cpp's integer dots of the
//! blocks themselves (`kernels::cpu::llamacpp_dot`): there the blocks give
//! other bits than their dequantized twin (which keeps the reference
//! order), and the group and one row alone must still equal the matmul.

use kernels::cpu::llamacpp_dot;
use kernels::cpu::matmul::{apply_group, matmul_with_mins, Act, Linear};
use kernels::cpu::qmatrix::{Matrix, QMatrix, Weight};
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
                if act == Act::LlamaCpp && llamacpp_dot::modelled(ty) {
                    assert_ne!(bits(&a), bits(&b), "{ty} n {n}: llama.cpp's dot ran");
                } else {
                    assert_eq!(bits(&a), bits(&b), "{ty} n {n} {act:?}");
                }
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

/// As the forward runs q/k/v and gate/up: one `apply_group` over weights
/// held in their blocks (the activations quantized once, one parallel
/// region), each output the bits of its dequantized twin applied alone.
#[test]
fn a_group_on_the_blocks_gives_each_dequantized_matmul_alone() {
    let lin = |w: Weight, mins: &[f32]| Linear {
        mins: Some(mins.to_vec()),
        m: w,
        bias: None,
    };
    let (q1, m1) = pair(GgmlType::Q4_1, 20, 64, 7);
    let (q2, m2) = pair(GgmlType::Q4_1, 12, 64, 8);
    let (mins1, mins2) = (q4_1_mins(&q1.bytes), q4_1_mins(&q2.bytes));
    let group = [
        lin(Weight::Quant(q1), &mins1),
        lin(Weight::Quant(q2), &mins2),
    ];
    let twins = [
        lin(Weight::Dense(m1), &mins1),
        lin(Weight::Dense(m2), &mins2),
    ];
    for n in [1, 2, 5, 9] {
        let x = seq(n * 64, 11 + n as u64, 3.0);
        for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
            let ys = apply_group(&[&group[0], &group[1]], &x, n, act);
            // Under llamacpp, Q4_1 blocks sum as llama.cpp does: each
            // output of the group is then the matmul of the blocks alone.
            let alone_of = if act == Act::LlamaCpp { &group } else { &twins };
            for (y, alone) in ys.iter().zip(alone_of) {
                let alone = alone.apply(&x, n, act);
                assert_eq!(bits(y), bits(&alone), "n {n} {act:?}");
            }
        }
    }
    // The comparison can fail: a flipped nibble in the second weight's
    // first block moves its first row's outputs, and only those.
    let mut bad = group.clone();
    if let Weight::Quant(q) = &mut bad[1].m {
        q.bytes[4] ^= 0x10;
    }
    let x = seq(64, 12, 3.0);
    for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
        let ys = apply_group(&[&bad[0], &bad[1]], &x, 1, act);
        let alone_of = if act == Act::LlamaCpp { &group } else { &twins };
        assert_eq!(
            bits(&ys[0]),
            bits(&alone_of[0].apply(&x, 1, act)),
            "{act:?}"
        );
        let alone = alone_of[1].apply(&x, 1, act);
        assert_ne!(bits(&ys[1][..1]), bits(&alone[..1]), "{act:?}");
        assert_eq!(bits(&ys[1][1..]), bits(&alone[1..]), "{act:?}");
    }
}
