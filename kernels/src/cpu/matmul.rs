//! `y = x W^T` over rows of activations, in float or with activations
//! quantized to int8 per block (the `q8` mode).
//!
//! Weights are read through [`WeightRows`]: held as f32 (`super::qmatrix::Matrix`) or in
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
use super::quant_row::{give_back, quantize_row_into, take_rows, QuantRow};
use super::rows::{fill_chunk, Job};
use super::Real;
use crate::knobs::Count;

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
        let mut y = matmul_with_mins(x, n, &self.m, self.mins.as_deref(), act);
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

/// `y[r, o] = sum_k x[r, k] * w[o, k]` for `n` rows of `x` (`[n, w.cols]`).
/// Returns `[n, w.rows]`.
pub fn matmul<T: Real, W: WeightRows>(x: &[T], n: usize, w: &W, act: Act) -> Vec<T> {
    matmul_with_mins(x, n, w, None, act)
}

/// How `act` quantizes one activation row per block.
pub(crate) fn quantizer<T: Real>(act: Act) -> fn(&[T], usize, &mut QuantRow<T>) {
    match act {
        Act::LlamaCpp => super::llamacpp::quantize_row_into::<T>,
        Act::Float | Act::Q8 => quantize_row_into::<T>,
    }
}

/// Activation rows quantized per block size, for the matmuls that read them.
pub type QuantRows<T> = Vec<(usize, Vec<QuantRow<T>>)>;

/// Keeps every block size's rows of `qs` (their matmuls done) for this
/// thread's next row pass (`quant_row::give_back`).
pub(crate) fn give_back_all<T: Send + 'static>(qs: QuantRows<T>) {
    for (_, rows) in qs {
        give_back(rows);
    }
}

/// The block sizes whose quantized activation rows the matmuls `ls` read
/// under `act` (none for float activations or float weights), each once.
pub fn quant_blocks(ls: &[&Linear], act: Act) -> Vec<usize> {
    let mut blocks = Vec::new();
    for l in ls {
        let b = l.m.block();
        if reads_quantized(b, act) && !blocks.contains(&b) {
            blocks.push(b);
        }
    }
    blocks
}

/// Whether a matmul over weights in blocks of `block` reads its activations
/// quantized under `act` (not for float activations or float weights).
fn reads_quantized(block: usize, act: Act) -> bool {
    act != Act::Float && block > 1
}

/// `n` rows of `x` quantized per block of `block`, as `act` says, into
/// rows taken from this thread's spare ones (`quant_row::give_back` them
/// when their matmuls are done; dropped, they are simply freed).
pub(crate) fn quantize_rows<T: Real>(
    x: &[T],
    n: usize,
    block: usize,
    act: Act,
) -> Vec<QuantRow<T>> {
    let _p = super::profile::op(super::profile::Op::Quantize);
    let quantize = quantizer::<T>(act);
    if n == 0 {
        return Vec::new();
    }
    // Rows are independent: a prefill's are quantized in parallel.
    let w = x.len() / n;
    let mut rows = take_rows(n);
    let one = |r: usize, row: &mut QuantRow<T>| quantize(&x[r * w..(r + 1) * w], block, row);
    if super::par::worth(x.len(), n) {
        super::par::chunks_map(&mut rows, 1, |r, row| one(r, &mut row[0]));
    } else {
        rows.iter_mut().enumerate().for_each(|(r, row)| one(r, row));
    }
    rows
}

/// [`matmul`] with a Q4_1 weight's block minimums (see [`Linear`]).
pub fn matmul_with_mins<T: Real, W: WeightRows>(
    x: &[T],
    n: usize,
    w: &W,
    mins: Option<&[f32]>,
    act: Act,
) -> Vec<T> {
    let _p = super::profile::op(super::profile::Op::Matmul);
    let (cols, block) = (w.cols(), w.block());
    assert_eq!(x.len(), n * cols, "matmul input is not [{n}, {cols}]");
    let own = reads_quantized(block, act).then(|| quantize_rows(x, n, block, act));
    let llama = super::llamacpp_dot::rows_for(
        act == Act::LlamaCpp,
        super::llamacpp_dot::models(w),
        block,
        own.as_deref(),
    );
    let job = Job {
        x,
        n,
        w,
        mins,
        q: own.as_deref(),
        llama: llama.as_deref(),
    };
    let y = run_jobs(&[job]).pop().expect("one output per job");
    if let Some(llama) = llama {
        super::par::drop_rows(llama, cols);
    }
    if let Some(own) = own {
        give_back(own);
    }
    y
}

