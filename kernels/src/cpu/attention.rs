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
        n_head,
        n_head_kv,
        head_dim,
    } = heads;
    let q_width = n_head * head_dim;
    let kv_width = n_head_kv * head_dim;
    let group = n_head / n_head_kv;
    let scale = T::from_f64(1.0 / (head_dim as f64).sqrt());
    let _p = super::profile::op(super::profile::Op::Attention);
    let mut tasks = vec![(); n * n_head];
    let (out, _) = super::par::chunks_fresh_map(&mut tasks, 1, head_dim, |i, _, o: &mut [T]| {
        let mut scores = Vec::with_capacity(start + n);
        let (r, h) = (i / n_head, i % n_head);
        let kvh = h / group;
        let qh = &q[r * q_width + h * head_dim..][..head_dim];
        let seen = start + r + 1;
        let first = window.map_or(0, |w| seen.saturating_sub(w));
        let mut max = T::from_f64(f64::NEG_INFINITY);
        for t in first..seen {
            let kh = &k[t * kv_width + kvh * head_dim..][..head_dim];
            let mut s = T::ZERO;
            for (a, b) in qh.iter().zip(kh) {
                s += *a * *b;
            }
            let s = s * scale;
            if s > max {
                max = s;
            }
            scores.push(s);
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
    });
    out
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
}
