//! Row passes that do in one parallel region what the forward had done in
//! several: the residual add, the norm after it and the quantization of
//! the norm's rows for the next matmuls; the FFN's gated product and the
//! quantization of its rows for the down projection. Each element is the
//! same expression as in the separate ops ([`super::residual`],
//! [`super::norm`], [`super::ffn`], [`super::quant_row`]), only computed row
//! by row in one task, so the bits do not change; what goes is a region's
//! fork and join per op and the serial residual add.

use super::ffn::gated_into;
use super::matmul::{quantizer, Act, QuantRows};
use super::norm::norm_row;
use super::profile::{self, Op};
use super::quant_row::QuantRow;
use super::{par, Real};
use model::FfnActivation;

/// Rows ready for a group of matmuls: `h` (`[n, width]`) and its rows
/// quantized per block size.
pub struct Prepared<T> {
    /// The rows themselves (tapped, and read by float matmuls).
    pub h: Vec<T>,
    /// `h`'s rows quantized per block size (empty for float activations).
    pub qs: QuantRows<T>,
}

impl<T: Send> Prepared<T> {
    /// Drops the rows, the quantized ones in parallel (`par::drop_rows`).
    pub fn release(self) {
        let width = self
            .qs
            .first()
            .map_or(0, |(_, rows)| self.h.len() / rows.len().max(1));
        for (_, rows) in self.qs {
            par::drop_rows(rows, width);
        }
    }
}

/// `x += add` (when given), then `h = rms_norm(x, w, eps)`, then `h`'s rows
/// quantized per block of each of `blocks` as `act` quantizes them; one
/// task per row.
pub fn add_norm_quantize<T: Real>(
    x: &mut [T],
    add: Option<&[T]>,
    w: &[f32],
    eps: f32,
    blocks: &[usize],
    act: Act,
) -> Prepared<T> {
    let _p = profile::op(Op::Norm);
    let d = w.len();
    if let Some(a) = add {
        assert_eq!(a.len(), x.len(), "residual shape");
    }
    let quantize = quantizer::<T>(act);
    let body = |r: usize, xr: &mut [T], hr: &mut [T]| {
        if let Some(a) = add {
            for (xi, yi) in xr.iter_mut().zip(&a[r * d..(r + 1) * d]) {
                *xi += *yi;
            }
        }
        norm_row(xr, w, eps, hr);
        blocks.iter().map(|&b| quantize(hr, b)).collect::<Vec<_>>()
    };
    let (h, rows): (Vec<T>, Vec<Vec<QuantRow<T>>>) = if par::worth(x.len(), x.len() / d.max(1)) {
        par::chunks_fresh_map(x, d, d, body)
    } else {
        let mut h = vec![T::ZERO; x.len()];
        let rows = x
            .chunks_mut(d)
            .zip(h.chunks_mut(d))
            .enumerate()
            .map(|(r, (xr, hr))| body(r, xr, hr))
            .collect();
        (h, rows)
    };
    Prepared {
        qs: by_block(blocks, rows),
        h,
    }
}

/// `gated(act, g, u)` (`[n, width]` each), then its rows quantized per
/// block of each of `blocks` as `q_act` quantizes them; one task per row.
pub fn gated_quantize<T: Real>(
    act: FfnActivation,
    g: &[T],
    u: &[T],
    width: usize,
    blocks: &[usize],
    q_act: Act,
) -> Prepared<T> {
    let _p = profile::op(Op::Gated);
    assert_eq!(g.len(), u.len(), "gate and up shapes");
    let quantize = quantizer::<T>(q_act);
    let body = |r: usize, hr: &mut [T]| {
        let (gr, ur) = (&g[r * width..][..width], &u[r * width..][..width]);
        gated_into(act, gr, ur, hr);
        blocks.iter().map(|&b| quantize(hr, b)).collect::<Vec<_>>()
    };
    let n = g.len() / width.max(1);
    let (h, rows): (Vec<T>, Vec<Vec<QuantRow<T>>>) = if par::worth(g.len(), n) {
        par::chunks_fresh_map(&mut vec![(); n], 1, width, |r, _, hr| body(r, hr))
    } else {
        let mut h = vec![T::ZERO; g.len()];
        let rows = h
            .chunks_mut(width)
            .enumerate()
            .map(|(r, hr)| body(r, hr))
            .collect();
        (h, rows)
    };
    Prepared {
        qs: by_block(blocks, rows),
        h,
    }
}

/// Per-row lists of quantized rows (one per block size) as per-block-size
/// lists of rows.
fn by_block<T>(blocks: &[usize], rows: Vec<Vec<QuantRow<T>>>) -> QuantRows<T> {
    let mut qs: QuantRows<T> = blocks
        .iter()
        .map(|&b| (b, Vec::with_capacity(rows.len())))
        .collect();
    for row in rows {
        for ((_, list), q) in qs.iter_mut().zip(row) {
            list.push(q);
        }
    }
    qs
}