/// Several matmuls on the same input rows (q, k and v; gate and up) as one
/// parallel region over all their output features, the activations
/// quantized once per block size: outputs `[n, rows]` per weight, each bit
/// for bit what [`Linear::apply`] gives (every output is one dot product in
/// one order, whatever task computes it).
pub fn apply_group<T: Real>(ls: &[&Linear], x: &[T], n: usize, act: Act) -> Vec<Vec<T>> {
    let qs = quantize_for(ls, x, n, act);
    let ys = apply_group_quantized(ls, x, n, act, &qs);
    give_back_all(qs);
    ys
}

/// `x`'s `n` rows quantized once per block size the weights `ls` need
/// ([`quant_blocks`]), as [`apply_group_quantized`] takes them.
pub fn quantize_for<T: Real>(ls: &[&Linear], x: &[T], n: usize, act: Act) -> QuantRows<T> {
    quant_blocks(ls, act)
        .into_iter()
        .map(|b| (b, quantize_rows(x, n, b, act)))
        .collect()
}

/// [`apply_group`] with the activations already quantized per block size
/// ([`quant_blocks`] says which; `qs` must hold each, rows as
/// [`quantize_for`] gives them), so a row pass before the matmuls can
/// quantize them.
pub fn apply_group_quantized<T: Real>(
    ls: &[&Linear],
    x: &[T],
    n: usize,
    act: Act,
    qs: &QuantRows<T>,
) -> Vec<Vec<T>> {
    let _p = super::profile::op(super::profile::Op::Matmul);
    let quantized = |l: &Linear| reads_quantized(l.m.block(), act);
    let q32 = qs.iter().find(|(b, _)| *b == 32);
    let any_modelled = ls.iter().any(|l| super::llamacpp_dot::models(&l.m));
    let llama = q32.and_then(|(b, rows)| {
        super::llamacpp_dot::rows_for(act == Act::LlamaCpp, any_modelled, *b, Some(rows))
    });
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
                let rows = &rows.expect("the quantized rows of every block size").1[..];
                assert_eq!(rows.len(), n, "quantized rows");
                rows
            });
            Job {
                x,
                n,
                w: &l.m,
                mins: l.mins.as_deref(),
                q,
                llama: llama.as_deref().filter(|_| l.m.block() == 32),
            }
        })
        .collect();
    let mut ys = run_jobs(&jobs);
    drop(jobs);
    if let Some(llama) = llama {
        super::par::drop_rows(llama, x.len() / n.max(1));
    }
    for (y, l) in ys.iter_mut().zip(ls) {
        l.add_bias(y);
    }
    ys
}

/// The most outputs a task keeps on its stack (a decode task's 16).
const SMALL_OUT: usize = 64;

thread_local! {
    /// Each thread's buffer of dequantized weight rows, kept from task to
    /// task and region to region (see [`fill_chunk`]).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The jobs' matmuls as one parallel region (through [`super::par`]): tasks of
/// [`chunk_rows`] output features of one job each (over all rows, or one of
/// [`row_parts`] parts of them), written straight into `[n, rows]` (no
/// transposed copy, no second region).
fn run_jobs<T: Real, W: WeightRows>(jobs: &[Job<T, W>]) -> Vec<Vec<T>> {
    let total: usize = jobs.iter().map(|j| j.w.rows()).sum();
    run_jobs_split(jobs, chunk_rows(total), row_parts())
}

/// [`run_jobs`] with `chunk` output features per task and the rows cut
/// into `parts` parts (tasks: each feature chunk's parts in turn). Every
/// output is one dot product in one order whichever rows share its task,
/// so neither changes a bit.
fn run_jobs_split<T: Real, W: WeightRows>(
    jobs: &[Job<T, W>],
    chunk: usize,
    parts: usize,
) -> Vec<Vec<T>> {
    let n = jobs.first().map_or(0, |j| j.n);
    // Not zeroed: the tasks write every element (zeroing them first was
    // serial time in the forward's thread, hundreds of KB per op).
    let mut ys: Vec<Vec<T>> = jobs
        .iter()
        .map(|j| Vec::with_capacity(n * j.w.rows()))
        .collect();
    if n == 0 {
        return ys;
    }
    let outs: Vec<super::par::Ptr<T>> = ys
        .iter_mut()
        .map(|y| super::par::Ptr(y.as_mut_ptr()))
        .collect();
    let features: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| (0..j.w.rows()).step_by(chunk).map(move |f| (i, f)))
        .collect();
    let parts = parts.clamp(1, n);
    let part_rows = n.div_ceil(parts);
    super::par::for_each(features.len() * parts, &|t| {
        let ((i, first), p) = (features[t / parts], t % parts);
        let (r0, r1) = (p * part_rows, ((p + 1) * part_rows).min(n));
        if r0 >= r1 {
            return;
        }
        let job = &jobs[i];
        let (rows, cols) = (job.w.rows(), job.w.cols());
        let part = Job {
            x: &job.x[r0 * cols..r1 * cols],
            n: r1 - r0,
            w: job.w,
            mins: job.mins,
            q: job.q.map(|q| &q[r0..r1]),
            llama: job.llama.map(|l| &l[r0..r1]),
        };
        let k = chunk.min(rows - first);
        // Output features in the outer loop: weight rows stay in cache
        // while they meet every activation row; `buf` is `[k, r1 - r0]`,
        // on the stack where it is small (a decode's task: an allocation
        // and its free per task had been 3% of a decode step).
        let mut small = [T::ZERO; SMALL_OUT];
        let mut heap = Vec::new();
        let buf = if k * part.n <= SMALL_OUT {
            &mut small[..k * part.n]
        } else {
            heap.resize(k * part.n, T::ZERO);
            &mut heap[..]
        };
        SCRATCH.with(|s| fill_chunk(&part, first, buf, &mut s.borrow_mut()));
        let out = &outs[i];
        // SAFETY: in bounds (r0 + r < n, first + o < rows of the capacity);
        // this task alone writes features first..first + k of rows r0..r1
        // of output i.
        unsafe { transpose_into(buf, k, part.n, out.at(r0 * rows + first), rows) };
    });
    for (y, j) in ys.iter_mut().zip(jobs) {
        // SAFETY: the tasks above wrote all `n * rows` elements of each
        // output (every feature of every row part, the task list covers
        // them; an empty part has no rows).
        unsafe { y.set_len(n * j.w.rows()) };
    }
    ys
}

