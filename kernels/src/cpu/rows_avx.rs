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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The four rows' sums of four 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn reduce4(acc: [__m256; 4]) -> __m128 {
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

/// `[dot(a[r], w); 4]` (see [`super::matmul::dot4`]); lengths a multiple of 8.
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

/// Dequantizes whole Q4_0, Q4_1 or Q8_0 blocks as
/// [`super::qmatrix::dequantize_blocks`] does (the integer to f32
/// conversion is exact; then one `mul` and, for Q4_1, one `add`), eight
/// weights at a time. Other formats are left to the caller.
///
/// The f16 scales convert with F16C (exact, as `half`'s conversion).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `data` whole blocks of `ty` and `out`
/// as long as their weights.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dequantize(ty: model::quant::GgmlType, data: &[u8], out: &mut [f32]) {
    use model::quant::GgmlType;
    let mask = _mm_set1_epi8(0x0F);
    // Four groups of eight bytes: the low halves of `a` and `b`, then the high.
    let quads = |a: __m128i, b: __m128i| [a, _mm_srli_si128(a, 8), b, _mm_srli_si128(b, 8)];
    let ts = ty.type_size();
    for (b, y) in data.chunks_exact(ts).zip(out.chunks_exact_mut(32)) {
        // The block's f16 scale (and, for Q4_1, its minimum) in lanes 0 (and 1).
        let h = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
            b[0], b[1], b[2], b[3],
        ])));
        let d = _mm256_broadcastss_ps(h);
        let y = y.as_mut_ptr();
        match ty {
            GgmlType::Q4_1 => {
                let m = _mm256_broadcastss_ps(_mm_permute_ps(h, 0b01_01_01_01));
                let v = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
                let (lo, hi) = (
                    _mm_and_si128(v, mask),
                    _mm_and_si128(_mm_srli_epi16(v, 4), mask),
                );
                for (k, q) in quads(lo, hi).into_iter().enumerate() {
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                    _mm256_storeu_ps(y.add(8 * k), _mm256_add_ps(_mm256_mul_ps(f, d), m));
                }
            }
            GgmlType::Q4_0 => {
                let v = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
                let (lo, hi) = (
                    _mm_and_si128(v, mask),
                    _mm_and_si128(_mm_srli_epi16(v, 4), mask),
                );
                let eight = _mm256_set1_epi32(8);
                for (k, q) in quads(lo, hi).into_iter().enumerate() {
                    let i = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q), eight);
                    _mm256_storeu_ps(y.add(8 * k), _mm256_mul_ps(_mm256_cvtepi32_ps(i), d));
                }
            }
            GgmlType::Q8_0 => {
                let v0 = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
                let v1 = _mm_loadu_si128(b.as_ptr().add(18) as *const __m128i);
                for (k, q) in quads(v0, v1).into_iter().enumerate() {
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                    _mm256_storeu_ps(y.add(8 * k), _mm256_mul_ps(f, d));
                }
            }
            _ => unreachable!("the caller sends Q4_0, Q4_1 and Q8_0 only"),
        }
    }
}
