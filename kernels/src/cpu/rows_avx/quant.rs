//! One 32-block of an activation row quantized as `quant_row`'s loop does
//! it (`amax = max |x|`, `scale = amax / 127`, `q = round(x / scale)` half
//! away from zero, clamped to ±127), eight values a register: the same
//! operations on each value, so the same values.

use std::arch::x86_64::*;

/// The 32 values of `b` quantized into `q` with `inv` the reciprocal of
/// their scale (0 where the scale is 0), as the loop does; returns the
/// scale and the sum of the quantized values, or `None` (having written
/// nothing) where a scaled value is NaN (a NaN or infinite input), which the
/// loop's own handling decides.
///
/// # Safety
/// The CPU must support AVX; `b` and `q` 32 long.
#[target_feature(enable = "avx")]
pub unsafe fn quant_block32(b: &[f32], q: &mut [f32]) -> Option<(f32, i32)> {
    assert!(b.len() == 32 && q.len() == 32, "a block of 32");
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(b.as_ptr().add(8 * i)));
    // `m.max(|x|)` ignores a NaN `|x|`, as `maxps(|x|, m)` does (it returns
    // its second operand when either is NaN); the order of a maximum of
    // numbers changes nothing.
    let mut m = _mm256_setzero_ps();
    for x in v {
        m = _mm256_max_ps(_mm256_and_ps(x, abs), m);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let amax = lanes.iter().fold(0f32, |a, &x| a.max(x));
    let scale = amax / 127.0;
    let inv = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let sign = _mm256_set1_ps(-0.0);
    let mut r = [_mm256_setzero_ps(); 4];
    for (ri, x) in r.iter_mut().zip(v) {
        let y = _mm256_mul_ps(x, inv);
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(y, y)) != 0 {
            return None;
        }
        // Half away from zero: the truncation, one step further where the
        // part cut off (exact) is at least a half. Where it is not, the
        // truncation itself, so that -0.4 gives -0, as `round` does.
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let cut = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
        let step = _mm256_or_ps(one, _mm256_and_ps(sign, y));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(cut, half);
        let rounded = _mm256_blendv_ps(t, _mm256_add_ps(t, step), away);
        *ri = _mm256_min_ps(
            _mm256_max_ps(rounded, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        );
    }
    let mut sum = _mm256_setzero_si256();
    for (i, ri) in r.iter().enumerate() {
        _mm256_storeu_ps(q.as_mut_ptr().add(8 * i), *ri);
        sum = _mm256_add_epi32(sum, _mm256_cvttps_epi32(*ri));
    }
    let mut ints = [0i32; 8];
    _mm256_storeu_si256(ints.as_mut_ptr() as *mut __m256i, sum);
    Some((scale, ints.iter().sum()))
}
