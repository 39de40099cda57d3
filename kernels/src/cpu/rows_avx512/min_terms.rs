//! Q4_1's min terms of a decode's span on 512-bit registers: sixteen rows'
//! running sums in one register, each block's sixteen products added at
//! once, the same products and the same additions in block order as
//! `rows_avx::min_terms_rows` (the same bits).

use std::arch::x86_64::*;

/// `rows_avx::min_terms_rows` sixteen rows a register: for each row `j`,
/// `out[j] += m[j][b] * e[b]` for each block `b` in order (`m[j]` at
/// `m[j * e.len()..]`). Sixteen blocks' products are formed row by row (the
/// same products) and transposed so that a register holds one block's
/// sixteen rows; the blocks past the last sixteen are gathered. Rows past
/// the last sixteen go to the four-row loop.
///
/// # Safety
/// The CPU must support AVX-512F (and AVX); `out.len()` a multiple of four
/// and `m` at least `out.len() * e.len()` long.
#[target_feature(enable = "avx512f,avx")]
pub unsafe fn min_terms_rows(out: &mut [f32], m: &[f32], e: &[f32]) {
    let nb = e.len();
    let whole = out.len() / 16 * 16;
    let (tiles, rest) = out.split_at_mut(whole);
    if nb * 16 > i32::MAX as usize {
        // Offsets past the gather's 32-bit indices: the four-row loop.
        return super::super::rows_avx::min_terms_rows(out, m, e);
    }
    for (g, o) in tiles.chunks_exact_mut(16).enumerate() {
        let rows = m.as_ptr().add(16 * g * nb);
        let mut t = _mm512_loadu_ps(o.as_ptr());
        let mut b = 0;
        while b + 16 <= nb {
            let ev = _mm512_loadu_ps(e.as_ptr().add(b));
            let p: [__m512; 16] =
                std::array::from_fn(|j| _mm512_mul_ps(_mm512_loadu_ps(rows.add(j * nb + b)), ev));
            for v in transpose16(p) {
                t = _mm512_add_ps(t, v);
            }
            b += 16;
        }
        // The last blocks, each one gather of its sixteen rows' minimums.
        let idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(nb as i32),
        );
        for (b, &eb) in e.iter().enumerate().skip(b) {
            let mv = _mm512_i32gather_ps::<4>(idx, rows.add(b));
            t = _mm512_add_ps(t, _mm512_mul_ps(mv, _mm512_set1_ps(eb)));
        }
        _mm512_storeu_ps(o.as_mut_ptr(), t);
    }
    super::super::rows_avx::min_terms_rows(rest, &m[whole * nb..], e);
}

/// Sixteen rows of sixteen lanes as sixteen columns: lane `j` of result
/// `k` is lane `k` of `r[j]`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    // Per group of four rows, per 128-bit lane L: u[G][k] holds lane
    // 4L + k of the group's rows.
    let u: [[__m512; 4]; 4] = std::array::from_fn(|g| {
        let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
        let (t0, t1) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        let (t2, t3) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
        [
            ps(_mm512_unpacklo_pd(pd(t0), pd(t2))),
            ps(_mm512_unpackhi_pd(pd(t0), pd(t2))),
            ps(_mm512_unpacklo_pd(pd(t1), pd(t3))),
            ps(_mm512_unpackhi_pd(pd(t1), pd(t3))),
        ]
    });
    let mut out = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        // [G0.l0, G0.l2, G1.l0, G1.l2] and the odd lanes; the same of G2, G3.
        let a = _mm512_shuffle_f32x4::<0x88>(u[0][k], u[1][k]);
        let b = _mm512_shuffle_f32x4::<0xDD>(u[0][k], u[1][k]);
        let c = _mm512_shuffle_f32x4::<0x88>(u[2][k], u[3][k]);
        let d = _mm512_shuffle_f32x4::<0xDD>(u[2][k], u[3][k]);
        out[k] = _mm512_shuffle_f32x4::<0x88>(a, c);
        out[8 + k] = _mm512_shuffle_f32x4::<0xDD>(a, c);
        out[4 + k] = _mm512_shuffle_f32x4::<0x88>(b, d);
        out[12 + k] = _mm512_shuffle_f32x4::<0xDD>(b, d);
    }
    out
}
