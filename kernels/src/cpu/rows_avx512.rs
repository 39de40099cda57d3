//! Loops of [`super::rows_avx`] on 512-bit registers: decode's (one
//! activation row against four weight rows read from their Q4_0, Q4_1 or
//! Q8_0 blocks) and prefill's (four activation rows against two weight
//! rows), for x86_64 CPUs with AVX-512F and BW (checked at run time by
//! [`enabled`]).
//!
//! Same bits as the AVX2 loops: a 512-bit register carries two weight rows'
//! eight-lane accumulators side by side (row `2p` in the low half, `2p + 1`
//! in the high), so every lane sees the same products in the same order as
//! its AVX2 twin; the weights are dequantized by the same expressions
//! (exact integer conversions, then `mul`, or for Q4_1 one FMA whose product
//! is exact), and the halves are summed by the AVX2 loops' own reduction.
//! `TAPTREE_CPU_AVX512=0` keeps a CPU that has AVX-512 on the AVX2 loops
//! (to compare the two).

#[cfg(target_arch = "x86_64")]
use super::rows_avx::{by_type, groups, prefetch_ahead, reduce4, reduce8, Q4_0, Q4_1, Q8_0};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether the loops here run: the CPU has AVX-512F and BW (with AVX2, F16C
/// and FMA for the rest of the block arithmetic) and `TAPTREE_CPU_AVX512` is
/// not `0`. Decided once per process.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let off = std::env::var("TAPTREE_CPU_AVX512").is_ok_and(|v| v == "0");
        !off && supported()
    })
}

/// Whether this CPU can run the loops here (whatever the variable says).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && super::rows_avx::block_loops()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The 32 weights of one block of row A (at `a`) and of row B (at `b`) as
/// four vectors, vector `k` holding A's weights `8k..8k + 8` in its low half
/// and B's in its high half: per lane the expressions of
/// `rows_avx::block_weights`.
///
/// # Safety
/// The CPU must support AVX-512F and BW, AVX2 and F16C; `a` and `b` each point at
/// one whole block of `TY`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
unsafe fn block_weights2<const TY: u32>(a: *const u8, b: *const u8) -> [__m512; 4] {
    // [d_A, m_A, d_B, m_B] (Q4_1's minimum follows its scale), exact f16 to f32.
    let ha = (a as *const i32).read_unaligned();
    let hb = (b as *const i32).read_unaligned();
    let h = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_setr_epi32(ha, hb, 0, 0)));
    // Lanes of h: 0 = A's d, 1 = A's m, 2 = B's d, 3 = B's m.
    let d = _mm512_permutexvar_ps(halves(0, 2), h);
    // Four groups of eight weights per row as integers, one a 32-bit lane:
    // [A's eight | B's eight] per group.
    let groups = if TY == Q8_0 {
        let a_lo = _mm_loadu_si128(a.add(2) as *const __m128i);
        let a_hi = _mm_loadu_si128(a.add(18) as *const __m128i);
        let b_lo = _mm_loadu_si128(b.add(2) as *const __m128i);
        let b_hi = _mm_loadu_si128(b.add(18) as *const __m128i);
        [
            _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(a_lo, b_lo)),
            _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(a_lo, b_lo)),
            _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(a_hi, b_hi)),
            _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(a_hi, b_hi)),
        ]
    } else {
        // The 16 bytes of nibbles as [A | A | B | B] (128-bit lanes); one
        // byte shuffle puts bytes 0..8 (then 8..16) of each row one per
        // 32-bit lane, zero above, so that the low nibbles are `& 0x0F` and
        // the high nibbles `>> 4`: three operations per two groups where
        // unpacking the bytes and widening them took four.
        let off = if TY == Q4_1 { 4 } else { 2 };
        let va = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.add(off) as *const __m128i));
        let vb = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(off) as *const __m128i));
        let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(va), vb);
        let first = _mm512_shuffle_epi8(x, _mm512_loadu_si512(SPREAD_FIRST.0.as_ptr() as *const _));
        let second =
            _mm512_shuffle_epi8(x, _mm512_loadu_si512(SPREAD_SECOND.0.as_ptr() as *const _));
        let mask = _mm512_set1_epi32(0x0F);
        [
            _mm512_and_si512(first, mask),
            _mm512_and_si512(second, mask),
            _mm512_srli_epi32::<4>(first),
            _mm512_srli_epi32::<4>(second),
        ]
    };
    let mut w = [_mm512_setzero_ps(); 4];
    if TY == Q4_1 {
        let m = _mm512_permutexvar_ps(halves(1, 3), h);
        for (wk, g) in w.iter_mut().zip(groups) {
            // `f * d` is exact, as in the AVX2 loop: one rounding of `f * d + m`.
            *wk = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), d, m);
        }
    } else if TY == Q4_0 {
        for (wk, g) in w.iter_mut().zip(groups) {
            let i = _mm512_sub_epi32(g, _mm512_set1_epi32(8));
            *wk = _mm512_mul_ps(_mm512_cvtepi32_ps(i), d);
        }
    } else {
        for (wk, g) in w.iter_mut().zip(groups) {
            *wk = _mm512_mul_ps(_mm512_cvtepi32_ps(g), d);
        }
    }
    w
}

