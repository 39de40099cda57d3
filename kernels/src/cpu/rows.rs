//! The matmul's inner loops: a chunk of output features against every
//! activation row, in float or on q8 activations.
//!
//! Every output is the same sum in the same order as [`dot`] (eight lanes,
//! summed pairwise at the end) whatever the grouping: four activation rows
//! share one weight row ([`dot4`], prefill), or one activation row meets four
//! weight rows ([`dot_w4`], decode), so that four independent chains keep
//! the adder busy without reordering any sum. Weight rows are dequantized
//! four at a time into a small buffer when the weight is held quantized.
//!
//! The loops are compiled twice: for AVX2, chosen at run time, and for the
//! baseline. Both are the same additions and multiplications in the same
//! order (no FMA contraction: Rust never fuses), so the two give the same
//! bits; only the vector width differs.

use super::qmatrix::WeightRows;
use super::quant_row::QuantRow;
use super::Real;

mod dots;
pub use dots::Dots;

/// One matmul's inputs.
pub(crate) struct Job<'a, T, W> {
    pub x: &'a [T],
    pub n: usize,
    pub w: &'a W,
    pub mins: Option<&'a [f32]>,
    /// The activation rows quantized per block of the weight's block size,
    /// for the q8 path; `None` for float activations.
    pub q: Option<&'a [QuantRow<T>]>,
    /// The same rows in llama.cpp's blocks, where the matmul sums as
    /// llama.cpp does (`--precision llamacpp`: [`super::llamacpp_dot`]).
    pub llama: Option<&'a [super::llamacpp_dot::ActBlocks]>,
}

/// Fills `out` (`[k, n]`, transposed) with output features `first..first + k`;
/// `scratch` holds dequantized weight rows (a worker's, reused across tasks).
pub(crate) fn fill_chunk<T: Real, W: WeightRows>(
    job: &Job<T, W>,
    first: usize,
    out: &mut [T],
    scratch: &mut Vec<f32>,
) {
    if let Some(acts) = job.llama {
        assert_eq!(acts.len(), job.n, "activation blocks per row");
        if super::llamacpp_dot::fill_chunk(job.w, acts, first, out) {
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { fill_chunk_avx2(job, first, out, scratch) };
        }
    }
    chunk_body(job, first, out, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_chunk_avx2<T: Real, W: WeightRows>(
    job: &Job<T, W>,
    first: usize,
    out: &mut [T],
    scratch: &mut Vec<f32>,
) {
    chunk_body(job, first, out, scratch)
}

/// Dot product in a fixed order: eight independent lanes (so the compiler
/// vectorizes without reassociating) summed pairwise at the end.
#[inline(always)]
pub fn dot<T: Real>(a: &[T], w: &[f32]) -> T {
    debug_assert_eq!(a.len(), w.len());
    let mut acc = [T::ZERO; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let a8 = &a[c * 8..c * 8 + 8];
        let w8 = &w[c * 8..c * 8 + 8];
        for j in 0..8 {
            acc[j] += a8[j] * T::from_f32(w8[j]);
        }
    }
    for i in chunks * 8..a.len() {
        acc[i % 8] += a[i] * T::from_f32(w[i]);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// [`dot`] of four activation rows against one weight row, each row's sum in
/// exactly [`dot`]'s order (so a batched prefill equals one-row decode bit for
/// bit), with the weight loaded once for the four.
#[inline(always)]
pub fn dot4<T: Real>(a: [&[T]; 4], w: &[f32]) -> [T; 4] {
    let mut acc = [[T::ZERO; 8]; 4];
    let chunks = w.len() / 8;
    for c in 0..chunks {
        let w8 = &w[c * 8..c * 8 + 8];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let a8 = &a[r][c * 8..c * 8 + 8];
            for j in 0..8 {
                acc_r[j] += a8[j] * T::from_f32(w8[j]);
            }
        }
    }
    for i in chunks * 8..w.len() {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            acc_r[i % 8] += a[r][i] * T::from_f32(w[i]);
        }
    }
    acc.map(|l| ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])))
}

/// [`dot`] of one activation row against four weight rows, each sum in
/// exactly that order, with the activation loaded once for the four.
#[inline(always)]
pub fn dot_w4<T: Real>(a: &[T], w: [&[f32]; 4]) -> [T; 4] {
    let mut acc = [[T::ZERO; 8]; 4];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let a8 = &a[c * 8..c * 8 + 8];
        for (acc_r, wr) in acc.iter_mut().zip(&w) {
            let w8 = &wr[c * 8..c * 8 + 8];
            for j in 0..8 {
                acc_r[j] += a8[j] * T::from_f32(w8[j]);
            }
        }
    }
    for i in chunks * 8..a.len() {
        for (acc_r, wr) in acc.iter_mut().zip(&w) {
            acc_r[i % 8] += a[i] * T::from_f32(wr[i]);
        }
    }
    acc.map(|l| ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])))
}

