//! The f32 inner loops of [`super::rows`] written with AVX intrinsics, for
//! x86_64 CPUs that have AVX (checked at run time by the caller).
//!
//! Each is the portable loop's arithmetic in the portable loop's order:
//! eight lanes, one `mul` then one `add` per element (no FMA, which would
//! round once instead of twice), and each row's lanes summed as
//! `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`: the upper half added
//! to the lower, then two horizontal adds, which for four rows at once give
//! the four sums in one register. Only NaN payloads could differ (a
//! horizontal add takes its operands in the other order).
//!
//! **First products.** The q8 loops start each block's lanes from their
//! first product `p` rather than from `0 + p`. The two differ only when `p`
//! is -0, and then at most in the sign of a zero block sum `s`; `s` reaches
//! the output only through `total + d * s` (and the min terms after it),
//! with `total` starting at +0, and a round-to-nearest sum is -0 only when
//! both addends are, so `total` is never -0 and adding ±0 to it gives the
//! same bits. The float dots keep their one `0 + p` per row (their sum is
//! the output itself).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The four rows' sums of four 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn reduce4(acc: [__m256; 4]) -> __m128 {
    // No closure here: a closure would not carry this function's features.
    let u0 = _mm_add_ps(
        _mm256_castps256_ps128(acc[0]),
        _mm256_extractf128_ps(acc[0], 1),
    );
    let u1 = _mm_add_ps(
        _mm256_castps256_ps128(acc[1]),
        _mm256_extractf128_ps(acc[1], 1),
    );
    let u2 = _mm_add_ps(
        _mm256_castps256_ps128(acc[2]),
        _mm256_extractf128_ps(acc[2], 1),
    );
    let u3 = _mm_add_ps(
        _mm256_castps256_ps128(acc[3]),
        _mm256_extractf128_ps(acc[3], 1),
    );
    _mm_hadd_ps(_mm_hadd_ps(u0, u1), _mm_hadd_ps(u2, u3))
}

/// The sums of two sets of four 8-lane accumulators as one register,
/// `a`'s four rows in the low half and `b`'s in the high: per row exactly
/// [`reduce4`]'s additions, with half the shuffles of two [`reduce4`]s.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn reduce8(a: [__m256; 4], b: [__m256; 4]) -> __m256 {
    let u0 = fold_halves(a[0], b[0]);
    let u1 = fold_halves(a[1], b[1]);
    let u2 = fold_halves(a[2], b[2]);
    let u3 = fold_halves(a[3], b[3]);
    _mm256_hadd_ps(_mm256_hadd_ps(u0, u1), _mm256_hadd_ps(u2, u3))
}

/// `[a.lo + a.hi | b.lo + b.hi]` (128-bit halves): [`reduce4`]'s first step
/// for two accumulators at once.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn fold_halves(a: __m256, b: __m256) -> __m256 {
    _mm256_add_ps(
        _mm256_permute2f128_ps(a, b, 0x20),
        _mm256_permute2f128_ps(a, b, 0x31),
    )
}

/// `total + [d4 | d4] * sums`: each lane's block term, `mul` then `add`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn add_scaled(total: __m256, d: [&[f32]; 4], b: usize, sums: __m256) -> __m256 {
    let d4 = _mm_setr_ps(d[0][b], d[1][b], d[2][b], d[3][b]);
    _mm256_add_ps(total, _mm256_mul_ps(_mm256_set_m128(d4, d4), sums))
}

/// The two halves of `v` as two rows of four.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(super) unsafe fn split(v: __m256) -> [[f32; 4]; 2] {
    let mut out = [[0f32; 4]; 2];
    _mm_storeu_ps(out[0].as_mut_ptr(), _mm256_castps256_ps128(v));
    _mm_storeu_ps(out[1].as_mut_ptr(), _mm256_extractf128_ps(v, 1));
    out
}

/// Q4_1's min term (see [`super::matmul`]) added to four activation rows'
/// sums against two weight rows: `acc[t][r] += m[t][b] * e[r][b]` for each
/// block `b` in order, `mul` then `add`, as `rows::add_min_term` does one
/// output at a time.
///
/// # Safety
/// The CPU must support AVX; `m[0]` and `m[1]` as long as each `e[r]` or shorter.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn min_terms4x2(acc: [[f32; 4]; 2], m: [&[f32]; 2], e: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let mut t = _mm256_set_m128(_mm_loadu_ps(acc[1].as_ptr()), _mm_loadu_ps(acc[0].as_ptr()));
    for (b, (&m0, &m1)) in m[0].iter().zip(m[1]).enumerate() {
        let e4 = _mm_setr_ps(e[0][b], e[1][b], e[2][b], e[3][b]);
        let mv = _mm256_set_m128(_mm_set1_ps(m1), _mm_set1_ps(m0));
        t = _mm256_add_ps(t, _mm256_mul_ps(mv, _mm256_set_m128(e4, e4)));
    }
    split(t)
}