/// A byte-shuffle control (`vpshufb`, per 128-bit lane) that puts bytes
/// `first + 4 * (lane % 2) ..` of each lane one per 32-bit lane, zero above:
/// on `[A | A | B | B]`, bytes `first..first + 8` of row A in the low eight
/// 32-bit lanes and of row B in the high eight.
const fn spread(first: u8) -> [u8; 64] {
    let mut c = [0x80u8; 64];
    let mut lane = 0;
    while lane < 4 {
        let mut i = 0;
        while i < 4 {
            c[16 * lane + 4 * i] = first + 4 * (lane as u8 % 2) + i as u8;
            i += 1;
        }
        lane += 1;
    }
    c
}

/// 64 bytes aligned for one 512-bit load.
#[repr(align(64))]
struct Align64([u8; 64]);

/// [`spread`] of bytes 0..8 (the first and third groups of a block).
static SPREAD_FIRST: Align64 = Align64(spread(0));
/// [`spread`] of bytes 8..16 (the second and fourth groups).
static SPREAD_SECOND: Align64 = Align64(spread(8));

/// Lane index `lo` in the low eight lanes, `hi` in the high eight.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn halves(lo: i32, hi: i32) -> __m512i {
    _mm512_set_epi32(
        hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo,
    )
}

/// Four vectors of eight from `p`, each in both halves of a register.
///
/// # Safety
/// The CPU must support AVX-512F; 32 floats readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load32_twice(p: *const f32) -> [__m512; 4] {
    [
        both_halves(p),
        both_halves(p.add(8)),
        both_halves(p.add(16)),
        both_halves(p.add(24)),
    ]
}

/// Eight floats at `p` in both halves of a 512-bit register.
///
/// # Safety
/// The CPU must support AVX-512F; 8 floats readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn both_halves(p: *const f32) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64)))
}

/// The four rows' sums of two two-row accumulators, in the AVX2 loops' order.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_pairs(acc: [__m512; 2]) -> __m128 {
    reduce4(rows_of(acc))
}

/// The high eight lanes of `v`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn high(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))
}

/// `rows_avx::dot_w4_blocks` on 512-bit registers: the same bits.
///
/// One group's call, the reference the tests hold the span loops (and
/// the two register widths) to; the forward calls the span loops.
///
/// # Safety
/// The CPU must support AVX-512F and BW, AVX2, F16C and FMA; `a.len()` a multiple
/// of 32 and each `w[j]` that many weights of whole blocks of `ty`.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
pub unsafe fn dot_w4_blocks(ty: model::quant::GgmlType, a: &[f32], w: [&[u8]; 4]) -> [f32; 4] {
    by_type!(ty, dot_w4_ty(ty.type_size(), a, w))
}

