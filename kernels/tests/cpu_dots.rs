//! Every output of a matmul is the reference dot product of its activation
//! row and weight row, bit for bit, whatever grouping the inner loops use
//! (four activation rows against one or two weight rows, one activation row
//! against four weight rows, remainders): the f32 order is eight lanes,
//! `mul` then `add`, lanes summed pairwise ([`rows::dot`]), and the q8 order
//! is that dot per 32-block, scaled and added block after block.

use kernels::cpu::matmul::{matmul, matmul_with_mins, Act};
use kernels::cpu::qmatrix::{Matrix, QMatrix};
use kernels::cpu::quant_row::quantize_row;
use kernels::cpu::rows;
use model::quant::quantize_q4_1;
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

/// A Q4_1 weight and its dequantized rows.
fn weight(rows: usize, cols: usize) -> (QMatrix, Matrix) {
    let bytes = quantize_q4_1(&seq(rows * cols, 3, 0.2)).unwrap();
    let mut data = vec![0f32; rows * cols];
    model::quant::dequantize(GgmlType::Q4_1, &bytes, &mut data).unwrap();
    let q = QMatrix {
        rows,
        cols,
        ty: GgmlType::Q4_1,
        bytes: bytes.into(),
    };
    let block = 32;
    (
        q,
        Matrix {
            rows,
            cols,
            data,
            block,
        },
    )
}

/// The q8 reference: `sum_b d_b * dot(q_b, w_b)`, blocks in order.
fn q8_dot(x: &[f32], w: &[f32]) -> f32 {
    let qr = quantize_row(x, 32);
    let mut acc = 0f32;
    for (b, d) in qr.d.iter().enumerate() {
        let s = b * 32..(b + 1) * 32;
        acc += *d * rows::dot(&qr.q[s.clone()], &w[s]);
    }
    acc
}

/// The same terms as [`rows::dot`], summed in plain index order.
fn dot_in_index_order(x: &[f32], w: &[f32]) -> f32 {
    x.iter().zip(w).fold(0f32, |acc, (a, b)| acc + a * b)
}

#[test]
fn every_output_is_the_reference_dot() {
    // 11 weight rows: groups of four, a pair and an odd row; 1 to 9
    // activation rows: groups of four and every remainder.
    let (rows, cols) = (11, 96);
    let (q, m) = weight(rows, cols);
    for n in 1..=9 {
        let x = seq(n * cols, 10 + n as u64, 2.0);
        let row = |r: usize| &x[r * cols..(r + 1) * cols];
        for (act, reference) in [
            (Act::Float, rows::dot::<f32> as fn(&[f32], &[f32]) -> f32),
            (Act::Q8, q8_dot),
        ] {
            let yq = matmul(&x, n, &q, act);
            let ym = matmul(&x, n, &m, act);
            for r in 0..n {
                for o in 0..rows {
                    let want = reference(row(r), m.row(o)).to_bits();
                    let at = format!("n {n} row {r} feature {o} {act:?}");
                    assert_eq!(yq[r * rows + o].to_bits(), want, "quantized, {at}");
                    assert_eq!(ym[r * rows + o].to_bits(), want, "dense, {at}");
                }
            }
        }
    }
}

/// Q4_1's per-block minimums of `q`'s rows, `[rows, cols / 32]`.
fn q4_1_mins(q: &QMatrix) -> Vec<f32> {
    q.bytes
        .chunks_exact(20)
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect()
}

#[test]
fn the_q8_min_term_follows_the_block_dots_block_by_block() {
    // `sum_b d_b * dot(q_b, w_b)`, then `+ m_b * s_err_b` for each block in
    // order (one f32 `mul` and `add` each), at every grouping of rows.
    let (rows, cols) = (11, 96);
    let (q, m) = weight(rows, cols);
    let mins = q4_1_mins(&q);
    let nb = cols / 32;
    for n in 1..=9 {
        let x = seq(n * cols, 40 + n as u64, 2.0);
        let yq = matmul_with_mins(&x, n, &q, Some(&mins), Act::Q8);
        let ym = matmul_with_mins(&x, n, &m, Some(&mins), Act::Q8);
        for r in 0..n {
            let xr = &x[r * cols..(r + 1) * cols];
            let e = quantize_row(xr, 32).s_err;
            for o in 0..rows {
                let mut want = q8_dot(xr, m.row(o));
                for (mb, eb) in mins[o * nb..][..nb].iter().zip(&e) {
                    want += mb * eb;
                }
                let at = format!("n {n} row {r} feature {o}");
                assert_eq!(
                    yq[r * rows + o].to_bits(),
                    want.to_bits(),
                    "quantized, {at}"
                );
                assert_eq!(ym[r * rows + o].to_bits(), want.to_bits(), "dense, {at}");
            }
        }
    }
    // And the term is there: without the minimums the outputs move.
    let x = seq(5 * cols, 45, 2.0);
    let with = matmul_with_mins(&x, 5, &q, Some(&mins), Act::Q8);
    let without = matmul_with_mins(&x, 5, &q, None, Act::Q8);
    assert_ne!(with, without);
}

#[test]
fn another_summation_order_is_seen() {
    // The comparison above can fail: the same products summed in index
    // order differ in the last bits from the eight-lane order somewhere.
    let (rows, cols) = (11, 96);
    let (_, m) = weight(rows, cols);
    let n = 9;
    let x = seq(n * cols, 19, 2.0);
    let y = matmul(&x, n, &m, Act::Float);
    let differ = (0..n * rows)
        .filter(|i| {
            let (r, o) = (i / rows, i % rows);
            let other = dot_in_index_order(&x[r * cols..(r + 1) * cols], m.row(o));
            other.to_bits() != y[*i].to_bits()
        })
        .count();
    assert!(
        differ > 0,
        "index-order sums equal the eight-lane ones everywhere"
    );
}

#[test]
fn a_group_of_matmuls_equals_each_alone() {
    use kernels::cpu::matmul::{apply_group, Linear};
    use kernels::cpu::qmatrix::Weight;
    // q, k and v shapes in small: a quantized weight with Q4_1's minimums,
    // a narrower one with a bias, and a dense one (never quantized).
    let (cols, q1) = (64, weight(20, 64).0);
    let mins = q1
        .bytes
        .chunks_exact(20)
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect();
    let l1 = Linear {
        m: Weight::Quant(q1),
        mins: Some(mins),
        bias: None,
    };
    let l2 = Linear {
        m: Weight::Quant(weight(12, 64).0),
        mins: None,
        bias: Some(seq(12, 4, 1.0)),
    };
    let l3 = Linear {
        m: Weight::Dense(weight(9, 64).1),
        mins: None,
        bias: None,
    };
    for n in [1, 2, 5, 9] {
        let x = seq(n * cols, 21 + n as u64, 3.0);
        for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
            let group = apply_group(&[&l1, &l2, &l3], &x, n, act);
            for (l, g) in [&l1, &l2, &l3].into_iter().zip(&group) {
                let alone = l.apply(&x, n, act);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(g), bits(&alone), "n {n} {act:?}");
            }
        }
    }
}