/// `buf` (`[k, n]`: feature-major) into `n` rows of `k` features at `dst`,
/// row `r` at `dst + r * stride`: four features by four rows a step through
/// SSE registers where an element is four bytes (the values only move), one
/// at a time elsewhere and at the edges.
///
/// # Safety
/// `dst + r * stride + o` must be writable for every `r < n`, `o < k`.
unsafe fn transpose_into<T: Copy>(buf: &[T], k: usize, n: usize, dst: *mut T, stride: usize) {
    debug_assert_eq!(buf.len(), k * n);
    let (mut o4, mut r4) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() == 4 {
        use std::arch::x86_64::*;
        (o4, r4) = (k / 4 * 4, n / 4 * 4);
        let src = buf.as_ptr() as *const f32;
        let dst = dst as *mut f32;
        for o in (0..o4).step_by(4) {
            for r in (0..r4).step_by(4) {
                // SAFETY: rows o..o + 4 of `buf` hold columns r..r + 4 (in
                // bounds: o + 4 <= k, r + 4 <= n); SSE is x86_64's baseline.
                let [a, b, c, d] = [0, 1, 2, 3].map(|i| _mm_loadu_ps(src.add((o + i) * n + r)));
                let (ab_l, ab_h) = (_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
                let (cd_l, cd_h) = (_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
                let rows4 = [
                    _mm_movelh_ps(ab_l, cd_l),
                    _mm_movehl_ps(cd_l, ab_l),
                    _mm_movelh_ps(ab_h, cd_h),
                    _mm_movehl_ps(cd_h, ab_h),
                ];
                for (j, v) in rows4.into_iter().enumerate() {
                    _mm_storeu_ps(dst.add((r + j) * stride + o), v);
                }
            }
        }
    }
    // What the registers left: rows r4.. of features ..o4, all of the rest.
    for o in 0..k {
        for r in if o < o4 { r4 } else { 0 }..n {
            dst.add(r * stride + o).write(buf[o * n + r]);
        }
    }
}

/// Into how many parts a matmul's rows are cut: 1 (never), or
/// `TAPTREE_CPU_ROW_PARTS` (1 to 1024), to measure a 2-D split of
/// the tasks (output features × rows). Cutting a prefill's 37 rows in two
/// where the output features gave fewer than 16 tasks per thread was
/// measured on 16 threads and was no faster (docs/PERFORMANCE.md).
fn row_parts() -> usize {
    static PARTS: Count = Count::new("TAPTREE_CPU_ROW_PARTS", 1..=1024, 1);
    PARTS.get()
}

/// Output features per rayon task: 16 (four groups of four weight rows),
/// fewer when that would leave some threads without a share (576 rows on 16
/// threads are 36 tasks of 16, 2.25 rounds; 144 tasks of 4 balance), never
/// below one group of four. Grouping changes no bit: each output is one dot
/// product in one order whatever group it falls in.
fn chunk_rows(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let per_thread = rows / (tasks_per_thread() * threads);
    (per_thread / 4 * 4).clamp(4, 16)
}

/// How many tasks per thread [`chunk_rows`] aims at: 8, or
/// `TAPTREE_CPU_TASKS_PER_THREAD` (1 to 1024) to measure others.
fn tasks_per_thread() -> usize {
    static TASKS: Count = Count::new("TAPTREE_CPU_TASKS_PER_THREAD", 1..=1024, 8);
    TASKS.get()
}

#[cfg(test)]
mod tests;
