//! `y = x W^T` over rows of activations, in float or with activations
//! quantized to int8 per block (the `q8` mode).
//!
//! Weights are read through [`WeightRows`]: held as f32 ([`Matrix`]) or in
//! their quantized blocks (`super::qmatrix::QMatrix`), dequantized a few rows at a
//! time ([`super::rows`] has the inner loops). rayon splits the work over
//! output features, and each dot product runs in one fixed order, so the
//! result does not depend on the thread count or on how weights are held.
//!
//! ## The q8 path
//!
//! llama.cpp quantizes each activation row per block of the weight format's
//! block size (32 for Q4_0/Q4_1/Q5_0/Q8_0, 256 for K-quants) with
//! `d = amax / 127`, `q = round(x / d)`, then multiplies integer block sums by
//! the two scales (plus the min term for Q4_1). We quantize the activations
//! exactly that way — `d` rounded to f16 for the 32-blocks as `block_q8_0`
//! stores it, kept f32 for the 256-blocks as `block_q8_K` does — and dot the
//! integer activations with the dequantized weights block by block,
//! `sum_b d_b * sum_{i in b} q_i * w_i`, and for Q4_1 add llama.cpp's
//! rounding of its min term: `block_q8_1` carries `s = f16(d * sum q)`, so
//! llama.cpp's `m_w * s` differs from our `m_w * f16(d) * sum q` by
//! `m_w * (s - f16(d) * sum q)` ([`Linear`] keeps the minimums for it). What
//! remains is the f32 rounding of `w_i = d_w * q_w_i (+ m_w)`, far below the
//! int8 rounding being modelled (`kernels/tests/cpu_q8_dot.rs` checks it
//! against the integer dots written out). That last detail is not cosmetic:
//! it decides SmolLM2's first answer token to "What is the capital of
//! France?".

use super::qmatrix::{Weight, WeightRows};
use super::rows::{fill_chunk, Job};
use super::Real;
use rayon::prelude::*;

/// A weight matrix `[rows, cols]` = `[out_features, in_features]`, dequantized.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Row-major `[rows, cols]` values.
    pub data: Vec<f32>,
    /// Block size of the source format; 1 for float formats, whose matmuls
    /// llama.cpp runs without quantizing the activations.
    pub block: usize,
}

/// A matmul's weight: the dequantized matrix and, for Q4_1, its per-block
/// minimums (`[rows, cols / 32]`), for the one term of llama.cpp's q8 dot
/// that the block dot does not round the same way.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The weight, quantized or dense.
    pub m: Weight,
    /// Q4_1's per-block minimums, `[rows, cols / 32]`; `None` for other types.
    pub mins: Option<Vec<f32>>,
    /// Added to every output row (Qwen2's q/k/v projections).
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// `x W^T (+ bias)` for `n` rows of `x`.
    pub fn apply<T: Real>(&self, x: &[T], n: usize, act: Act) -> Vec<T> {
        self.apply_shared(x, n, act, None)
    }

    /// [`Self::apply`], with `x` already quantized in `shared` when it fits.
    pub fn apply_shared<T: Real>(
        &self,
        x: &[T],
        n: usize,
        act: Act,
        shared: Option<&Quantized<T>>,
    ) -> Vec<T> {
        let mut y = matmul_shared(x, n, &self.m, self.mins.as_deref(), act, shared);
        self.add_bias(&mut y);
        y
    }

    /// Adds the bias, if any, to every row of `y`.
    fn add_bias<T: Real>(&self, y: &mut [T]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                for (v, &bi) in row.iter_mut().zip(b) {
                    *v += T::from_f32(bi);
                }
            }
        }
    }
}

