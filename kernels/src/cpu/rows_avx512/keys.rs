//! Attention's query-key dot products sixteen keys a register: each key's
//! sum is the one-key chain (`((q0 k0 + q1 k1) + q2 k2) + ...` over the
//! dimensions in order, products and adds unfused), a lane each, so the
//! same bits as one key at a time.

use super::min_terms::transpose16;
use std::arch::x86_64::*;

/// The dot products of `q` with sixteen keys, key `j` the `q.len()` floats
/// at `k + j * stride`: sixteen dimensions of the sixteen keys are loaded
/// key by key and transposed so that a register holds one dimension of
/// every key, then added to the keys' sums in dimension order.
///
/// # Safety
/// The CPU must support AVX-512F (and AVX); `q.len()` a multiple of 16 and
/// `q.len()` floats readable at `k + j * stride` for each `j < 16`.
#[target_feature(enable = "avx512f,avx")]
pub unsafe fn key_dots16(q: &[f32], k: *const f32, stride: usize) -> [f32; 16] {
    let mut s = _mm512_setzero_ps();
    for d0 in (0..q.len()).step_by(16) {
        let rows: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(k.add(j * stride + d0)));
        for (c, dim) in transpose16(rows).into_iter().enumerate() {
            s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(q[d0 + c]), dim));
        }
    }
    let mut out = [0f32; 16];
    _mm512_storeu_ps(out.as_mut_ptr(), s);
    out
}
