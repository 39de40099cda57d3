//! One rank's weights: a column-parallel matmul's rows (output features) and
//! a row-parallel matmul's columns (input features), cut from the prepared
//! [`Linear`] in place of their format (quantized blocks stay blocks), so a
//! rank's matmul reads exactly the weights the full matmul reads there.

use super::super::matmul::Linear;
use super::super::qmatrix::{Matrix, QMatrix, Weight};
use super::super::weights::DenseLayer;
use super::plan::RankPlan;
use model::quant::GgmlType;
use std::ops::Range;

/// A rank's slices of one layer's matmul weights.
#[derive(Debug, Clone)]
pub struct RankLayer {
    /// Rows of `wq` for the rank's query heads.
    pub wq: Linear,
    /// Rows of `wk` / `wv` for the KV heads it holds.
    pub wk: Linear,
    /// Rows of `wv` for the KV heads it holds.
    pub wv: Linear,
    /// Columns of `wo` for its query heads.
    pub wo: Linear,
    /// Rows of `w_gate` for its FFN columns.
    pub w_gate: Linear,
    /// Rows of `w_up` for its FFN columns.
    pub w_up: Linear,
    /// Columns of `w_down` for its FFN columns.
    pub w_down: Linear,
}

impl RankLayer {
    /// Cuts rank `p`'s share of layer `l`; rank 0 keeps a row-parallel
    /// matmul's bias (added once, before the all-reduce).
    pub fn new(l: &DenseLayer, p: &RankPlan, rank: usize, head_dim: usize) -> RankLayer {
        let hd = |r: &Range<usize>| r.start * head_dim..r.end * head_dim;
        let keep_bias = rank == 0;
        RankLayer {
            wq: rows(&l.wq, hd(&p.heads)),
            wk: rows(&l.wk, hd(&p.kv_held)),
            wv: rows(&l.wv, hd(&p.kv_held)),
            wo: cols(&l.wo, hd(&p.heads), keep_bias),
            w_gate: rows(&l.w_gate, p.ffn.clone()),
            w_up: rows(&l.w_up, p.ffn.clone()),
            w_down: cols(&l.w_down, p.ffn.clone(), keep_bias),
        }
    }
}

/// Output features `r` of `l`: its rows, their Q4_1 minimums and bias.
pub fn rows(l: &Linear, r: Range<usize>) -> Linear {
    let m = match &l.m {
        Weight::Dense(m) => Weight::Dense(Matrix {
            rows: r.len(),
            cols: m.cols,
            data: m.data[r.start * m.cols..r.end * m.cols].to_vec(),
            block: m.block,
        }),
        Weight::Quant(q) => {
            let rb = q.ty.row_bytes(q.cols);
            Weight::Quant(QMatrix {
                rows: r.len(),
                cols: q.cols,
                ty: q.ty,
                bytes: q.bytes.slice(r.start * rb..r.end * rb),
            })
        }
    };
    let cols = match &l.m {
        Weight::Dense(m) => m.cols,
        Weight::Quant(q) => q.cols,
    };
    let per_row = cols / GgmlType::Q4_1.block_size();
    Linear {
        m,
        mins: l
            .mins
            .as_ref()
            .map(|mins| mins[r.start * per_row..r.end * per_row].to_vec()),
        bias: l.bias.as_ref().map(|b| b[r].to_vec()),
    }
}

/// Input features `c` of `l` (block-aligned, see [`super::plan`]): the same
/// slice of every row, and of every row's Q4_1 minimums; the bias kept only
/// where `keep_bias`.
pub fn cols(l: &Linear, c: Range<usize>, keep_bias: bool) -> Linear {
    let (m, n_cols) = match &l.m {
        Weight::Dense(m) => {
            let data = (0..m.rows)
                .flat_map(|r| m.row(r)[c.clone()].iter().copied())
                .collect();
            let w = Weight::Dense(Matrix {
                rows: m.rows,
                cols: c.len(),
                data,
                block: m.block,
            });
            (w, m.cols)
        }
        Weight::Quant(q) => {
            let (bs, ts) = (q.ty.block_size(), q.ty.type_size());
            debug_assert!(
                c.start.is_multiple_of(bs) && c.end.is_multiple_of(bs),
                "plan aligns blocks"
            );
            let rb = q.ty.row_bytes(q.cols);
            let span = c.start / bs * ts..c.end / bs * ts;
            let bytes: Vec<u8> = q
                .bytes
                .chunks_exact(rb)
                .flat_map(|row| row[span.clone()].iter().copied())
                .collect();
            let w = Weight::Quant(QMatrix {
                rows: q.rows,
                cols: c.len(),
                ty: q.ty,
                bytes: bytes.into(),
            });
            (w, q.cols)
        }
    };
    let qb = GgmlType::Q4_1.block_size();
    let mins = l.mins.as_ref().map(|mins| {
        mins.chunks_exact(n_cols / qb)
            .flat_map(|row| row[c.start / qb..c.end / qb].iter().copied())
            .collect()
    });
    Linear {
        m,
        mins,
        bias: l.bias.clone().filter(|_| keep_bias),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::matmul::Act;
    use super::*;

    fn linear(rows: usize, cols: usize) -> Linear {
        Linear {
            m: Weight::Dense(Matrix {
                rows,
                cols,
                data: (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect(),
                block: 1,
            }),
            mins: None,
            bias: None,
        }
    }

    #[test]
    fn row_slices_give_the_same_outputs_bit_for_bit() {
        let l = linear(12, 16);
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 - 4.0).collect();
        let full = l.apply(&x, 2, Act::Float);
        let part = rows(&l, 4..9).apply(&x, 2, Act::Float);
        for r in 0..2 {
            assert_eq!(&part[r * 5..(r + 1) * 5], &full[r * 12 + 4..r * 12 + 9]);
        }
    }

    #[test]
    fn column_slices_sum_to_the_full_product() {
        let l = linear(6, 16);
        let x: Vec<f64> = (0..16).map(|i| i as f64 * 0.5 - 3.0).collect();
        let full = l.apply(&x, 1, Act::Float);
        let a = cols(&l, 0..8, true).apply(&x[..8], 1, Act::Float);
        let b = cols(&l, 8..16, false).apply(&x[8..], 1, Act::Float);
        for i in 0..6 {
            // Small integers in f64: every order of summation is exact.
            assert_eq!(a[i] + b[i], full[i]);
        }
    }
}