impl Matrix {
    /// Row `r` (`cols` values).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// How activations enter a matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// As they are (f32 or f64).
    Float,
    /// Quantized to int8 per block of the weight's block size.
    Q8,
    /// Quantized as llama.cpp's CPU backend does (`--precision llamacpp`:
    /// see [`super::llamacpp::quantize_row`]).
    LlamaCpp,
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

/// An activation row quantized per block: integer values (held as `T`, so the
/// block dot reuses [`dot`] exactly), one scale per block, and for 32-blocks
/// the rounding of `block_q8_1`'s f16 sum `s = d * sum(q)` against
/// `f16(d) * sum(q)` (what a Q4_1 dot's min term sees).
#[derive(Debug, Clone)]
pub struct QuantRow<T> {
    /// The quantized values, held as `T` (integers).
    pub q: Vec<T>,
    /// One scale per block: a value is `q * d`.
    pub d: Vec<T>,
    /// Per block: `block_q8_1`'s f16 sum `s` minus `f16(d) * sum(q)` for
    /// 32-blocks, 0 for other block sizes.
    pub s_err: Vec<T>,
}

/// Quantizes `x` to int8 per block of `block` elements, in f32 as llama.cpp
/// does for the weight's dot product: `quantize_row_q8_0`/`q8_1` for 32-blocks
/// (`d = amax / 127` stored as f16, `q = round(x / d)`), and for 256-blocks
/// (K-quant weights) `quantize_row_q8_K` through
/// [`model::quant::quantize_row_q8_k`] (`d = -max / 127` in f32, round half
/// to even).
pub fn quantize_row<T: Real>(x: &[T], block: usize) -> QuantRow<T> {
    assert!(
        block > 0 && x.len() % block == 0,
        "row of {} is not a multiple of block {block}",
        x.len()
    );
    if block == 256 {
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let blocks = model::quant::quantize_row_q8_k(&xf).expect("whole blocks, checked above");
        return QuantRow {
            q: blocks
                .iter()
                .flat_map(|b| b.qs.iter().map(|&v| T::from_f32(v as f32)))
                .collect(),
            d: blocks.iter().map(|b| T::from_f32(b.d)).collect(),
            s_err: vec![T::ZERO; blocks.len()],
        };
    }
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::with_capacity(x.len() / block);
    let mut s_err = Vec::with_capacity(x.len() / block);
    for b in x.chunks_exact(block) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for v in b {
            let r = (v.to_f32() * inv).round().clamp(-127.0, 127.0);
            sum += r as i32;
            q.push(T::from_f32(r));
        }
        // block_q8_0/q8_1 store the scale as f16, block_q8_K as f32; the
        // quantized values above use the unrounded scale, as llama.cpp does.
        if block == 32 {
            let stored = half::f16::from_f32(scale).to_f32();
            let s = half::f16::from_f32(sum as f32 * scale).to_f32();
            d.push(T::from_f32(stored));
            s_err.push(T::from_f64(s as f64 - stored as f64 * sum as f64));
        } else {
            d.push(T::from_f32(scale));
            s_err.push(T::ZERO);
        }
    }
    QuantRow { q, d, s_err }
}

/// `y[r, o] = sum_k x[r, k] * w[o, k]` for `n` rows of `x` (`[n, w.cols]`).
/// Returns `[n, w.rows]`.
pub fn matmul<T: Real, W: WeightRows>(x: &[T], n: usize, w: &W, act: Act) -> Vec<T> {
    matmul_with_mins(x, n, w, None, act)
}

/// Activation rows quantized once for several matmuls that read the same
/// input with the same block size and activation handling (q, k and v; gate
/// and up): quantizing is deterministic, so sharing it changes no bit.
#[derive(Debug, Clone)]
pub struct Quantized<T> {
    block: usize,
    act: Act,
    rows: Vec<QuantRow<T>>,
}

impl<T: Real> Quantized<T> {
    /// Quantizes `x` (`n` rows) for `weights` when they all quantize it the
    /// same way; otherwise holds nothing and each matmul quantizes its own.
    pub fn for_weights(x: &[T], n: usize, act: Act, weights: &[&Linear]) -> Quantized<T> {
        let block = weights.first().map_or(1, |l| l.m.block());
        let shared = weights.iter().all(|l| l.m.block() == block);
        let rows = if shared && act != Act::Float && block > 1 {
            quantize_rows(x, n, block, act)
        } else {
            Vec::new()
        };
        Quantized { block, act, rows }
    }

    fn fits(&self, block: usize, act: Act) -> Option<&[QuantRow<T>]> {
        (!self.rows.is_empty() && self.block == block && self.act == act).then_some(&self.rows[..])
    }
}

/// `n` rows of `x` quantized per block of `block`, as `act` says.
fn quantize_rows<T: Real>(x: &[T], n: usize, block: usize, act: Act) -> Vec<QuantRow<T>> {
    let quantize = match act {
        Act::LlamaCpp => super::llamacpp::quantize_row::<T>,
        Act::Float | Act::Q8 => quantize_row::<T>,
    };
    if n == 0 {
        return Vec::new();
    }
    // Rows are independent: a prefill's are quantized on rayon's threads.
    if n > 1 {
        return x
            .par_chunks_exact(x.len() / n)
            .map(|r| quantize(r, block))
            .collect();
    }
    vec![quantize(x, block)]
}