/// Q4_1's min term added to one activation row's sums against four weight
/// rows: `acc[j] += m[j][b] * e[b]` for each block `b` in order.
///
/// # Safety
/// The CPU must support AVX; each `m[j]` at least as long as `e`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn min_terms_w4(acc: [f32; 4], m: [&[f32]; 4], e: &[f32]) -> [f32; 4] {
    let mut t = _mm_loadu_ps(acc.as_ptr());
    for (b, &eb) in e.iter().enumerate() {
        let m4 = _mm_setr_ps(m[0][b], m[1][b], m[2][b], m[3][b]);
        t = _mm_add_ps(t, _mm_mul_ps(m4, _mm_set1_ps(eb)));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), t);
    out
}

/// `[dot(a[r], w); 4]` (see [`super::rows::dot4`]); lengths a multiple of 8.
///
/// # Safety
/// The CPU must support AVX; every slice at least `w.len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn dot4(a: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for c in (0..w.len()).step_by(8) {
        let wv = _mm256_loadu_ps(w.as_ptr().add(c));
        for (acc_r, a_r) in acc.iter_mut().zip(a) {
            let av = _mm256_loadu_ps(a_r.as_ptr().add(c));
            *acc_r = _mm256_add_ps(*acc_r, _mm256_mul_ps(av, wv));
        }
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), reduce4(acc));
    out
}

/// [`dot4`] against two weight rows at once: eight independent sums (four
/// activation rows times two weight rows), each in [`dot4`]'s order, so
/// eight add chains are in flight instead of four and each activation
/// vector loaded serves two products. Same bits as two [`dot4`] calls.
///
/// # Safety
/// As [`dot4`], with both weight rows the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn dot4x2(a: [&[f32]; 4], w: [&[f32]; 2]) -> [[f32; 4]; 2] {
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    for c in (0..w[0].len()).step_by(8) {
        let w0 = _mm256_loadu_ps(w[0].as_ptr().add(c));
        let w1 = _mm256_loadu_ps(w[1].as_ptr().add(c));
        for r in 0..4 {
            let av = _mm256_loadu_ps(a[r].as_ptr().add(c));
            acc0[r] = _mm256_add_ps(acc0[r], _mm256_mul_ps(av, w0));
            acc1[r] = _mm256_add_ps(acc1[r], _mm256_mul_ps(av, w1));
        }
    }
    split(reduce8(acc0, acc1))
}

/// [`q8_rows4`] against two weight rows at once, as [`dot4x2`] is to
/// [`dot4`]: the same bits as two [`q8_rows4`] calls.
///
/// # Safety
/// As [`q8_rows4`], with both weight rows the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn q8_rows4x2(
    q: [&[f32]; 4],
    d: [&[f32]; 4],
    w: [&[f32]; 2],
    block: usize,
) -> [[f32; 4]; 2] {
    // Both weight rows' four sums in one register: [w0's | w1's].
    let mut total = _mm256_setzero_ps();
    let blocks = w[0].chunks_exact(block).zip(w[1].chunks_exact(block));
    for (b, (w0b, w1b)) in blocks.enumerate() {
        // Each block sum starts from its first product (see "First products" above).
        let (w0, w1) = (_mm256_loadu_ps(w0b.as_ptr()), _mm256_loadu_ps(w1b.as_ptr()));
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let qv = _mm256_loadu_ps(q[r].as_ptr().add(b * block));
            acc0[r] = _mm256_mul_ps(qv, w0);
            acc1[r] = _mm256_mul_ps(qv, w1);
        }
        for c in (8..block).step_by(8) {
            let w0 = _mm256_loadu_ps(w0b.as_ptr().add(c));
            let w1 = _mm256_loadu_ps(w1b.as_ptr().add(c));
            for r in 0..4 {
                let qv = _mm256_loadu_ps(q[r].as_ptr().add(b * block + c));
                acc0[r] = _mm256_add_ps(acc0[r], _mm256_mul_ps(qv, w0));
                acc1[r] = _mm256_add_ps(acc1[r], _mm256_mul_ps(qv, w1));
            }
        }
        total = add_scaled(total, d, b, reduce8(acc0, acc1));
    }
    split(total)
}

