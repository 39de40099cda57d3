//! [`Dots`]: the vector fast paths of the matmul's inner loops, and which
//! CPU runs which (`rows_avx`, `rows_avx512`).

use model::quant::GgmlType;

/// Vector fast paths of the inner loops, for the element types that have
/// them (f32 on x86_64 with AVX: `rows_avx`); `None` sends the
/// caller to the portable loop, which gives the same bits.
pub trait Dots: Sized + Copy {
    /// Four rows of `a` dotted with `w` at once, or `None` for the portable loop.
    fn dot4_fast(_a: [&[Self]; 4], _w: &[f32]) -> Option<[Self; 4]> {
        None
    }
    /// Four rows of `a` dotted with two weight rows at once (eight sums, each
    /// [`dot4`](super::dot4)'s), or `None`.
    fn dot4x2_fast(_a: [&[Self]; 4], _w: [&[f32]; 2]) -> Option<[[Self; 4]; 2]> {
        None
    }
    /// Four rows of `a` dotted with four weight rows at once (sixteen sums,
    /// each [`dot4`](super::dot4)'s), or `None`.
    fn dot4x4_fast(_a: [&[Self]; 4], _w: [&[f32]; 4]) -> Option<[[Self; 4]; 4]> {
        None
    }
    /// Four q8 rows dotted with four weight rows in blocks of `b` (each sum
    /// [`Dots::q8_rows4x2_fast`]'s), or `None`.
    fn q8_rows4x4_fast(
        _q: [&[Self]; 4],
        _d: [&[Self]; 4],
        _w: [&[f32]; 4],
        _b: usize,
    ) -> Option<[[Self; 4]; 4]> {
        None
    }
    /// Four q8 rows dotted with two weight rows in blocks of `b`, or `None`.
    fn q8_rows4x2_fast(
        _q: [&[Self]; 4],
        _d: [&[Self]; 4],
        _w: [&[f32]; 2],
        _b: usize,
    ) -> Option<[[Self; 4]; 2]> {
        None
    }
    /// One row `a` dotted with four weight rows at once, or `None`.
    fn dot_w4_fast(_a: &[Self], _w: [&[f32]; 4]) -> Option<[Self; 4]> {
        None
    }
    /// Four q8 rows (values `q`, block scales `d`) dotted with `w` in blocks of
    /// `b`, or `None`.
    fn q8_rows4_fast(
        _q: [&[Self]; 4],
        _d: [&[Self]; 4],
        _w: &[f32],
        _b: usize,
    ) -> Option<[Self; 4]> {
        None
    }
    /// One q8 row dotted with four weight rows in blocks of `b`, or `None`.
    fn q8_w4_fast(_q: &[Self], _d: &[Self], _w: [&[f32]; 4], _b: usize) -> Option<[Self; 4]> {
        None
    }
    /// Q4_1's min terms (per block `b` in order, `acc[t][r] += m[t][b] *
    /// e[r][b]`) of four rows' sums against two weight rows, or `None`.
    fn min_terms4x2_fast(
        _acc: [[Self; 4]; 2],
        _m: [&[f32]; 2],
        _e: [&[Self]; 4],
    ) -> Option<[[Self; 4]; 2]> {
        None
    }
    /// Q4_1's min terms (`acc[j] += m[j][b] * e[b]`) of one row's sums
    /// against four weight rows, or `None`.
    fn min_terms_w4_fast(_acc: [Self; 4], _m: [&[f32]; 4], _e: &[Self]) -> Option<[Self; 4]> {
        None
    }
    /// Q4_1's min terms of `acc.len()` rows' sums (a multiple of four; row
    /// `j`'s minimums at `m[j * e.len()..]`): `acc[j] += m[j][b] * e[b]`
    /// for each block `b` in order; whether it ran (else nothing is changed).
    fn min_terms_rows_fast(_acc: &mut [Self], _m: &[f32], _e: &[Self]) -> bool {
        false
    }
    /// One row `a` dotted with `out.len()` (a multiple of four) weight rows
    /// of blocks of `ty` held back to back in `w`, dequantized in registers,
    /// four rows at a time, each sum [`dot_w4`](super::dot_w4)'s; whether
    /// it ran (else nothing is written).
    fn dot_rows_blocks_fast(_a: &[Self], _ty: GgmlType, _w: &[u8], _out: &mut [Self]) -> bool {
        false
    }
    /// The 32-block q8 dot of one row (values `q`, block scales `d`) against
    /// `out.len()` (a multiple of four) weight rows of blocks of `ty` held
    /// back to back in `w`; whether it ran (else nothing is written).
    fn q8_rows_blocks_fast(
        _q: &[Self],
        _d: &[Self],
        _ty: GgmlType,
        _w: &[u8],
        _out: &mut [Self],
    ) -> bool {
        false
    }
    /// The dot products of `q` with sixteen keys, key `j` at `k[j *
    /// stride..][..q.len()]`, each [`attention`](super::super::attention)'s
    /// one-key chain over the dimensions in order; `None` where there is no
    /// loop for it.
    fn key_dots16_fast(_q: &[Self], _k: &[Self], _stride: usize) -> Option<[Self; 16]> {
        None
    }
    /// One 32-block `b` quantized into `q` (32 long) as
    /// [`quant_row`](super::super::quant_row)'s loop does, returning the
    /// scale and the sum of the quantized values; `None`, having written
    /// nothing, where there is no loop for it or the loop's own handling of
    /// a NaN must decide.
    fn quant_block32_fast(_b: &[Self], _q: &mut [Self]) -> Option<(f32, i32)> {
        None
    }
}

