//! The fused block loops over a span of rows: one call for all the groups
//! of four weight rows of a task (a decode's matmul), where a call per
//! group had cost about a tenth of a decode step, and Q4_1's min terms of
//! the span. Their 512-bit twins are in `rows_avx512`, as for the loops
//! they call.

use super::{dot_w4_ty, q8_w4_ty, Q4_0, Q4_1, Q8_0};
use std::arch::x86_64::*;

/// `dot_w4_blocks` over `out.len() / 4` groups of four rows in one call:
/// `w` holds `out.len()` rows of `a.len()` weights back to back (a
/// [`super::qmatrix::QMatrix`]'s rows), and `out[j]` gets row `j`'s sum.
/// The same bits as a call per group, without a call's overhead per group
/// (a 576-long group is about 500 cycles of work).
///
/// # Safety
/// As `dot_w4_blocks`; `out.len()` a multiple of four and `w` that many
/// rows of `a.len()` weights in whole blocks of `ty`.
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn dot_rows_blocks(ty: model::quant::GgmlType, a: &[f32], w: &[u8], out: &mut [f32]) {
    by_type!(ty, dot_rows_ty(ty.type_size(), a, w, out))
}

#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn dot_rows_ty<const TY: u32>(ts: usize, a: &[f32], w: &[u8], out: &mut [f32]) {
    for (o, rows) in out.chunks_exact_mut(4).zip(groups(w, ts * (a.len() / 32))) {
        o.copy_from_slice(&dot_w4_ty::<TY>(ts, a, rows));
    }
}

/// `w` (rows of `row` bytes back to back) as groups of four rows.
#[inline(always)]
pub(crate) fn groups(w: &[u8], row: usize) -> impl Iterator<Item = [&[u8]; 4]> {
    w.chunks_exact(4 * row).map(move |g| {
        let (r01, r23) = g.split_at(2 * row);
        let (r0, r1) = r01.split_at(row);
        let (r2, r3) = r23.split_at(row);
        [r0, r1, r2, r3]
    })
}

/// `q8_w4_blocks` over `out.len() / 4` groups of four rows in one call,
/// as [`dot_rows_blocks`] is to `dot_w4_blocks`.
///
/// # Safety
/// As `q8_w4_blocks` and [`dot_rows_blocks`].
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn q8_rows_blocks(
    ty: model::quant::GgmlType,
    q: &[f32],
    d: &[f32],
    w: &[u8],
    out: &mut [f32],
) {
    by_type!(ty, q8_rows_ty(ty.type_size(), q, d, w, out))
}

#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn q8_rows_ty<const TY: u32>(ts: usize, q: &[f32], d: &[f32], w: &[u8], out: &mut [f32]) {
    for (o, rows) in out.chunks_exact_mut(4).zip(groups(w, ts * (q.len() / 32))) {
        o.copy_from_slice(&q8_w4_ty::<TY>(ts, q, d, rows));
    }
}

/// Q4_1's min terms of `out.len()` rows' sums (a multiple of four), row
/// `j`'s minimums at `m[j * nb..]` (`nb = e.len()`): `out[j] += m[j][b] *
/// e[b]` for each block `b` in order, as [`super::min_terms_w4`] adds them.
/// Four rows a register; eight blocks' products are formed per row (the
/// same products) and transposed into place, where gathering four rows'
/// minimums block by block cost as much as the sums it fed.
///
/// # Safety
/// The CPU must support AVX; `out.len()` a multiple of four and `m` at least
/// `out.len() * e.len()` long.
#[target_feature(enable = "avx")]
pub unsafe fn min_terms_rows(out: &mut [f32], m: &[f32], e: &[f32]) {
    let nb = e.len();
    for (g, o) in out.chunks_exact_mut(4).enumerate() {
        let rows: [*const f32; 4] = std::array::from_fn(|j| m.as_ptr().add((4 * g + j) * nb));
        let mut t = _mm_loadu_ps(o.as_ptr());
        let mut b = 0;
        while b + 8 <= nb {
            let ev = _mm256_loadu_ps(e.as_ptr().add(b));
            let [p0, p1, p2, p3] = rows.map(|r| _mm256_mul_ps(_mm256_loadu_ps(r.add(b)), ev));
            // Per 128-bit half: rows 0 and 1 (2 and 3) of blocks b + k, b + k + 1.
            let (l01, h01) = (_mm256_unpacklo_ps(p0, p1), _mm256_unpackhi_ps(p0, p1));
            let (l23, h23) = (_mm256_unpacklo_ps(p2, p3), _mm256_unpackhi_ps(p2, p3));
            let pd = _mm256_castps_pd;
            // Four rows of block b + k in the low half, of b + k + 4 in the high.
            let by_block = [
                _mm256_castpd_ps(_mm256_unpacklo_pd(pd(l01), pd(l23))),
                _mm256_castpd_ps(_mm256_unpackhi_pd(pd(l01), pd(l23))),
                _mm256_castpd_ps(_mm256_unpacklo_pd(pd(h01), pd(h23))),
                _mm256_castpd_ps(_mm256_unpackhi_pd(pd(h01), pd(h23))),
            ];
            for v in by_block {
                t = _mm_add_ps(t, _mm256_castps256_ps128(v));
            }
            for v in by_block {
                t = _mm_add_ps(t, _mm256_extractf128_ps::<1>(v));
            }
            b += 8;
        }
        for (b, &eb) in e.iter().enumerate().skip(b) {
            let m4 = _mm_setr_ps(
                *rows[0].add(b),
                *rows[1].add(b),
                *rows[2].add(b),
                *rows[3].add(b),
            );
            t = _mm_add_ps(t, _mm_mul_ps(m4, _mm_set1_ps(eb)));
        }
        _mm_storeu_ps(o.as_mut_ptr(), t);
    }
}