/// `[dot(a, w[j]); 4]` (see [`super::rows::dot_w4`]); lengths a multiple of 8.
///
/// # Safety
/// As [`dot4`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn dot_w4(a: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for c in (0..a.len()).step_by(8) {
        let av = _mm256_loadu_ps(a.as_ptr().add(c));
        for (acc_j, w_j) in acc.iter_mut().zip(w) {
            let wv = _mm256_loadu_ps(w_j.as_ptr().add(c));
            *acc_j = _mm256_add_ps(*acc_j, _mm256_mul_ps(av, wv));
        }
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), reduce4(acc));
    out
}

/// Four quantized activation rows against one weight row:
/// `acc_r = sum_b d_r[b] * dot(q_r[b], w[b])`, blocks in order, each block
/// dot as [`dot4`]; `block` a multiple of 8.
///
/// # Safety
/// As [`dot4`]; `d[r]` holds `w.len() / block` scales.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn q8_rows4(q: [&[f32]; 4], d: [&[f32]; 4], w: &[f32], block: usize) -> [f32; 4] {
    let mut total = _mm_setzero_ps();
    for (b, w_b) in w.chunks_exact(block).enumerate() {
        let mut acc = [_mm256_setzero_ps(); 4];
        for c in (b * block..(b + 1) * block).step_by(8) {
            let wv = _mm256_loadu_ps(w_b.as_ptr().add(c - b * block));
            for (acc_r, q_r) in acc.iter_mut().zip(q) {
                let qv = _mm256_loadu_ps(q_r.as_ptr().add(c));
                *acc_r = _mm256_add_ps(*acc_r, _mm256_mul_ps(qv, wv));
            }
        }
        let dv = _mm_setr_ps(d[0][b], d[1][b], d[2][b], d[3][b]);
        total = _mm_add_ps(total, _mm_mul_ps(dv, reduce4(acc)));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), total);
    out
}

/// One quantized activation row against four weight rows:
/// `acc_j = sum_b d[b] * dot(q[b], w[j][b])`, as [`q8_rows4`].
///
/// # Safety
/// As [`q8_rows4`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn q8_w4(q: &[f32], d: &[f32], w: [&[f32]; 4], block: usize) -> [f32; 4] {
    let mut total = _mm_setzero_ps();
    for (b, &db) in d.iter().enumerate().take(q.len() / block) {
        let mut acc = [_mm256_setzero_ps(); 4];
        for c in (b * block..(b + 1) * block).step_by(8) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (acc_j, w_j) in acc.iter_mut().zip(w) {
                let wv = _mm256_loadu_ps(w_j.as_ptr().add(c));
                *acc_j = _mm256_add_ps(*acc_j, _mm256_mul_ps(qv, wv));
            }
        }
        total = _mm_add_ps(total, _mm_mul_ps(_mm_set1_ps(db), reduce4(acc)));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), total);
    out
}

/// The 32 weights of one Q4_0, Q4_1 or Q8_0 block (`ty`'s id, a constant so
/// the match folds away) as four vectors, in the expressions of
/// [`super::qmatrix::dequantize_blocks`]: the integer to f32 conversion is
/// exact; then one `mul` and, for Q4_1, one `add`, fused into one FMA
/// because the product is exact (the same bits; the dot products that use
/// these weights never fuse). The f16 scales convert with F16C (exact, as
/// `half`'s conversion).
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; `b` points at one whole block.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn block_weights<const TY: u32>(b: *const u8) -> [__m256; 4] {
    let mask = _mm_set1_epi8(0x0F);
    // The block's f16 scale (and, for Q4_1, its minimum) in lanes 0 (and 1).
    let h = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
    let d = _mm256_broadcastss_ps(h);
    // Four groups of eight bytes: the low halves of `lo` and `hi`, then the high.
    let (lo, hi) = if TY == Q8_0 {
        (
            _mm_loadu_si128(b.add(2) as *const __m128i),
            _mm_loadu_si128(b.add(18) as *const __m128i),
        )
    } else {
        let v = _mm_loadu_si128(b.add(if TY == Q4_1 { 4 } else { 2 }) as *const __m128i);
        (
            _mm_and_si128(v, mask),
            _mm_and_si128(_mm_srli_epi16(v, 4), mask),
        )
    };
    let quads = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
    let mut w = [_mm256_setzero_ps(); 4];
    for (wk, q) in w.iter_mut().zip(quads) {
        *wk = if TY == Q4_1 {
            let m = _mm256_broadcastss_ps(_mm_permute_ps(h, 0b01_01_01_01));
            let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
            // `f * d` is exact (a 4-bit integer times an f16's 11-bit
            // significand fits f32's 24), so rounding once after the add
            // (FMA) is rounding `f * d + m` as the `mul` then `add` does.
            _mm256_fmadd_ps(f, d, m)
        } else if TY == Q4_0 {
            let i = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q), _mm256_set1_epi32(8));
            _mm256_mul_ps(_mm256_cvtepi32_ps(i), d)
        } else {
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d)
        };
    }
    w
}

