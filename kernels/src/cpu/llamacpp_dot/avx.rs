//! The AVX2 tiles of [`super`]: llama.cpp's integer dot for
//! several weight rows and activation rows at once, each output the
//! instructions of `ggml_vec_dot_q4_1_q8_1` / `ggml_vec_dot_q8_0_q8_0` in
//! their order (`maddubs`, `madd` with ones, convert, one FMA per block
//! per lane; the scalar FMA of Q4_1's minimum term; the final `hsum`), so
//! the same bits as the portable [`super::dot`]. Only the
//! grouping differs: one weight block unpacked serves several activation
//! rows, one activation block several weight rows.

// A tile's loops index its weight rows, activation rows, accumulators and
// lanes by the same `i` and `r`: ranges say that more plainly than zips.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use model::quant::GgmlType;

use super::ActBlocks;

/// `y[i][r]` = the dot of weight row `w[i]` (blocks of `ty`, Q4_1 or Q8_0)
/// with activation row `a[r]`.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; every row of `w` must be whole
/// blocks of `ty`, and each of `a` hold at least as many blocks.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn tile<const RW: usize, const RA: usize>(
    ty: GgmlType,
    w: [&[u8]; RW],
    a: [&ActBlocks; RA],
) -> [[f32; RA]; RW] {
    match ty {
        GgmlType::Q4_1 => tile_ty::<true, RW, RA>(w, a),
        GgmlType::Q8_0 => tile_ty::<false, RW, RA>(w, a),
        t => unreachable!("{t} has no integer-dot tile; the caller checks `modelled`"),
    }
}

/// An f16 at `p` as f32 (F16C: exact).
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn f16_at(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// `hsum_float_8`: the high half onto the low, then `(a0 + a2) + (a1 + a3)`.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn hsum(acc: __m256) -> f32 {
    let v = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// Q4_1's minimum terms of a tile, `summs[i][r] = fma(m_i, s_r, summs[i][r])`
/// block after block: four lanes of one vector per weight row when there are
/// four activation rows (a prefill's tile), four lanes over the weight rows
/// when there are four of those and one activation row (a decode's), scalars
/// otherwise. Each lane is the scalar chain, so the same bits either way;
/// the vectors leave the accumulators their registers.
struct Summs<const RW: usize, const RA: usize> {
    v: [__m128; RW],
    s: [[f32; RA]; RW],
}

impl<const RW: usize, const RA: usize> Summs<RW, RA> {
    const BY_ROWS: bool = RA == 4;
    const BY_WEIGHTS: bool = RW == 4 && RA == 1;

    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn new() -> Self {
        Summs {
            v: [_mm_setzero_ps(); RW],
            s: [[0f32; RA]; RW],
        }
    }

    /// Adds block `b`'s terms: the minimums `m[i]` of the weight rows' blocks
    /// (as f16 bits), the activations' sums `s_r[b]`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn add(&mut self, m: [u16; RW], a: [&ActBlocks; RA], b: usize) {
        if Self::BY_ROWS {
            let mut s4 = [0f32; 4];
            for r in 0..RA.min(4) {
                s4[r] = *a[r].s.get_unchecked(b);
            }
            let sv = _mm_loadu_ps(s4.as_ptr());
            for i in 0..RW {
                let mv = _mm_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(m[i] as i32)));
                self.v[i] = _mm_fmadd_ps(mv, sv, self.v[i]);
            }
        } else if Self::BY_WEIGHTS {
            let mut m4 = [0u16; 8];
            m4[..RW.min(4)].copy_from_slice(&m[..RW.min(4)]);
            let mv = _mm_cvtph_ps(_mm_loadu_si128(m4.as_ptr() as *const __m128i));
            let sv = _mm_set1_ps(*a[0].s.get_unchecked(b));
            self.v[0] = _mm_fmadd_ps(mv, sv, self.v[0]);
        } else {
            for i in 0..RW {
                let mi = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(m[i] as i32)));
                for r in 0..RA {
                    self.s[i][r] = mi.mul_add(*a[r].s.get_unchecked(b), self.s[i][r]);
                }
            }
        }
    }

    /// The terms, `[i][r]`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn get(&self) -> [[f32; RA]; RW] {
        let mut out = self.s;
        if Self::BY_ROWS {
            for i in 0..RW {
                let mut l = [0f32; 4];
                _mm_storeu_ps(l.as_mut_ptr(), self.v[i]);
                out[i].copy_from_slice(&l[..RA]);
            }
        } else if Self::BY_WEIGHTS {
            let mut l = [0f32; 4];
            _mm_storeu_ps(l.as_mut_ptr(), self.v[0]);
            for i in 0..RW {
                out[i][0] = l[i];
            }
        }
        out
    }
}

/// [`tile`] for Q4_1 (`Q41`) or Q8_0.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn tile_ty<const Q41: bool, const RW: usize, const RA: usize>(
    w: [&[u8]; RW],
    a: [&ActBlocks; RA],
) -> [[f32; RA]; RW] {
    let ts = if Q41 { 20 } else { 34 };
    let nb = w[0].len() / ts;
    debug_assert!(w.iter().all(|r| r.len() == nb * ts));
    debug_assert!(a.iter().all(|r| r.d.len() >= nb && r.qs.len() >= nb * 32));
    let ones = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); RA]; RW];
    let mut summs = Summs::<RW, RA>::new();
    for b in 0..nb {
        let mut qa = [_mm256_setzero_si256(); RA];
        let mut da = [0f32; RA];
        for r in 0..RA {
            qa[r] = _mm256_loadu_si256(a[r].qs.as_ptr().add(b * 32) as *const __m256i);
            da[r] = *a[r].d.get_unchecked(b);
        }
        let mut m = [0u16; RW];
        for i in 0..RW {
            // Each weight comes from memory once (a decode's every time, a
            // prefill's at its first four rows): ask for the rows eight on
            // while these are dotted (see `prefetch_ahead`).
            crate::cpu::rows_avx::prefetch_ahead(w[i], b * ts);
            let p = w[i].as_ptr().add(b * ts);
            let dw = f16_at(p);
            if Q41 {
                m[i] = (p.add(2) as *const u16).read_unaligned();
                // Low nibbles are elements 0..16, high ones 16..32.
                let v = _mm_loadu_si128(p.add(4) as *const __m128i);
                let qx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low);
                for r in 0..RA {
                    let xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                        ones,
                        _mm256_maddubs_epi16(qx, qa[r]),
                    ));
                    let dd = _mm256_set1_ps(dw * da[r]);
                    acc[i][r] = _mm256_fmadd_ps(dd, xy, acc[i][r]);
                }
            } else {
                let qx = _mm256_loadu_si256(p.add(2) as *const __m256i);
                let ax = _mm256_sign_epi8(qx, qx);
                for r in 0..RA {
                    let sy = _mm256_sign_epi8(qa[r], qx);
                    let xy =
                        _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy)));
                    let dd = _mm256_set1_ps(dw * da[r]);
                    acc[i][r] = _mm256_fmadd_ps(dd, xy, acc[i][r]);
                }
            }
        }
        if Q41 {
            summs.add(m, a, b);
        }
    }
    let summs = summs.get();
    let mut y = [[0f32; RA]; RW];
    for i in 0..RW {
        for r in 0..RA {
            y[i][r] = if Q41 {
                hsum(acc[i][r]) + summs[i][r]
            } else {
                hsum(acc[i][r])
            };
        }
    }
    y
}