/// `dot_w4_blocks` over `out.len() / 4` groups of four rows in one call
/// (`rows_avx::dot_rows_blocks`): the same bits as a call per group.
///
/// # Safety
/// As `rows_avx::dot_rows_blocks`, with AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
pub unsafe fn dot_rows_blocks(ty: model::quant::GgmlType, a: &[f32], w: &[u8], out: &mut [f32]) {
    by_type!(ty, dot_rows_ty(ty.type_size(), a, w, out))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
unsafe fn dot_rows_ty<const TY: u32>(ts: usize, a: &[f32], w: &[u8], out: &mut [f32]) {
    for (o, rows) in out.chunks_exact_mut(4).zip(groups(w, ts * (a.len() / 32))) {
        o.copy_from_slice(&dot_w4_ty::<TY>(ts, a, rows));
    }
}

/// `q8_w4_blocks` over `out.len() / 4` groups of four rows in one call
/// (`rows_avx::q8_rows_blocks`): the same bits as a call per group.
///
/// # Safety
/// As `rows_avx::q8_rows_blocks`, with AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
pub unsafe fn q8_rows_blocks(
    ty: model::quant::GgmlType,
    q: &[f32],
    d: &[f32],
    w: &[u8],
    out: &mut [f32],
) {
    by_type!(ty, q8_rows_ty(ty.type_size(), q, d, w, out))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
unsafe fn q8_rows_ty<const TY: u32>(ts: usize, q: &[f32], d: &[f32], w: &[u8], out: &mut [f32]) {
    for (o, rows) in out.chunks_exact_mut(4).zip(groups(w, ts * (q.len() / 32))) {
        o.copy_from_slice(&q8_w4_ty::<TY>(ts, q, d, rows));
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
unsafe fn dot_w4_ty<const TY: u32>(ts: usize, a: &[f32], w: [&[u8]; 4]) -> [f32; 4] {
    let mut acc = [_mm512_setzero_ps(); 2];
    for blk in 0..a.len() / 32 {
        let av = load32_twice(a.as_ptr().add(32 * blk));
        for (pair, acc_p) in acc.iter_mut().enumerate() {
            prefetch_ahead(w[2 * pair], ts * blk);
            prefetch_ahead(w[2 * pair + 1], ts * blk);
            let wv = block_weights2::<TY>(
                w[2 * pair].as_ptr().add(ts * blk),
                w[2 * pair + 1].as_ptr().add(ts * blk),
            );
            for (x, y) in av.iter().zip(wv) {
                *acc_p = _mm512_add_ps(*acc_p, _mm512_mul_ps(*x, y));
            }
        }
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), reduce_pairs(acc));
    out
}

/// `rows_avx::q8_w4_blocks` on 512-bit registers: the same bits.
///
/// One group's call, the reference the tests hold the span loops (and
/// the two register widths) to; the forward calls the span loops.
///
/// # Safety
/// As `dot_w4_blocks`, with `q` for `a` and `d` holding `q.len() / 32` scales.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
pub unsafe fn q8_w4_blocks(
    ty: model::quant::GgmlType,
    q: &[f32],
    d: &[f32],
    w: [&[u8]; 4],
) -> [f32; 4] {
    by_type!(ty, q8_w4_ty(ty.type_size(), q, d, w))
}

// Inlined into its callers (whose features its intrinsics need): called
// once per group of a span, it was a call per 500 cycles of work.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q8_w4_ty<const TY: u32>(ts: usize, q: &[f32], d: &[f32], w: [&[u8]; 4]) -> [f32; 4] {
    let nb = (q.len() / 32).min(d.len());
    let mut total = _mm_setzero_ps();
    let mut blk = 0;
    if nb >= 4 {
        // Four blocks' sixteen sums reduced in one register; row r's running
        // total in lane 0 of quarter r, each block's term added in order.
        let mut t = _mm512_setzero_ps();
        while blk + 4 <= nb {
            let s = reduce_blocks4([
                block_sums_w4::<TY>(ts, q, w, blk),
                block_sums_w4::<TY>(ts, q, w, blk + 1),
                block_sums_w4::<TY>(ts, q, w, blk + 2),
                block_sums_w4::<TY>(ts, q, w, blk + 3),
            ]);
            let p = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_loadu_ps(d.as_ptr().add(blk))), s);
            t = _mm512_mask_add_ps(t, FIRST_OF_QUARTERS, t, p);
            t = _mm512_mask_add_ps(t, FIRST_OF_QUARTERS, t, _mm512_permute_ps::<1>(p));
            t = _mm512_mask_add_ps(t, FIRST_OF_QUARTERS, t, _mm512_permute_ps::<2>(p));
            t = _mm512_mask_add_ps(t, FIRST_OF_QUARTERS, t, _mm512_permute_ps::<3>(p));
            blk += 4;
        }
        let firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        total = _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, t));
    }
    // Two blocks' sums reduced in one register, as the AVX2 loop does.
    while blk + 2 <= nb {
        let s = reduce8(
            rows_of(block_sums_w4::<TY>(ts, q, w, blk)),
            rows_of(block_sums_w4::<TY>(ts, q, w, blk + 1)),
        );
        let d2 = _mm256_set_m128(_mm_set1_ps(d[blk + 1]), _mm_set1_ps(d[blk]));
        let p = _mm256_mul_ps(d2, s);
        total = _mm_add_ps(total, _mm256_castps256_ps128(p));
        total = _mm_add_ps(total, _mm256_extractf128_ps(p, 1));
        blk += 2;
    }
    if blk < nb {
        let s = reduce_pairs(block_sums_w4::<TY>(ts, q, w, blk));
        total = _mm_add_ps(total, _mm_mul_ps(_mm_set1_ps(d[blk]), s));
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), total);
    out
}