#[inline(always)]
fn chunk_body<T: Real, W: WeightRows>(
    job: &Job<T, W>,
    first: usize,
    out: &mut [T],
    buf: &mut Vec<f32>,
) {
    let (n, cols) = (job.n, job.w.cols());
    let k = out.len() / n;
    // Grown only where rows are dequantized to memory (a decode's fused
    // groups never are) and never shrunk or zeroed again: a worker carries
    // it from task to task (allocating and zeroing it per task had cost 5%
    // of a decode, and a prefill on many threads runs many small tasks).
    // Only rows `row_in` just wrote are read from it.
    let mut i = 0;
    if n < 4 {
        i = fused_span(job, first, k / 4 * 4, out);
    }
    while i < k {
        let g = (k - i).min(4);
        if buf.len() < 4 * cols {
            buf.resize(4 * cols, 0f32);
        }
        let mut parts = buf[..4 * cols].chunks_exact_mut(cols);
        let mut wr: [&[f32]; 4] = [&[]; 4];
        for (j, slot) in wr.iter_mut().enumerate().take(g) {
            *slot = job
                .w
                .row_in(first + i + j, parts.next().expect("four parts"));
        }
        let first_row = wr[0];
        for slot in wr.iter_mut().skip(g) {
            *slot = first_row;
        }
        let out_g = &mut out[i * n..(i + g) * n];
        match job.q {
            Some(q) => q8_group(job, q, first + i, g, wr, out_g),
            None => float_group(job, g, wr, out_g),
        }
        i += g;
    }
}

/// Decode (fewer than four activation rows): weight rows `o0..o0 + k4` (`k4`
/// a multiple of four) against each activation row, read from their blocks
/// and dequantized in registers, one call of the loops per activation row
/// for all of them ([`Dots::dot_rows_blocks_fast`],
/// [`Dots::q8_rows_blocks_fast`]), then Q4_1's min terms where the
/// activation is q8 ([`min_terms_rows`]): the same bits as dequantizing the
/// rows first. Writes features `..k4` of `out` (`[k, n]`) and returns `k4`,
/// or returns 0 having written nothing where there is no such loop.
#[inline(always)]
fn fused_span<T: Real, W: WeightRows>(
    job: &Job<T, W>,
    o0: usize,
    k4: usize,
    out: &mut [T],
) -> usize {
    let (n, cols) = (job.n, job.w.cols());
    let Some((ty, w)) = job.w.block_rows(o0, k4) else {
        return 0;
    };
    let nb = cols / job.w.block();
    // The span's minimums (q8 against Q4_1), read after its sums: asked for
    // now, so that they arrive while the sums are computed (a stream of
    // their own, a fifth of the weights' bytes, that had waited on memory).
    let mins = job.q.and(job.mins).map(|m| &m[o0 * nb..(o0 + k4) * nb]);
    if let Some(m) = mins {
        prefetch(m);
    }
    // One activation row's sums against every weight row of the span.
    let row = |r: usize, y: &mut [T]| -> bool {
        let ran = match job.q {
            None => T::dot_rows_blocks_fast(&job.x[r * cols..(r + 1) * cols], ty, w, y),
            Some(q) if job.w.block() == 32 => T::q8_rows_blocks_fast(&q[r].q, &q[r].d, ty, w, y),
            Some(_) => false,
        };
        if let (true, Some(q), Some(m)) = (ran, job.q, mins) {
            min_terms_rows(y, m, nb, &q[r]);
        }
        ran
    };
    if n == 1 {
        return if row(0, &mut out[..k4]) { k4 } else { 0 };
    }
    let mut y = vec![T::ZERO; k4];
    for r in 0..n {
        // Whether there is a loop does not depend on the row: only the
        // first can find none, before anything is written.
        if !row(r, &mut y) {
            return 0;
        }
        for (j, v) in y.iter().enumerate() {
            out[j * n + r] = *v;
        }
    }
    k4
}

