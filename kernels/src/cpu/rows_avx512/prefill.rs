//! Prefill's loops on 512-bit registers: four activation rows against two
//! or four weight rows, in float ([`dot4x2`], [`dot4x4`]) and in q8
//! ([`q8_rows4x2`], [`q8_rows4x4`]); the same bits as the AVX2 loops
//! (`rows_avx`), as the parent module says.

use super::super::rows_avx::{add_scaled, reduce8, split};
use super::{both_halves, high, reduce_blocks4};
use std::arch::x86_64::*;

/// Two weight rows' eight floats at `c` side by side: `w0`'s in the low
/// half, `w1`'s in the high.
///
/// # Safety
/// The CPU must support AVX-512F; 8 floats readable at each pointer.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair(w0: *const f32, w1: *const f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_loadu_ps(w0));
    _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(lo),
        _mm256_loadu_pd(w1 as *const f64),
        1,
    ))
}

/// The eight sums of four two-row accumulators (activation row `r`'s
/// sums against two weight rows in `acc[r]`), as the AVX2 loops sum them:
/// `[first weight row's four | second's four]`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_pairs4(acc: &[__m512; 4]) -> __m256 {
    let lo = [
        _mm512_castps512_ps256(acc[0]),
        _mm512_castps512_ps256(acc[1]),
        _mm512_castps512_ps256(acc[2]),
        _mm512_castps512_ps256(acc[3]),
    ];
    reduce8(lo, [high(acc[0]), high(acc[1]), high(acc[2]), high(acc[3])])
}

/// `rows_avx::dot4x2` (four activation rows against two weight rows) on
/// 512-bit registers, activation row `r`'s two sums in one register: the
/// same bits.
///
/// # Safety
/// The CPU must support AVX-512F; both weight rows the same length, a
/// multiple of 8, and every activation row at least that long.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot4x2(a: [&[f32]; 4], w: [&[f32]; 2]) -> [[f32; 4]; 2] {
    let mut acc = [_mm512_setzero_ps(); 4];
    for c in (0..w[0].len()).step_by(8) {
        let wv = pair(w[0].as_ptr().add(c), w[1].as_ptr().add(c));
        for (acc_r, a_r) in acc.iter_mut().zip(a) {
            let av = both_halves(a_r.as_ptr().add(c));
            *acc_r = _mm512_add_ps(*acc_r, _mm512_mul_ps(av, wv));
        }
    }
    split(reduce_pairs4(&acc))
}

/// [`dot4x2`] of weight rows `w[0], w[1]` and of `w[2], w[3]` in one loop:
/// each activation row's eight lanes loaded once for the four weight rows,
/// every sum [`dot4x2`]'s own (the same bits).
///
/// # Safety
/// As [`dot4x2`], for all four weight rows.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot4x4(a: [&[f32]; 4], w: [&[f32]; 4]) -> [[f32; 4]; 4] {
    let mut lo = [_mm512_setzero_ps(); 4];
    let mut hi = [_mm512_setzero_ps(); 4];
    for c in (0..w[0].len()).step_by(8) {
        let w01 = pair(w[0].as_ptr().add(c), w[1].as_ptr().add(c));
        let w23 = pair(w[2].as_ptr().add(c), w[3].as_ptr().add(c));
        for r in 0..4 {
            let av = both_halves(a[r].as_ptr().add(c));
            lo[r] = _mm512_add_ps(lo[r], _mm512_mul_ps(av, w01));
            hi[r] = _mm512_add_ps(hi[r], _mm512_mul_ps(av, w23));
        }
    }
    let [y0, y1] = split(reduce_pairs4(&lo));
    let [y2, y3] = split(reduce_pairs4(&hi));
    [y0, y1, y2, y3]
}

/// `rows_avx::q8_rows4x2` (four q8 rows against two weight rows, blocks of
/// `block`) on 512-bit registers: the same bits.
///
/// # Safety
/// As [`dot4x2`], with `block` a multiple of 8 dividing the length, `q[r]`
/// as long as the weight rows and `d[r]` holding a scale per block.
#[target_feature(enable = "avx512f")]
pub unsafe fn q8_rows4x2(
    q: [&[f32]; 4],
    d: [&[f32]; 4],
    w: [&[f32]; 2],
    block: usize,
) -> [[f32; 4]; 2] {
    let nb = w[0].len() / block;
    let mut t = Totals::default();
    while t.b + 2 <= nb {
        let (x, y) = (
            rows4xk_block::<2, 1>(q, w, block, t.b)[0],
            rows4xk_block::<2, 1>(q, w, block, t.b + 1)[0],
        );
        t.add_two(d, x, y);
    }
    let mut out = t.rows();
    while t.b < nb {
        out = t.add_one(out, d, rows4xk_block::<2, 1>(q, w, block, t.b)[0]);
    }
    out
}

/// [`q8_rows4x2`] of weight rows `w[0], w[1]` and of `w[2], w[3]` in one
/// pass over the blocks: each q8 row's eight lanes loaded once for the four
/// weight rows, every sum [`q8_rows4x2`]'s own (the same bits).
///
/// # Safety
/// As [`q8_rows4x2`], for all four weight rows.
#[target_feature(enable = "avx512f")]
pub unsafe fn q8_rows4x4(
    q: [&[f32]; 4],
    d: [&[f32]; 4],
    w: [&[f32]; 4],
    block: usize,
) -> [[f32; 4]; 4] {
    let nb = w[0].len() / block;
    let (mut lo, mut hi) = (Totals::default(), Totals::default());
    while lo.b + 2 <= nb {
        let [x0, x1] = rows4xk_block::<4, 2>(q, w, block, lo.b);
        let [y0, y1] = rows4xk_block::<4, 2>(q, w, block, lo.b + 1);
        lo.add_two(d, x0, y0);
        hi.add_two(d, x1, y1);
    }
    let (mut out_lo, mut out_hi) = (lo.rows(), hi.rows());
    while lo.b < nb {
        let [x0, x1] = rows4xk_block::<4, 2>(q, w, block, lo.b);
        out_lo = lo.add_one(out_lo, d, x0);
        out_hi = hi.add_one(out_hi, d, x1);
    }
    [out_lo[0], out_lo[1], out_hi[0], out_hi[1]]
}