/// How many weight rows ahead [`prefetch_ahead`] reaches: two groups
/// of four (on the H200 host's Xeon, 8 and 4 rows ahead were within each
/// other's noise, both a third faster than no prefetch; docs/PERFORMANCE.md).
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 8;

/// Asks for the bytes at `off` of the weight row [`PREFETCH_ROWS`] rows
/// after `w_j` (the same block of a later group of four, where the rows lie
/// one after another as a [`super::qmatrix::QMatrix`]'s do) to be on their
/// way into the cache: a decode reads each weight once, so its loops
/// otherwise wait on memory at every new group. A hint only: it reads
/// nothing, cannot fault, and an address past the matrix is harmless.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_ahead(w_j: &[u8], off: usize) {
    let p = w_j.as_ptr().wrapping_add(PREFETCH_ROWS * w_j.len() + off);
    // SAFETY: a prefetch neither reads into the program nor faults, and
    // `wrapping_add` forms the address without asserting it in bounds.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
}

/// Four vectors of eight from `p`.
///
/// # Safety
/// The CPU must support AVX; 32 floats readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn load32(p: *const f32) -> [__m256; 4] {
    [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ]
}

/// `block_weights`' constant for Q4_0 (its GGML type id).
#[cfg(target_arch = "x86_64")]
pub(super) const Q4_0: u32 = 2;
/// The constant for Q4_1.
#[cfg(target_arch = "x86_64")]
pub(super) const Q4_1: u32 = 3;
/// The constant for Q8_0.
#[cfg(target_arch = "x86_64")]
pub(super) const Q8_0: u32 = 8;

/// Whether this CPU runs the block loops here ([`dequantize`], the fused
/// dots): AVX2, F16C and FMA.
pub fn block_loops() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`dequantize`] and the fused dots take `ty`.
pub fn fused_type(ty: model::quant::GgmlType) -> bool {
    use model::quant::GgmlType;
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Calls `$f::<TY>($args)` for `$ty`'s constant (Q4_0, Q4_1 or Q8_0).
macro_rules! by_type {
    ($ty:expr, $f:ident($($arg:expr),*)) => {
        match $ty {
            model::quant::GgmlType::Q4_1 => $f::<Q4_1>($($arg),*),
            model::quant::GgmlType::Q4_0 => $f::<Q4_0>($($arg),*),
            model::quant::GgmlType::Q8_0 => $f::<Q8_0>($($arg),*),
            t => unreachable!("{t} has no fused kernel; the caller checks `fused_type`"),
        }
    };
}
pub(super) use by_type;

/// Dequantizes whole Q4_0, Q4_1 or Q8_0 blocks as
/// [`super::qmatrix::dequantize_blocks`] does, eight weights at a time
/// ([`block_weights`]). Other formats are left to the caller.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; `data` whole blocks of `ty` and `out`
/// as long as their weights.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn dequantize(ty: model::quant::GgmlType, data: &[u8], out: &mut [f32]) {
    by_type!(ty, dequantize_ty(ty.type_size(), data, out))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn dequantize_ty<const TY: u32>(ts: usize, data: &[u8], out: &mut [f32]) {
    for (b, y) in data.chunks_exact(ts).zip(out.chunks_exact_mut(32)) {
        let w = block_weights::<TY>(b.as_ptr());
        for (k, wk) in w.into_iter().enumerate() {
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), wk);
        }
    }
}