/// Asks for every cache line of `v` to be on its way into the cache (a
/// hint: it reads nothing and cannot fault).
#[inline(always)]
fn prefetch<T>(v: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(v);
        for off in (0..bytes).step_by(64) {
            // SAFETY: a prefetch neither reads into the program nor faults;
            // the address lies inside `v`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((v.as_ptr() as *const i8).add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// Q4_1's min terms added to one q8 row's sums `y` against the span's
/// weight rows (row `j`'s `nb` minimums at `m[j * nb..]`): all at once where
/// there is a loop for it, else four rows at a time, else one by one
/// ([`add_min_term`]): the same bits.
#[inline(always)]
fn min_terms_rows<T: Real>(y: &mut [T], m: &[f32], nb: usize, qr: &QuantRow<T>) {
    if T::min_terms_rows_fast(y, m, &qr.s_err) {
        return;
    }
    for (g, y4) in y.chunks_exact_mut(4).enumerate() {
        let m4 = [0, 1, 2, 3].map(|j| &m[(4 * g + j) * nb..][..nb]);
        let acc = [y4[0], y4[1], y4[2], y4[3]];
        let v = T::min_terms_w4_fast(acc, m4, &qr.s_err).unwrap_or_else(|| {
            let mut a = acc;
            for (j, aj) in a.iter_mut().enumerate() {
                add_min_term(Some(m), 4 * g + j, nb, qr, aj);
            }
            a
        });
        y4.copy_from_slice(&v);
    }
}

/// Adds Q4_1's min term for output feature `o` (see [`super::matmul`]).
#[inline(always)]
fn add_min_term<T: Real>(mins: Option<&[f32]>, o: usize, nb: usize, qr: &QuantRow<T>, acc: &mut T) {
    if let Some(mins) = mins {
        for (mb, e) in mins[o * nb..][..nb].iter().zip(&qr.s_err) {
            *acc += T::from_f32(*mb) * *e;
        }
    }
}

/// Q4_1's min terms added to four q8 rows' sums against output features `o`
/// and `o + 1` (`y[t][r]`), eight at once where there is a loop for it,
/// else one by one ([`add_min_term`]): the same bits.
#[inline(always)]
fn min_terms4x2<T: Real>(
    mins: Option<&[f32]>,
    o: usize,
    nb: usize,
    qs: [&QuantRow<T>; 4],
    y: [[T; 4]; 2],
) -> [[T; 4]; 2] {
    let Some(all) = mins else {
        return y;
    };
    let m2 = [o, o + 1].map(|o| &all[o * nb..][..nb]);
    T::min_terms4x2_fast(y, m2, qs.map(|x| &x.s_err[..])).unwrap_or_else(|| {
        let mut y = y;
        for (t, yt) in y.iter_mut().enumerate() {
            for (a, qr) in yt.iter_mut().zip(qs) {
                add_min_term(mins, o + t, nb, qr, a);
            }
        }
        y
    })
}

/// Four activation rows, the last repeated when fewer than four are left
/// (its extra results are dropped): keeps remainders on the vector path.
#[inline(always)]
fn four<'a, U: ?Sized>(rows: impl Fn(usize) -> &'a U, r: usize, n: usize) -> [&'a U; 4] {
    [0, 1, 2, 3].map(|t| rows((r + t).min(n - 1)))
}

/// Four weight rows against every activation row, four rows a tile:
/// `tile(r)` gives the sums of activation rows `r..r + 4` (the last
/// repeated past `n`, see [`four`]) against the four weight rows, or `None`
/// where there is no loop for it (on this CPU, at these lengths: then for
/// every `r`, and nothing is written). Whether the tiles were written.
#[inline(always)]
fn tiles4x4<T: Copy>(n: usize, out: &mut [T], tile: impl Fn(usize) -> Option<[[T; 4]; 4]>) -> bool {
    for r in (0..n).step_by(4) {
        let Some(y) = tile(r) else {
            return false;
        };
        let m = (n - r).min(4);
        for (t, yt) in y.iter().enumerate() {
            out[t * n + r..][..m].copy_from_slice(&yt[..m]);
        }
    }
    true
}

/// `g` weight rows (`wr[..g]`) against every activation row, in float.
#[inline(always)]
fn float_group<T: Real, W>(job: &Job<T, W>, g: usize, wr: [&[f32]; 4], out: &mut [T]) {
    let (n, cols, x) = (job.n, wr[0].len(), job.x);
    let row = |r: usize| &x[r * cols..(r + 1) * cols];
    if n < 4 && g == 4 {
        for r in 0..n {
            let y = T::dot_w4_fast(row(r), wr).unwrap_or_else(|| dot_w4(row(r), wr));
            for (j, yj) in y.into_iter().enumerate() {
                out[j * n + r] = yj;
            }
        }
        return;
    }
    // Four weight rows at once where there is a loop for it (sixteen sums
    // in flight), else in pairs (eight), a last odd one alone.
    if g == 4 && tiles4x4(n, out, |r| T::dot4x4_fast(four(row, r, n), wr)) {
        return;
    }
    let mut j = 0;
    while j < g {
        let pair = g - j >= 2;
        for r in (0..n).step_by(4) {
            let a = four(row, r, n);
            let y = if pair {
                let w2 = [wr[j], wr[j + 1]];
                T::dot4x2_fast(a, w2).unwrap_or_else(|| w2.map(|w| dot4(a, w)))
            } else {
                let y = T::dot4_fast(a, wr[j]).unwrap_or_else(|| dot4(a, wr[j]));
                [y, y]
            };
            let m = (n - r).min(4);
            for (t, yt) in y.iter().enumerate().take(if pair { 2 } else { 1 }) {
                out[(j + t) * n + r..][..m].copy_from_slice(&yt[..m]);
            }
        }
        j += if pair { 2 } else { 1 };
    }
}

/// `g` weight rows from output feature `o0` against every quantized
/// activation row: `sum_b d_b * dot(q_b, w_b)`, then Q4_1's min term (see
/// [`super::matmul`]), per output in that order.
#[inline(always)]
fn q8_group<T: Real, W: WeightRows>(
    job: &Job<T, W>,
    q: &[QuantRow<T>],
    o0: usize,
    g: usize,
    wr: [&[f32]; 4],
    out: &mut [T],
) {
    let (n, block) = (job.n, job.w.block());
    let nb = wr[0].len() / block;
    let min_term = |o: usize, qr: &QuantRow<T>, acc: &mut T| add_min_term(job.mins, o, nb, qr, acc);
    if n < 4 && g == 4 {
        for (r, qr) in q.iter().enumerate() {
            let mut acc = T::q8_w4_fast(&qr.q, &qr.d, wr, block).unwrap_or_else(|| {
                let mut acc = [T::ZERO; 4];
                for (b, d) in qr.d.iter().enumerate() {
                    let s = b * block..(b + 1) * block;
                    let y = dot_w4(&qr.q[s.clone()], wr.map(|w| &w[s.clone()]));
                    for (a, yj) in acc.iter_mut().zip(y) {
                        *a += *d * yj;
                    }
                }
                acc
            });
            for (j, a) in acc.iter_mut().enumerate() {
                min_term(o0 + j, qr, a);
                out[j * n + r] = *a;
            }
        }
        return;
    }
    // Four weight rows at once where there is a loop for it, else in
    // pairs, as in `float_group`.
    let tile = |r: usize| {
        let qs = four(|i| &q[i], r, n);
        let (qv, dv) = (qs.map(|x| &x.q[..]), qs.map(|x| &x.d[..]));
        let y = T::q8_rows4x4_fast(qv, dv, wr, block)?;
        let [y0, y1] = min_terms4x2(job.mins, o0, nb, qs, [y[0], y[1]]);
        let [y2, y3] = min_terms4x2(job.mins, o0 + 2, nb, qs, [y[2], y[3]]);
        Some([y0, y1, y2, y3])
    };
    if g == 4 && tiles4x4(n, out, tile) {
        return;
    }
    let mut j = 0;
    while j < g {
        let pair = g - j >= 2;
        for r in (0..n).step_by(4) {
            let qs = four(|i| &q[i], r, n);
            let (qv, dv) = (qs.map(|x| &x.q[..]), qs.map(|x| &x.d[..]));
            let portable = |w: &[f32]| {
                let mut acc = [T::ZERO; 4];
                for b in 0..nb {
                    let s = b * block..(b + 1) * block;
                    let y = dot4(qs.map(|qr| &qr.q[s.clone()]), &w[s]);
                    for ((a, qr), yt) in acc.iter_mut().zip(qs).zip(y) {
                        *a += qr.d[b] * yt;
                    }
                }
                acc
            };
            let accs = if pair {
                let w2 = [wr[j], wr[j + 1]];
                let y = T::q8_rows4x2_fast(qv, dv, w2, block).unwrap_or_else(|| w2.map(portable));
                min_terms4x2(job.mins, o0 + j, nb, qs, y)
            } else {
                let mut y =
                    T::q8_rows4_fast(qv, dv, wr[j], block).unwrap_or_else(|| portable(wr[j]));
                for (a, qr) in y.iter_mut().zip(qs) {
                    min_term(o0 + j, qr, a);
                }
                [y, y]
            };
            let m = (n - r).min(4);
            for (t, acc) in accs.iter().enumerate().take(if pair { 2 } else { 1 }) {
                out[(j + t) * n + r..][..m].copy_from_slice(&acc[..m]);
            }
        }
        j += if pair { 2 } else { 1 };
    }
}
