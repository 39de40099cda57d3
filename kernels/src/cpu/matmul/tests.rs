use super::super::qmatrix::Matrix;
use super::super::quant_row::quantize_row;
use super::super::rows::{dot, dot4};
use super::*;

/// Feature-major blocks land in their rows, four by four where the
/// element is four bytes and one by one at the edges, for f32 and f64,
/// at every shape around the registers' four; every element once.
#[test]
fn a_task_block_lands_in_its_rows() {
    fn check<T: Copy + PartialEq + std::fmt::Debug + From<u16>>() {
        for (k, n) in [(1, 1), (4, 4), (4, 37), (12, 5), (16, 37), (7, 9), (3, 8)] {
            let stride = k + 3;
            let buf: Vec<T> = (0..k * n).map(|i| T::from(i as u16 + 1)).collect();
            let mut out = vec![T::from(0); n * stride];
            // SAFETY: `out` holds n rows of `stride` >= k elements.
            unsafe { transpose_into(&buf, k, n, out.as_mut_ptr(), stride) };
            for r in 0..n {
                for o in 0..stride {
                    let want = if o < k { buf[o * n + r] } else { T::from(0) };
                    assert_eq!(
                        out[r * stride + o],
                        want,
                        "k {k} n {n}: row {r}, feature {o}"
                    );
                }
            }
        }
    }
    check::<f32>();
    check::<f64>();
}

fn seq(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32
                - 0.5
        })
        .collect()
}

#[test]
fn dot4_is_dot_bit_for_bit_at_boundary_lengths() {
    for len in [1, 7, 8, 9, 31, 32, 33, 576] {
        let w = seq(len, 1);
        let rows: Vec<Vec<f32>> = (0..4).map(|r| seq(len, 10 + r)).collect();
        let got = dot4([&rows[0], &rows[1], &rows[2], &rows[3]], &w);
        for r in 0..4 {
            assert_eq!(
                got[r].to_bits(),
                dot(&rows[r], &w).to_bits(),
                "len {len} row {r}"
            );
        }
    }
}

/// A Q8_0 matrix of `rows` × `cols` with small finite scales.
fn q8_0(rows: usize, cols: usize) -> super::super::qmatrix::QMatrix {
    let mut bytes = Vec::new();
    for (b, v) in seq(rows * cols / 32, 11).into_iter().enumerate() {
        bytes.extend_from_slice(&half::f16::from_f32(0.01 + v.abs() / 50.0).to_le_bytes());
        bytes.extend((0..32).map(|i| ((b * 37 + i * 11) % 255) as u8));
    }
    super::super::qmatrix::QMatrix {
        rows,
        cols,
        ty: model::quant::GgmlType::Q8_0,
        bytes: bytes.into(),
    }
}

#[test]
fn rows_cut_into_parts_give_the_same_bits() {
    // 37 rows (a prefill) and 5 (parts of one to four rows take the
    // decode's loops), each activation handling, cut into 1 to 6 parts:
    // every output the same bits. A wrong part offset goes red.
    let (cols, rows) = (64, 24);
    let dense = Matrix {
        rows,
        cols,
        data: seq(rows * cols, 3),
        block: 1,
    };
    let quant = q8_0(rows, cols);
    for n in [37, 5] {
        let x = seq(n * cols, 7);
        for act in [Act::Float, Act::Q8, Act::LlamaCpp] {
            let q = quantize_rows(&x, n, 32, act);
            let llama =
                super::super::llamacpp_dot::rows_for(act == Act::LlamaCpp, true, 32, Some(&q));
            let quantized = Job {
                x: &x,
                n,
                w: &quant,
                mins: None,
                q: (act != Act::Float).then_some(&q[..]),
                llama: llama.as_deref(),
            };
            let float = Job {
                x: &x,
                n,
                w: &dense,
                mins: None,
                q: None,
                llama: None,
            };
            let whole = run_jobs_split(std::slice::from_ref(&quantized), 8, 1);
            let dense_whole = run_jobs_split(std::slice::from_ref(&float), 4, 1);
            for parts in 2..=6 {
                let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                    v.iter()
                        .map(|r| r.iter().map(|x| x.to_bits()).collect())
                        .collect()
                };
                let cut = run_jobs_split(std::slice::from_ref(&quantized), 8, parts);
                assert_eq!(bits(&cut), bits(&whole), "{n} rows, {act:?}, {parts} parts");
                let cut = run_jobs_split(std::slice::from_ref(&float), 4, parts);
                assert_eq!(
                    bits(&cut),
                    bits(&dense_whole),
                    "dense, {n} rows, {parts} parts"
                );
            }
        }
    }
}

#[test]
fn batched_rows_equal_single_rows() {
    // 1 to 9 rows: blocks of four plus a remainder.
    let w = Matrix {
        rows: 3,
        cols: 40,
        data: seq(120, 3),
        block: 1,
    };
    for n in [1, 3, 4, 5, 8, 9] {
        let x = seq(n * 40, 7);
        let batched = matmul(&x, n, &w, Act::Float);
        for r in 0..n {
            let one = matmul(&x[r * 40..(r + 1) * 40], 1, &w, Act::Float);
            assert_eq!(&batched[r * 3..(r + 1) * 3], &one[..], "n {n} row {r}");
        }
    }
}

#[test]
fn quantize_row_crushes_a_block_with_an_outlier() {
    // One massive value: the rest of its 32-block rounds to zero, the
    // next block keeps its resolution.
    let mut x = vec![0.01f32; 64];
    x[7] = -3000.0;
    let q = quantize_row(&x, 32);
    assert_eq!(q.q[7], -127.0);
    assert!(q.q[..32]
        .iter()
        .enumerate()
        .all(|(i, v)| i == 7 || *v == 0.0));
    assert!(q.q[32..].iter().all(|v| *v == 127.0));
    // The 32-block scale is stored as f16, as block_q8_0 does.
    assert_eq!(q.d[0], half::f16::from_f64(3000.0 / 127.0).to_f32());
}

#[test]
fn q8_matmul_is_close_without_outliers_and_far_with_one() {
    let w = Matrix {
        rows: 16,
        cols: 64,
        data: seq(16 * 64, 5),
        block: 32,
    };
    let x = seq(64, 9);
    let f = matmul(&x, 1, &w, Act::Float);
    let q = matmul(&x, 1, &w, Act::Q8);
    let err = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max)
    };
    assert!(err(&f, &q) < 0.01, "{}", err(&f, &q));
    assert_ne!(f, q);
    // Float weights (block 1) are never quantized.
    let wf = Matrix {
        block: 1,
        ..w.clone()
    };
    assert_eq!(matmul(&x, 1, &wf, Act::Q8), f);
    // An outlier in block 0: the product with column 0 stays exact-ish,
    // but the other 31 values of the block are lost.
    let mut xo = x.clone();
    xo[0] = 1000.0;
    let (fo, qo) = (matmul(&xo, 1, &w, Act::Float), matmul(&xo, 1, &w, Act::Q8));
    assert!(
        err(&fo, &qo) > 10.0 * err(&f, &q),
        "{} vs {}",
        err(&fo, &qo),
        err(&f, &q)
    );
}