/// [`dot_w4`] with the four weight rows read from their Q4_0, Q4_1 or Q8_0
/// blocks and dequantized in registers ([`block_weights`]), never stored:
/// the same products and sums in the same order (each row's chunks of eight
/// in ascending order), so the same bits as dequantizing first.
///
/// One group's call, the reference the tests hold the span loops (and
/// the two register widths) to; the forward calls the span loops.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; `a.len()` a multiple of 32 and each
/// `w[j]` that many weights of whole blocks of `ty`.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn dot_w4_blocks(ty: model::quant::GgmlType, a: &[f32], w: [&[u8]; 4]) -> [f32; 4] {
    by_type!(ty, dot_w4_ty(ty.type_size(), a, w))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn dot_w4_ty<const TY: u32>(ts: usize, a: &[f32], w: [&[u8]; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for blk in 0..a.len() / 32 {
        let av = load32(a.as_ptr().add(32 * blk));
        for (acc_j, w_j) in acc.iter_mut().zip(w) {
            prefetch_ahead(w_j, ts * blk);
            let wv = block_weights::<TY>(w_j.as_ptr().add(ts * blk));
            for (x, y) in av.iter().zip(wv) {
                *acc_j = _mm256_add_ps(*acc_j, _mm256_mul_ps(*x, y));
            }
        }
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), reduce4(acc));
    out
}

/// [`q8_w4`] (32-blocks) with the four weight rows dequantized in registers
/// from their Q4_0, Q4_1 or Q8_0 blocks: the same bits.
///
/// One group's call, the reference the tests hold the span loops (and
/// the two register widths) to; the forward calls the span loops.
///
/// # Safety
/// As `dot_w4_blocks`, with `q` for `a` and `d` holding `q.len() / 32` scales.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn q8_w4_blocks(
    ty: model::quant::GgmlType,
    q: &[f32],
    d: &[f32],
    w: [&[u8]; 4],
) -> [f32; 4] {
    by_type!(ty, q8_w4_ty(ty.type_size(), q, d, w))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn q8_w4_ty<const TY: u32>(
    ts: usize,
    q: &[f32],
    d: &[f32],
    w: [&[u8]; 4],
) -> [f32; 4] {
    let nb = (q.len() / 32).min(d.len());
    let mut total = _mm_setzero_ps();
    // Two blocks' sums reduced in one register (`reduce8`: per row the
    // additions of `reduce4`), then added to the total block by block.
    let mut blk = 0;
    while blk + 2 <= nb {
        let s = reduce8(
            block_sums_w4::<TY>(ts, q, w, blk),
            block_sums_w4::<TY>(ts, q, w, blk + 1),
        );
        let d2 = _mm256_set_m128(_mm_set1_ps(d[blk + 1]), _mm_set1_ps(d[blk]));
        let p = _mm256_mul_ps(d2, s);
        total = _mm_add_ps(total, _mm256_castps256_ps128(p));
        total = _mm_add_ps(total, _mm256_extractf128_ps(p, 1));
        blk += 2;
    }
    if blk < nb {
        let s = reduce4(block_sums_w4::<TY>(ts, q, w, blk));
        total = _mm_add_ps(total, _mm_mul_ps(_mm_set1_ps(d[blk]), s));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), total);
    out
}

/// The eight-lane sums of block `blk` of `q` against the four weight rows,
/// each started from its first product (see the module's "First products").
///
/// # Safety
/// As `q8_w4_blocks`; `blk` a whole block of each.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn block_sums_w4<const TY: u32>(
    ts: usize,
    q: &[f32],
    w: [&[u8]; 4],
    blk: usize,
) -> [__m256; 4] {
    let qv = load32(q.as_ptr().add(32 * blk));
    let mut acc = [_mm256_setzero_ps(); 4];
    for (acc_j, w_j) in acc.iter_mut().zip(w) {
        prefetch_ahead(w_j, ts * blk);
        let wv = block_weights::<TY>(w_j.as_ptr().add(ts * blk));
        let mut s = _mm256_mul_ps(qv[0], wv[0]);
        for k in 1..4 {
            s = _mm256_add_ps(s, _mm256_mul_ps(qv[k], wv[k]));
        }
        *acc_j = s;
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod quant;
#[cfg(target_arch = "x86_64")]
pub use quant::quant_block32;
#[cfg(target_arch = "x86_64")]
mod spans;
#[cfg(target_arch = "x86_64")]
pub(super) use spans::groups;
#[cfg(target_arch = "x86_64")]
pub use spans::{dot_rows_blocks, min_terms_rows, q8_rows_blocks};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
