//! Causal grouped-query attention over a KV cache: `softmax(q k^T / sqrt(d)) v`.

use super::Real;

/// Head counts and sizes of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; each serves `n_head / n_head_kv` query heads.
    pub n_head_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
}

/// Attention of `n` query rows (`q`: `[n, n_head * head_dim]`, row `r` at
/// position `start + r`) over the cached keys and values of positions
/// `0..start + n` (`[start + n, n_head_kv * head_dim]` each). Row `r` sees
/// positions `0..=start + r`. Query head `h` reads KV head
/// `h / (n_head / n_head_kv)`.
///
/// Each (row, head) is one task with its own sequential reductions, so the
/// result does not depend on which thread runs it.
pub fn attention<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
) -> Vec<T> {
    attention_windowed(q, n, start, k, v, heads, None)
}

/// [`attention`] where row `r` sees only the last `window` positions
/// `start + r + 1 - window ..= start + r` (sliding-window attention, as
/// Hugging Face's and llama.cpp's masks have it); `None` sees them all.
pub fn attention_windowed<T: Real>(
    q: &[T],
    n: usize,
    start: usize,
    k: &[T],
    v: &[T],
    heads: Heads,
    window: Option<usize>,
) -> Vec<T> {
    let Heads {
        n_head, head_dim, ..
    } = heads;
    let scale = T::from_f64(1.0 / (head_dim as f64).sqrt());
    let _p = super::profile::op(super::profile::Op::Attention);
    let mut tasks = vec![(); n * n_head];
    let task = Task {
        q,
        k,
        v,
        heads,
        start,
        window,
        scale,
    };
    let (out, _) =
        super::par::chunks_fresh_map(&mut tasks, 1, head_dim, |i, _, o: &mut [T]| task.run(i, o));
    out
}

/// One (row, head) of [`attention_windowed`]: its inputs.
struct Task<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    heads: Heads,
    start: usize,
    window: Option<usize>,
    scale: T,
}