/// [`matmul`] with a Q4_1 weight's block minimums (see [`Linear`]).
pub fn matmul_with_mins<T: Real, W: WeightRows>(
    x: &[T],
    n: usize,
    w: &W,
    mins: Option<&[f32]>,
    act: Act,
) -> Vec<T> {
    matmul_shared(x, n, w, mins, act, None)
}

/// [`matmul_with_mins`], taking the quantized activations from `shared` when
/// they were quantized for this weight's block size.
fn matmul_shared<T: Real, W: WeightRows>(
    x: &[T],
    n: usize,
    w: &W,
    mins: Option<&[f32]>,
    act: Act,
    shared: Option<&Quantized<T>>,
) -> Vec<T> {
    let (cols, block) = (w.cols(), w.block());
    assert_eq!(x.len(), n * cols, "matmul input is not [{n}, {cols}]");
    let quantized = act != Act::Float && block > 1;
    let own: Vec<QuantRow<T>>;
    let q = match shared.and_then(|s| s.fits(block, act)) {
        Some(q) if quantized => Some(q),
        _ if quantized => {
            own = quantize_rows(x, n, block, act);
            Some(&own[..])
        }
        _ => None,
    };
    let job = Job { x, n, w, mins, q };
    run_jobs(&[job]).pop().expect("one output per job")
}

/// Several matmuls on the same input rows (q, k and v; gate and up) as one
/// parallel region over all their output features, the activations
/// quantized once per block size: outputs `[n, rows]` per weight, each bit
/// for bit what [`Linear::apply`] gives (every output is one dot product in
/// one order, whatever task computes it).
pub fn apply_group<T: Real>(ls: &[&Linear], x: &[T], n: usize, act: Act) -> Vec<Vec<T>> {
    let quantized = |l: &Linear| act != Act::Float && l.m.block() > 1;
    let mut qs: Vec<(usize, Vec<QuantRow<T>>)> = Vec::new();
    for l in ls.iter().filter(|l| quantized(l)) {
        if !qs.iter().any(|(b, _)| *b == l.m.block()) {
            qs.push((l.m.block(), quantize_rows(x, n, l.m.block(), act)));
        }
    }
    let jobs: Vec<_> = ls
        .iter()
        .map(|l| {
            assert_eq!(
                x.len(),
                n * l.m.cols(),
                "matmul input is not [{n}, {}]",
                l.m.cols()
            );
            let q = quantized(l).then(|| {
                let rows = qs.iter().find(|(b, _)| *b == l.m.block());
                &rows.expect("quantized above").1[..]
            });
            Job {
                x,
                n,
                w: &l.m,
                mins: l.mins.as_deref(),
                q,
            }
        })
        .collect();
    let mut ys = run_jobs(&jobs);
    for (y, l) in ys.iter_mut().zip(ls) {
        l.add_bias(y);
    }
    ys
}

/// A raw pointer to an output that rayon's tasks write at disjoint indices.
struct Scatter<T>(*mut T);
// SAFETY: the tasks of `run_jobs` write disjoint elements and nothing reads
// the outputs until the region has joined.
unsafe impl<T: Send> Sync for Scatter<T> {}

/// The jobs' matmuls as one parallel region: tasks of [`chunk_rows`] output
/// features of one job each, written straight into `[n, rows]` (no
/// transposed copy, no second region).
fn run_jobs<T: Real, W: WeightRows>(jobs: &[Job<T, W>]) -> Vec<Vec<T>> {
    let n = jobs.first().map_or(0, |j| j.n);
    let total: usize = jobs.iter().map(|j| j.w.rows()).sum();
    let chunk = chunk_rows(total);
    let mut ys: Vec<Vec<T>> = jobs.iter().map(|j| vec![T::ZERO; n * j.w.rows()]).collect();
    if n == 0 {
        return ys;
    }
    let outs: Vec<Scatter<T>> = ys.iter_mut().map(|y| Scatter(y.as_mut_ptr())).collect();
    let tasks: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| (0..j.w.rows()).step_by(chunk).map(move |f| (i, f)))
        .collect();
    tasks
        .par_iter()
        .for_each_init(Vec::new, |buf, &(i, first)| {
            let rows = jobs[i].w.rows();
            let k = chunk.min(rows - first);
            buf.clear();
            buf.resize(k * n, T::ZERO);
            // Output features in the outer loop: weight rows stay in cache
            // while they meet every activation row; `buf` is `[k, n]`.
            fill_chunk(&jobs[i], first, buf);
            let out = &outs[i];
            for (o, col) in buf.chunks_exact(n).enumerate() {
                for (r, v) in col.iter().enumerate() {
                    // SAFETY: in bounds (r < n, first + o < rows); this task
                    // alone writes features first..first + k of output i.
                    unsafe { *out.0.add(r * rows + first + o) = *v };
                }
            }
        });
    ys
}

