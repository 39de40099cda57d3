//! Row passes that do in one parallel region what the forward had done in
//! several: the residual add, the norm after it and the quantization of
//! the norm's rows for the next matmuls; the FFN's gated product and the
//! quantization of its rows for the down projection. Each element is the
//! same expression as in the separate ops ([`super::residual`],
//! [`super::norm`], [`super::ffn`], [`super::quant_row`]), only computed row
//! by row in one task, so the bits do not change; what goes is a region's
//! fork and join per op and the serial residual add.

use super::ffn::gated_into;
use super::matmul::{give_back_all, quantizer, Act, QuantRows};
use super::norm::norm_row;
use super::profile::{self, Op};
use super::quant_row::{take_rows, QuantRow};
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

impl<T: Send + 'static> Prepared<T> {
    /// Drops the rows and keeps the quantized ones for the next row pass
    /// of this thread (`quant_row::give_back`).
    pub fn release(self) {
        give_back_all(self.qs);
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
    let n = x.len() / d.max(1);
    assert_eq!(x.len(), n * d, "rows of {d}");
    let quantize = quantizer::<T>(act);
    let slots = QuantSlots::new(blocks, n);
    let body = |r: usize, xr: &mut [T], hr: &mut [T]| {
        if let Some(a) = add {
            for (xi, yi) in xr.iter_mut().zip(&a[r * d..(r + 1) * d]) {
                *xi += *yi;
            }
        }
        norm_row(xr, w, eps, hr);
        // SAFETY: one call per row (one task per row, or the loop below).
        unsafe { slots.fill(r, |b, row| quantize(hr, b, row)) };
    };
    let h = if par::worth(x.len(), n) {
        par::chunks_fresh_map(x, d, d, body).0
    } else {
        let mut h = vec![T::ZERO; x.len()];
        x.chunks_mut(d)
            .zip(h.chunks_mut(d))
            .enumerate()
            .for_each(|(r, (xr, hr))| body(r, xr, hr));
        h
    };
    Prepared {
        qs: slots.finish(),
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
    let n = g.len() / width.max(1);
    assert_eq!(g.len(), n * width, "rows of {width}");
    let quantize = quantizer::<T>(q_act);
    let slots = QuantSlots::new(blocks, n);
    let body = |r: usize, hr: &mut [T]| {
        let (gr, ur) = (&g[r * width..][..width], &u[r * width..][..width]);
        gated_into(act, gr, ur, hr);
        // SAFETY: one call per row (one task per row, or the loop below).
        unsafe { slots.fill(r, |b, row| quantize(hr, b, row)) };
    };
    let h = if par::worth(g.len(), n) {
        par::chunks_fresh_map(&mut vec![(); n], 1, width, |r, _, hr| body(r, hr)).0
    } else {
        let mut h = vec![T::ZERO; g.len()];
        h.chunks_mut(width)
            .enumerate()
            .for_each(|(r, hr)| body(r, hr));
        h
    };
    Prepared {
        qs: slots.finish(),
        h,
    }
}

/// Each block size's list of `n` quantized rows, written in place by the
/// row tasks into rows taken from this thread's spare ones ([`take_rows`]):
/// a row's quantized rows had come back in a `Vec` of their own, and later
/// were allocated afresh in every row pass and freed after its matmuls in
/// regions of their own (`par::drop_rows`), some 120 regions of a q8
/// prefill.
struct QuantSlots<T> {
    /// Untouched until [`QuantSlots::finish`]: the tasks write through `at`.
    lists: QuantRows<T>,
    /// Each list's block size and its rows.
    at: Vec<(usize, par::Ptr<QuantRow<T>>)>,
    n: usize,
}

impl<T: Send + 'static> QuantSlots<T> {
    fn new(blocks: &[usize], n: usize) -> QuantSlots<T> {
        let mut lists: QuantRows<T> = blocks.iter().map(|&b| (b, take_rows(n))).collect();
        let at = lists
            .iter_mut()
            .map(|(b, l)| (*b, par::Ptr(l.as_mut_ptr())))
            .collect();
        QuantSlots { lists, at, n }
    }

    /// Row `r`'s quantized row for each block size `b`: `quantize(b, row)`
    /// writes it into `row`.
    ///
    /// # Safety
    /// At most one call per row `r` at a time (two tasks must not write one
    /// row).
    unsafe fn fill(&self, r: usize, quantize: impl Fn(usize, &mut QuantRow<T>)) {
        assert!(r < self.n, "row {r} of {}", self.n);
        for (b, at) in &self.at {
            // SAFETY: row `r` is within the list (`r < n`), and only this
            // call touches it; nothing reads it before `finish`.
            quantize(*b, unsafe { &mut *at.at(r) });
        }
    }

    /// The lists, each of `n` rows in row order.
    fn finish(self) -> QuantRows<T> {
        self.lists
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ffn::gated;
    use crate::cpu::matmul::quantize_rows;
    use crate::cpu::norm::rms_norm;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.37 + seed).sin() * 3.0) + (i % 7) as f32 * 0.01)
            .collect()
    }

    /// Each block size's rows, field by field, bit for bit.
    fn assert_same(got: &QuantRows<f32>, want: &QuantRows<f32>, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: block sizes");
        for ((gb, g), (wb, w)) in got.iter().zip(want) {
            assert_eq!(gb, wb, "{what}: block size");
            assert_eq!(g.len(), w.len(), "{what}: rows of block {gb}");
            for (r, (g, w)) in g.iter().zip(w).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&g.q) == bits(&w.q)
                        && bits(&g.d) == bits(&w.d)
                        && bits(&g.s_err) == bits(&w.s_err),
                    "{what}: block {gb}, row {r}"
                );
            }
        }
    }

    /// The fused passes' quantized rows, filled in place by the row tasks,
    /// are `quantize_rows` of their output rows, each in its row's place:
    /// one row and two (in the calling thread), 37 (a prefill's, in a
    /// region), two block sizes at once.
    #[test]
    fn fused_passes_quantize_each_row_into_its_place() {
        let d = 256;
        for n in [1, 2, 37] {
            for act in [Act::Q8, Act::LlamaCpp] {
                let blocks = [32, 256];
                let what = format!("{n} rows, {act:?}");
                let w = values(d, 9.0);
                let x0 = values(n * d, 1.0);
                let add = values(n * d, 2.0);
                let mut x = x0.clone();
                let p = add_norm_quantize(&mut x, Some(&add), &w, 1e-5, &blocks, act);
                let sum: Vec<f32> = x0.iter().zip(&add).map(|(a, b)| a + b).collect();
                assert_eq!(p.h, rms_norm(&sum, &w, 1e-5), "{what}: norm");
                let want: QuantRows<f32> = blocks
                    .iter()
                    .map(|&b| (b, quantize_rows(&p.h, n, b, act)))
                    .collect();
                assert_same(&p.qs, &want, &format!("norm, {what}"));

                let (g, u) = (values(n * d, 3.0), values(n * d, 4.0));
                let p = gated_quantize(FfnActivation::Silu, &g, &u, d, &blocks, act);
                assert_eq!(p.h, gated(FfnActivation::Silu, &g, &u), "{what}: gated");
                let want: QuantRows<f32> = blocks
                    .iter()
                    .map(|&b| (b, quantize_rows(&p.h, n, b, act)))
                    .collect();
                assert_same(&p.qs, &want, &format!("gated, {what}"));
            }
        }
    }
}