impl Dots for f64 {}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx(len: usize) -> bool {
    len.is_multiple_of(8) && std::arch::is_x86_feature_detected!("avx")
}

/// `rows_avx512::$f(..)` where the 512-bit loops run ([`super::super::rows_avx512::enabled`]),
/// else `rows_avx::$f(..)`: the same bits either way.
#[cfg(target_arch = "x86_64")]
macro_rules! widest {
    ($f:ident($($arg:expr),*)) => {
        if super::super::rows_avx512::enabled() {
            super::super::rows_avx512::$f($($arg),*)
        } else {
            super::super::rows_avx::$f($($arg),*)
        }
    };
}

#[cfg(target_arch = "x86_64")]
impl Dots for f32 {
    #[inline(always)]
    fn dot4_fast(a: [&[f32]; 4], w: &[f32]) -> Option<[f32; 4]> {
        let ok = avx(w.len()) && a.iter().all(|r| r.len() >= w.len());
        // SAFETY: AVX checked by `avx`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx::dot4(a, w) })
    }
    #[inline(always)]
    fn dot4x2_fast(a: [&[f32]; 4], w: [&[f32]; 2]) -> Option<[[f32; 4]; 2]> {
        let len = w[0].len();
        let ok = avx(len) && w[1].len() == len && a.iter().all(|r| r.len() >= len);
        // SAFETY: AVX checked by `avx` (AVX-512F by `enabled`), lengths just above.
        ok.then(|| unsafe { widest!(dot4x2(a, w)) })
    }
    #[inline(always)]
    fn dot4x4_fast(a: [&[f32]; 4], w: [&[f32]; 4]) -> Option<[[f32; 4]; 4]> {
        let len = w[0].len();
        let ok = super::super::rows_avx512::enabled()
            && avx(len)
            && w.iter().all(|r| r.len() == len)
            && a.iter().all(|r| r.len() >= len);
        // SAFETY: AVX-512F checked by `enabled`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx512::dot4x4(a, w) })
    }
    #[inline(always)]
    fn q8_rows4x4_fast(
        q: [&[f32]; 4],
        d: [&[f32]; 4],
        w: [&[f32]; 4],
        b: usize,
    ) -> Option<[[f32; 4]; 4]> {
        let len = w[0].len();
        let ok = super::super::rows_avx512::enabled()
            && avx(b)
            && len.is_multiple_of(b)
            && w.iter().all(|r| r.len() == len)
            && q.iter().all(|r| r.len() >= len)
            && d.iter().all(|r| r.len() >= len / b);
        // SAFETY: AVX-512F checked by `enabled`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx512::q8_rows4x4(q, d, w, b) })
    }
    #[inline(always)]
    fn q8_rows4x2_fast(
        q: [&[f32]; 4],
        d: [&[f32]; 4],
        w: [&[f32]; 2],
        b: usize,
    ) -> Option<[[f32; 4]; 2]> {
        let len = w[0].len();
        let ok = avx(b)
            && len.is_multiple_of(b)
            && w[1].len() == len
            && q.iter().all(|r| r.len() >= len)
            && d.iter().all(|r| r.len() >= len / b);
        // SAFETY: as above.
        ok.then(|| unsafe { widest!(q8_rows4x2(q, d, w, b)) })
    }
    #[inline(always)]
    fn dot_w4_fast(a: &[f32], w: [&[f32]; 4]) -> Option<[f32; 4]> {
        let ok = avx(a.len()) && w.iter().all(|r| r.len() >= a.len());
        // SAFETY: as above.
        ok.then(|| unsafe { super::super::rows_avx::dot_w4(a, w) })
    }
    #[inline(always)]
    fn q8_rows4_fast(q: [&[f32]; 4], d: [&[f32]; 4], w: &[f32], b: usize) -> Option<[f32; 4]> {
        let ok = avx(b)
            && w.len().is_multiple_of(b)
            && q.iter().all(|r| r.len() >= w.len())
            && d.iter().all(|r| r.len() >= w.len() / b);
        // SAFETY: as above.
        ok.then(|| unsafe { super::super::rows_avx::q8_rows4(q, d, w, b) })
    }
    #[inline(always)]
    fn q8_w4_fast(q: &[f32], d: &[f32], w: [&[f32]; 4], b: usize) -> Option<[f32; 4]> {
        let ok = avx(b)
            && q.len().is_multiple_of(b)
            && d.len() >= q.len() / b
            && w.iter().all(|r| r.len() >= q.len());
        // SAFETY: as above.
        ok.then(|| unsafe { super::super::rows_avx::q8_w4(q, d, w, b) })
    }
    #[inline(always)]
    fn min_terms4x2_fast(
        acc: [[f32; 4]; 2],
        m: [&[f32]; 2],
        e: [&[f32]; 4],
    ) -> Option<[[f32; 4]; 2]> {
        let nb = m[0].len();
        let ok = avx(8) && m[1].len() == nb && e.iter().all(|r| r.len() >= nb);
        // SAFETY: AVX checked by `avx`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx::min_terms4x2(acc, m, e) })
    }
    #[inline(always)]
    fn min_terms_w4_fast(acc: [f32; 4], m: [&[f32]; 4], e: &[f32]) -> Option<[f32; 4]> {
        let ok = avx(8) && m.iter().all(|r| r.len() >= e.len());
        // SAFETY: AVX checked by `avx`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx::min_terms_w4(acc, m, e) })
    }
    #[inline(always)]
    fn min_terms_rows_fast(acc: &mut [f32], m: &[f32], e: &[f32]) -> bool {
        let ok = avx(8) && acc.len().is_multiple_of(4) && m.len() >= acc.len() * e.len();
        if ok {
            // SAFETY: AVX checked by `avx` (AVX-512F by `enabled`), lengths
            // just above.
            unsafe { widest!(min_terms_rows(acc, m, e)) };
        }
        ok
    }
    #[inline(always)]
    fn quant_block32_fast(b: &[f32], q: &mut [f32]) -> Option<(f32, i32)> {
        let ok = avx(8) && b.len() == 32 && q.len() == 32;
        // SAFETY: AVX checked by `avx`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx::quant_block32(b, q) })
            .flatten()
    }
    #[inline(always)]
    fn key_dots16_fast(q: &[f32], k: &[f32], stride: usize) -> Option<[f32; 16]> {
        let ok = super::super::rows_avx512::enabled()
            && q.len().is_multiple_of(16)
            && k.len() >= 15 * stride + q.len();
        // SAFETY: AVX-512F checked by `enabled`, lengths just above.
        ok.then(|| unsafe { super::super::rows_avx512::key_dots16(q, k.as_ptr(), stride) })
    }
    #[inline(always)]
    fn dot_rows_blocks_fast(a: &[f32], ty: GgmlType, w: &[u8], out: &mut [f32]) -> bool {
        let ok = fused_rows(ty, a.len(), w, out.len());
        if ok {
            // SAFETY: AVX2, F16C and FMA checked by `fused_rows`, with the
            // lengths; AVX-512F and BW by `enabled`.
            unsafe { widest!(dot_rows_blocks(ty, a, w, out)) };
        }
        ok
    }
    #[inline(always)]
    fn q8_rows_blocks_fast(q: &[f32], d: &[f32], ty: GgmlType, w: &[u8], out: &mut [f32]) -> bool {
        let ok = fused_rows(ty, q.len(), w, out.len()) && d.len() >= q.len() / 32;
        if ok {
            // SAFETY: as above, and a scale per block.
            unsafe { widest!(q8_rows_blocks(ty, q, d, w, out)) };
        }
        ok
    }
}

/// Whether the fused block loops take `rows` rows (a multiple of four) of
/// `len` weights of `ty`, back to back in `w`, on this CPU.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fused_rows(ty: GgmlType, len: usize, w: &[u8], rows: usize) -> bool {
    super::super::rows_avx::fused_type(ty)
        && len.is_multiple_of(32)
        && rows.is_multiple_of(4)
        && w.len() == rows * ty.row_bytes(len)
        && super::super::rows_avx::block_loops()
}

#[cfg(not(target_arch = "x86_64"))]
impl Dots for f32 {}