/// Output features per rayon task: 16 (four groups of four weight rows),
/// fewer when that would leave some threads without a share (576 rows on 16
/// threads are 36 tasks of 16, 2.25 rounds; 144 tasks of 4 balance), never
/// below one group of four. Grouping changes no bit: each output is one dot
/// product in one order whatever group it falls in.
fn chunk_rows(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let per_thread = rows / (8 * threads);
    (per_thread / 4 * 4).clamp(4, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                    / (1 << 24) as f32
                    - 0.5
            })
            .collect()
    }

    #[test]
    fn dot4_is_dot_bit_for_bit_at_boundary_lengths() {
        for len in [1, 7, 8, 9, 31, 32, 33, 576] {
            let w = seq(len, 1);
            let rows: Vec<Vec<f32>> = (0..4).map(|r| seq(len, 10 + r)).collect();
            let got = dot4([&rows[0], &rows[1], &rows[2], &rows[3]], &w);
            for r in 0..4 {
                assert_eq!(
                    got[r].to_bits(),
                    dot(&rows[r], &w).to_bits(),
                    "len {len} row {r}"
                );
            }
        }
    }

    #[test]
    fn batched_rows_equal_single_rows() {
        // 1 to 9 rows: blocks of four plus a remainder.
        let w = Matrix {
            rows: 3,
            cols: 40,
            data: seq(120, 3),
            block: 1,
        };
        for n in [1, 3, 4, 5, 8, 9] {
            let x = seq(n * 40, 7);
            let batched = matmul(&x, n, &w, Act::Float);
            for r in 0..n {
                let one = matmul(&x[r * 40..(r + 1) * 40], 1, &w, Act::Float);
                assert_eq!(&batched[r * 3..(r + 1) * 3], &one[..], "n {n} row {r}");
            }
        }
    }

    #[test]
    fn quantize_row_crushes_a_block_with_an_outlier() {
        // One massive value: the rest of its 32-block rounds to zero, the
        // next block keeps its resolution.
        let mut x = vec![0.01f32; 64];
        x[7] = -3000.0;
        let q = quantize_row(&x, 32);
        assert_eq!(q.q[7], -127.0);
        assert!(q.q[..32]
            .iter()
            .enumerate()
            .all(|(i, v)| i == 7 || *v == 0.0));
        assert!(q.q[32..].iter().all(|v| *v == 127.0));
        // The 32-block scale is stored as f16, as block_q8_0 does.
        assert_eq!(q.d[0], half::f16::from_f64(3000.0 / 127.0).to_f32());
    }

    #[test]
    fn q8_matmul_is_close_without_outliers_and_far_with_one() {
        let w = Matrix {
            rows: 16,
            cols: 64,
            data: seq(16 * 64, 5),
            block: 32,
        };
        let x = seq(64, 9);
        let f = matmul(&x, 1, &w, Act::Float);
        let q = matmul(&x, 1, &w, Act::Q8);
        let err = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max)
        };
        assert!(err(&f, &q) < 0.01, "{}", err(&f, &q));
        assert_ne!(f, q);
        // Float weights (block 1) are never quantized.
        let wf = Matrix {
            block: 1,
            ..w.clone()
        };
        assert_eq!(matmul(&x, 1, &wf, Act::Q8), f);
        // An outlier in block 0: the product with column 0 stays exact-ish,
        // but the other 31 values of the block are lost.
        let mut xo = x.clone();
        xo[0] = 1000.0;
        let (fo, qo) = (matmul(&xo, 1, &w, Act::Float), matmul(&xo, 1, &w, Act::Q8));
        assert!(
            err(&fo, &qo) > 10.0 * err(&f, &q),
            "{} vs {}",
            err(&fo, &qo),
            err(&f, &q)
        );
    }
}