impl<T: Real> Task<'_, T> {
    /// Task `i` (row `i / n_head`, head `i % n_head`) into `o`, in the
    /// widest vector registers this CPU has: the loops are the same
    /// sequence of operations either way (Rust fuses no multiply and add),
    /// so the registers change no bit, only how many keys or dimensions
    /// one instruction takes.
    fn run(&self, i: usize, o: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        {
            if super::rows_avx512::enabled() {
                // SAFETY: the CPU has AVX-512F (checked by `enabled`).
                return unsafe { self.run_avx512(i, o) };
            }
            if super::rows_avx::block_loops() {
                // SAFETY: the CPU has AVX2 (checked by `block_loops`).
                return unsafe { self.run_avx2(i, o) };
            }
        }
        self.body(i, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn run_avx512(&self, i: usize, o: &mut [T]) {
        self.body(i, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self, i: usize, o: &mut [T]) {
        self.body(i, o)
    }

    #[inline(always)]
    fn body(&self, i: usize, o: &mut [T]) {
        let Task {
            q,
            k,
            v,
            heads,
            start,
            window,
            scale,
        } = *self;
        let Heads {
            n_head,
            n_head_kv,
            head_dim,
        } = heads;
        let (q_width, kv_width, group) =
            (n_head * head_dim, n_head_kv * head_dim, n_head / n_head_kv);
        let (r, h) = (i / n_head, i % n_head);
        let kvh = h / group;
        let qh = &q[r * q_width + h * head_dim..][..head_dim];
        let seen = start + r + 1;
        let first = window.map_or(0, |w| seen.saturating_sub(w));
        let mut scores = Vec::with_capacity(seen - first);
        let mut max = T::from_f64(f64::NEG_INFINITY);
        let key = |t: usize| &k[t * kv_width + kvh * head_dim..][..head_dim];
        let mut t = first;
        let mut push = |s: T| {
            let s = s * scale;
            if s > max {
                max = s;
            }
            scores.push(s);
        };
        // Sixteen keys a register where there is a loop for it.
        while seen - t >= 16 {
            let Some(sums) = T::key_dots16_fast(qh, &k[t * kv_width + kvh * head_dim..], kv_width)
            else {
                break;
            };
            sums.into_iter().for_each(&mut push);
            t += 16;
        }
        while t < seen {
            // KEYS keys at a time: each key's sum is its own chain over the
            // dimensions in order, as one key alone; the chains run side by
            // side instead of one after another.
            let m = KEYS.min(seen - t);
            let sums = if m == KEYS {
                key_dots4(qh, [0, 1, 2, 3].map(|j| key(t + j)))
            } else {
                let mut one = [T::ZERO; KEYS];
                for (j, s) in one.iter_mut().take(m).enumerate() {
                    *s = key_dot(qh, key(t + j));
                }
                one
            };
            sums.into_iter().take(m).for_each(&mut push);
            t += m;
        }
        let mut sum = T::ZERO;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = T::ONE / sum;
        for (t, p) in (first..seen).zip(scores.iter()) {
            let p = *p * inv;
            let vh = &v[t * kv_width + kvh * head_dim..][..head_dim];
            for (acc, x) in o.iter_mut().zip(vh) {
                *acc += p * *x;
            }
        }
    }
}

/// How many keys' dot products with the query run side by side.
const KEYS: usize = 4;

/// The dot product of `q` with key `k`: `((q0 k0 + q1 k1) + q2 k2) + ...`
/// over the dimensions in order, products and adds unfused.
#[inline(always)]
fn key_dot<T: Real>(q: &[T], k: &[T]) -> T {
    let mut s = T::ZERO;
    for (a, b) in q.iter().zip(k) {
        s += *a * *b;
    }
    s
}

/// [`key_dot`] of `q` with four keys, each its own chain in the same order,
/// the four side by side; the sums are locals, so that they stay in
/// registers.
#[inline(always)]
fn key_dots4<T: Real>(q: &[T], [k0, k1, k2, k3]: [&[T]; KEYS]) -> [T; KEYS] {
    let (mut s0, mut s1, mut s2, mut s3) = (T::ZERO, T::ZERO, T::ZERO, T::ZERO);
    for ((((a, b0), b1), b2), b3) in q.iter().zip(k0).zip(k1).zip(k2).zip(k3) {
        s0 += *a * *b0;
        s1 += *a * *b1;
        s2 += *a * *b2;
        s3 += *a * *b3;
    }
    [s0, s1, s2, s3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_position_returns_its_own_value() {
        // One position: softmax over one score is 1, so out = v.
        let heads = Heads {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
        };
        let q = [1.0f64, 2.0, -3.0, 0.5];
        let k = [0.3f64, 0.7];
        let v = [5.0f64, -6.0];
        assert_eq!(
            attention(&q, 1, 0, &k, &v, heads),
            vec![5.0, -6.0, 5.0, -6.0]
        );
    }

    #[test]
    fn equal_scores_average_values_causally() {
        // Zero queries score every key equally: row r averages v[0..=r].
        let heads = Heads {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 1,
        };
        let q = [0.0f64; 3];
        let k = [1.0f64, 2.0, 3.0];
        let v = [3.0f64, 6.0, 9.0];
        let out = attention(&q, 3, 0, &k, &v, heads);
        assert_eq!(out, vec![3.0, 4.5, 6.0]);
    }

    #[test]
    fn a_window_forgets_older_positions() {
        // Window 2: row 2 averages v[1..=2] only; without one, v[0..=2].
        let heads = Heads {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 1,
        };
        let (q, k, v) = ([0.0f64; 3], [1.0f64, 2.0, 3.0], [3.0f64, 6.0, 9.0]);
        let out = attention_windowed(&q, 3, 0, &k, &v, heads, Some(2));
        assert_eq!(out, vec![3.0, 4.5, 7.5]);
        assert_eq!(
            attention_windowed(&q, 3, 0, &k, &v, heads, None),
            attention(&q, 3, 0, &k, &v, heads)
        );
    }

    #[test]
    fn gqa_heads_read_their_group() {
        // 4 query heads over 2 KV heads: heads 0,1 read KV 0; heads 2,3 read KV 1.
        let heads = Heads {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 1,
        };
        let out = attention(&[0.0f64; 4], 1, 0, &[1.0, 1.0], &[10.0, 20.0], heads);
        assert_eq!(out, vec![10.0, 10.0, 20.0, 20.0]);
    }

    /// The one-key-at-a-time order, written out: each key's score a chain
    /// over the dimensions, the softmax's sum and each output a chain over
    /// the keys.
    fn one_key_at_a_time(
        q: &[f32],
        (n, start): (usize, usize),
        (k, v): (&[f32], &[f32]),
        heads: Heads,
        window: Option<usize>,
    ) -> Vec<f32> {
        let Heads {
            n_head,
            n_head_kv,
            head_dim,
        } = heads;
        let (qw, kvw, group) = (n_head * head_dim, n_head_kv * head_dim, n_head / n_head_kv);
        let scale = (1.0 / (head_dim as f64).sqrt()) as f32;
        let mut out = vec![0f32; n * qw];
        for r in 0..n {
            for h in 0..n_head {
                let qh = &q[r * qw + h * head_dim..][..head_dim];
                let kvh = h / group;
                let seen = start + r + 1;
                let first = window.map_or(0, |w| seen.saturating_sub(w));
                let mut scores = Vec::new();
                let mut max = f32::NEG_INFINITY;
                for t in first..seen {
                    let mut s = 0f32;
                    for d in 0..head_dim {
                        s += qh[d] * k[t * kvw + kvh * head_dim + d];
                    }
                    let s = s * scale;
                    if s > max {
                        max = s;
                    }
                    scores.push(s);
                }
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                let o = &mut out[r * qw + h * head_dim..][..head_dim];
                for (t, p) in (first..seen).zip(&scores) {
                    for d in 0..head_dim {
                        o[d] += *p * inv * v[t * kvw + kvh * head_dim + d];
                    }
                }
            }
        }
        out
    }

    /// Keys taken several at a time give the one-key order's bits, for
    /// every count of keys around the block's size, with and without a
    /// window; a changed key moves them (the comparison can fail).
    #[test]
    fn keys_side_by_side_give_the_one_key_bits() {
        // A width of 20 takes keys four at a time; 64 (SmolLM2's) sixteen
        // at a time where the CPU has the loop, then four, then one.
        for head_dim in [20, 64] {
            keys_side_by_side(Heads {
                n_head: 6,
                n_head_kv: 2,
                head_dim,
            });
        }
    }

    fn keys_side_by_side(heads: Heads) {
        let hd = heads.head_dim;
        let val = |i: usize, seed: u32| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32
                - 0.5
        };
        let (qw, kvw) = (6 * hd, 2 * hd);
        let counts = [(1, 0), (1, 3), (1, 4), (1, 8), (1, 13), (5, 0), (9, 6)];
        let more = [(1, 15), (1, 16), (1, 31), (1, 36), (4, 30), (2, 47)];
        for (n, start) in counts.into_iter().chain(more) {
            let ctx = start + n;
            let q: Vec<f32> = (0..n * qw).map(|i| val(i, 1) * 3.0).collect();
            let mut k: Vec<f32> = (0..ctx * kvw).map(|i| val(i, 2) * 3.0).collect();
            let v: Vec<f32> = (0..ctx * kvw).map(|i| val(i, 3)).collect();
            for window in [None, Some(3), Some(6), Some(17), Some(33)] {
                let got = attention_windowed(&q, n, start, &k, &v, heads, window);
                let want = one_key_at_a_time(&q, (n, start), (&k, &v), heads, window);
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "head_dim {hd} n {n} start {start} window {window:?}"
                );
            }
            // A changed key moves the output where it is one of two or more
            // (one key alone is softmaxed to 1 whatever it scores).
            if ctx >= 2 {
                let before = attention_windowed(&q, n, start, &k, &v, heads, None);
                k[0] += 0.25;
                let moved = attention_windowed(&q, n, start, &k, &v, heads, None);
                let want = one_key_at_a_time(&q, (n, start), (&k, &v), heads, None);
                assert_eq!(moved, want, "n {n} start {start}, the key changed");
                assert_ne!(
                    moved, before,
                    "n {n} start {start}: a key's change moved nothing"
                );
            }
        }
    }
}