/// The running totals of [`q8_rows4x2`]'s eight sums (four q8 rows against
/// a pair of weight rows) and the next block `b`. Two blocks at a time,
/// their sixteen sums are reduced in one register ([`reduce_blocks4`]):
/// quarter 0 holds (activation row, weight row) (0, 0), (2, 0) of block b,
/// then of block b + 1; quarter 1 the same rows against weight row 1;
/// quarters 2 and 3 activation rows 1 and 3. The totals sit in lanes 0 and
/// 1 of each quarter, each block's terms added in order.
struct Totals {
    t: __m512,
    b: usize,
}

impl Default for Totals {
    fn default() -> Totals {
        // SAFETY: zeroing a register needs no CPU feature beyond SSE.
        Totals {
            t: unsafe { std::mem::zeroed() },
            b: 0,
        }
    }
}

// The methods and `rows4xk_block` are inlined into their callers, whose
// AVX-512F their intrinsics need: called, they took and gave the blocks'
// registers through memory (a sixth of a q8 prefill).
impl Totals {
    /// Blocks `b` and `b + 1` (their eight-lane sums `x` and `y`) scaled by
    /// their rows' `d` and added.
    #[inline(always)]
    unsafe fn add_two(&mut self, d: [&[f32]; 4], x: [__m512; 4], y: [__m512; 4]) {
        let b = self.b;
        let s = reduce_blocks4([[x[0], x[1]], [x[2], x[3]], [y[0], y[1]], [y[2], y[3]]]);
        let d02 = _mm_setr_ps(d[0][b], d[2][b], d[0][b + 1], d[2][b + 1]);
        let d13 = _mm_setr_ps(d[1][b], d[3][b], d[1][b + 1], d[3][b + 1]);
        let dv = _mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(_mm256_set_m128(d02, d02))),
            _mm256_castps_pd(_mm256_set_m128(d13, d13)),
        );
        let p = _mm512_mul_ps(_mm512_castpd_ps(dv), s);
        let t = _mm512_mask_add_ps(self.t, FIRST_TWO_OF_QUARTERS, self.t, p);
        self.t = _mm512_mask_add_ps(t, FIRST_TWO_OF_QUARTERS, t, _mm512_permute_ps::<0b1110>(p));
        self.b += 2;
    }

    /// The totals so far as `[weight row][activation row]`.
    #[inline(always)]
    unsafe fn rows(&self) -> [[f32; 4]; 2] {
        let mut out = [[0f32; 4]; 2];
        if self.b == 0 {
            return out;
        }
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), self.t);
        for (k, out_k) in out.iter_mut().enumerate() {
            for (r, o) in out_k.iter_mut().enumerate() {
                *o = lanes[4 * (2 * (r % 2) + k) + r / 2];
            }
        }
        out
    }

    /// `out` (the totals as [`Totals::rows`] gives them) with block `b`
    /// alone (its sums `x`) scaled and added, as the AVX2 loop adds a last
    /// odd block.
    #[inline(always)]
    unsafe fn add_one(
        &mut self,
        out: [[f32; 4]; 2],
        d: [&[f32]; 4],
        x: [__m512; 4],
    ) -> [[f32; 4]; 2] {
        let total = _mm256_set_m128(_mm_loadu_ps(out[1].as_ptr()), _mm_loadu_ps(out[0].as_ptr()));
        let total = add_scaled(total, d, self.b, reduce_pairs4(&x));
        self.b += 1;
        split(total)
    }
}

/// Lanes 0 and 1 of each 128-bit quarter.
const FIRST_TWO_OF_QUARTERS: __mmask16 = 0x3333;

/// Block `b`'s eight-lane sums of four q8 rows against `K` weight rows
/// (2 or 4), in pairs: pair `p`'s sums of row `r` in `acc[p][r]`, each
/// started from its first product (`rows_avx`'s "First products": the same
/// output bits); each q8 row's lanes loaded once for every pair.
///
/// # Safety
/// As [`q8_rows4x2`]; block `b` whole in every row.
#[inline(always)]
unsafe fn rows4xk_block<const K: usize, const P: usize>(
    q: [&[f32]; 4],
    w: [&[f32]; K],
    block: usize,
    b: usize,
) -> [[__m512; 4]; P] {
    let wb: [*const f32; K] = std::array::from_fn(|k| w[k].as_ptr().add(b * block));
    let mut acc = [[_mm512_setzero_ps(); 4]; P];
    for c in (0..block).step_by(8) {
        let wv: [__m512; P] = std::array::from_fn(|p| pair(wb[2 * p].add(c), wb[2 * p + 1].add(c)));
        for r in 0..4 {
            let qv = both_halves(q[r].as_ptr().add(b * block + c));
            for p in 0..P {
                acc[p][r] = if c == 0 {
                    _mm512_mul_ps(qv, wv[p])
                } else {
                    _mm512_add_ps(acc[p][r], _mm512_mul_ps(qv, wv[p]))
                };
            }
        }
    }
    acc
}