/// Lane 0 of each 128-bit quarter.
#[cfg(target_arch = "x86_64")]
const FIRST_OF_QUARTERS: __mmask16 = 0x1111;

/// Sixteen eight-lane sums at once: `acc[i]` is two two-row registers
/// `[x, y]`, and lane `i` of quarter `q` of the result is the sum of row `q`
/// of `[x.lo, x.hi, y.lo, y.hi]` (for decode's [`block_sums_w4`] of block
/// `i`: quarter `r` holds row `r`'s sums, lane `i` block `i`'s). Each is the
/// additions of the AVX2 loops' reduction (`((l0 + l4) + (l1 + l5)) +
/// ((l2 + l6) + (l3 + l7))`), in 21 operations where two [`reduce8`]s with
/// their extractions take 50 (a 256-bit `hadd` is three).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_blocks4(acc: [[__m512; 2]; 4]) -> __m512 {
    // Per block: quarter r = row r's `l_j + l_{j+4}`, j = 0..4.
    let u0 = fold_quarters(acc[0][0], acc[0][1]);
    let u1 = fold_quarters(acc[1][0], acc[1][1]);
    let u2 = fold_quarters(acc[2][0], acc[2][1]);
    let u3 = fold_quarters(acc[3][0], acc[3][1]);
    hadd_quarters(hadd_quarters(u0, u1), hadd_quarters(u2, u3))
}

/// `[x.q0 + x.q1, x.q2 + x.q3, y.q0 + y.q1, y.q2 + y.q3]` (128-bit quarters):
/// for two two-row registers, each row's low four lanes plus its high four.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fold_quarters(x: __m512, y: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
    )
}

/// `_mm_hadd_ps` in each 128-bit quarter: `[a0 + a1, a2 + a3, b0 + b1,
/// b2 + b3]`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hadd_quarters(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
        _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
    )
}

/// The eight-lane sums of block `blk` of `q` against the four weight rows,
/// two rows a register, each started from its first product.
///
/// # Safety
/// As `q8_w4_blocks`; `blk` a whole block of each.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
unsafe fn block_sums_w4<const TY: u32>(
    ts: usize,
    q: &[f32],
    w: [&[u8]; 4],
    blk: usize,
) -> [__m512; 2] {
    let qv = load32_twice(q.as_ptr().add(32 * blk));
    let mut acc = [_mm512_setzero_ps(); 2];
    for (pair, acc_p) in acc.iter_mut().enumerate() {
        prefetch_ahead(w[2 * pair], ts * blk);
        prefetch_ahead(w[2 * pair + 1], ts * blk);
        let wv = block_weights2::<TY>(
            w[2 * pair].as_ptr().add(ts * blk),
            w[2 * pair + 1].as_ptr().add(ts * blk),
        );
        let mut s = _mm512_mul_ps(qv[0], wv[0]);
        for k in 1..4 {
            s = _mm512_add_ps(s, _mm512_mul_ps(qv[k], wv[k]));
        }
        *acc_p = s;
    }
    acc
}

/// The four rows' 8-lane accumulators of two two-row registers, in order.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rows_of(acc: [__m512; 2]) -> [__m256; 4] {
    [
        _mm512_castps512_ps256(acc[0]),
        high(acc[0]),
        _mm512_castps512_ps256(acc[1]),
        high(acc[1]),
    ]
}

#[cfg(target_arch = "x86_64")]
mod keys;
#[cfg(target_arch = "x86_64")]
pub use keys::key_dots16;
#[cfg(target_arch = "x86_64")]
mod min_terms;
#[cfg(target_arch = "x86_64")]
pub use min_terms::min_terms_rows;
#[cfg(target_arch = "x86_64")]
mod prefill;
#[cfg(target_arch = "x86_64")]
pub use prefill::{dot4x2, dot4x4, q8_rows4x2, q8_rows4x4};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
