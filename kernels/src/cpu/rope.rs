//! Rotary position embedding. Interleaved pairs ([`rope`]): dimensions
//! `(2i, 2i+1)` of each head rotate together by `pos * base^(-2i / head_dim)`;
//! GGUF's llama Q/K rows are permuted for exactly this layout (llama.cpp's
//! `LLAMA_ROPE_TYPE_NORM`). Halves ([`rope_halves`]): dimensions
//! `(i, i + head_dim/2)` rotate by the same angle (`LLAMA_ROPE_TYPE_NEOX`,
//! Hugging Face's `rotate_half`), as Gemma 3 has them.

use super::Real;
use model::RopeStyle;

/// [`rope`] or [`rope_halves`], as `style` says.
pub fn rope_styled<T: Real>(
    style: RopeStyle,
    x: &mut [T],
    width: usize,
    start: usize,
    head_dim: usize,
    base: f32,
) {
    let table = RopeTable::new(start, x.len() / width, head_dim, base);
    rope_with(style, x, width, &table);
}

/// The cosines and sines of rows `start..start + n` for one `head_dim` and
/// base, computed in f64 and rounded to `T` once: built once per forward and
/// base, and shared by q and k of every layer.
#[derive(Debug, Clone)]
pub struct RopeTable<T> {
    start: usize,
    base: f32,
    half: usize,
    /// `[n, head_dim / 2]`.
    cs: Vec<(T, T)>,
}

impl<T: Real> RopeTable<T> {
    /// cos and sin of every rotation angle for positions `start..start + n`
    /// (angles in f64, rounded once to `T`).
    pub fn new(start: usize, n: usize, head_dim: usize, base: f32) -> RopeTable<T> {
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        let mut cs = Vec::with_capacity(n * half);
        for pos in start..start + n {
            cs.extend(inv_freq.iter().map(|f| {
                let theta = pos as f64 * f;
                (T::from_f64(theta.cos()), T::from_f64(theta.sin()))
            }));
        }
        RopeTable {
            start,
            base,
            half,
            cs,
        }
    }

    /// Whether this table serves rows from `start` at `base`.
    pub fn fits(&self, start: usize, base: f32) -> bool {
        self.start == start && self.base.to_bits() == base.to_bits()
    }

    fn row(&self, r: usize) -> &[(T, T)] {
        &self.cs[r * self.half..(r + 1) * self.half]
    }
}

/// Rotates `x` (`[n, width]`, rows from the table's start) with `table`,
/// pairing dimensions as `style` says.
pub fn rope_with<T: Real>(style: RopeStyle, x: &mut [T], width: usize, table: &RopeTable<T>) {
    let _p = super::profile::op(super::profile::Op::Rope);
    let rotate = |(r, row): (usize, &mut [T])| rotate_row(style, row, table.row(r));
    // Rows are independent: a prefill's run in parallel.
    if super::par::worth(x.len(), x.len() / width.max(1)) {
        super::par::chunks_map(x, width, |r, row| rotate((r, row)));
    } else {
        x.chunks_mut(width).enumerate().for_each(rotate);
    }
}

/// [`rope_with`] of `q` (`[n, q_width]`) and `k` (`[n, kv_width]`) at once:
/// one parallel region over the rows (each row of each the same rotation).
pub fn rope_pair_with<T: Real>(
    style: RopeStyle,
    q: &mut [T],
    q_width: usize,
    k: &mut [T],
    kv_width: usize,
    table: &RopeTable<T>,
) {
    let _p = super::profile::op(super::profile::Op::Rope);
    let rotate = |r: usize, qr: &mut [T], kr: &mut [T]| {
        rotate_row(style, qr, table.row(r));
        rotate_row(style, kr, table.row(r));
    };
    if super::par::worth(q.len() + k.len(), q.len() / q_width.max(1)) {
        super::par::chunks2_map(q, q_width, k, kv_width, rotate);
    } else {
        q.chunks_mut(q_width)
            .zip(k.chunks_mut(kv_width))
            .enumerate()
            .for_each(|(r, (qr, kr))| rotate(r, qr, kr));
    }
}

/// Rotates every head of one row by the row's cosines and sines.
#[inline]
fn rotate_row<T: Real>(style: RopeStyle, row: &mut [T], cs: &[(T, T)]) {
    let half = cs.len();
    for head in row.chunks_exact_mut(2 * half) {
        match style {
            RopeStyle::Interleaved => {
                for (i, (c, s)) in cs.iter().enumerate() {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * *c - x1 * *s;
                    head[2 * i + 1] = x0 * *s + x1 * *c;
                }
            }
            RopeStyle::Halves => {
                let (lo, hi) = head.split_at_mut(half);
                for ((a, b), (c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(cs) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * *c - x1 * *s;
                    *b = x1 * *c + x0 * *s;
                }
            }
        }
    }
}

/// Rotates `x` as [`rope`] does, pairing dimension `i` with `i + head_dim/2`.
pub fn rope_halves<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    rope_styled(RopeStyle::Halves, x, width, start, head_dim, base);
}

/// Rotates `x` (`[n, width]`, `width` a multiple of `head_dim`, row `r` at
/// position `start + r`) in place. Angles, cosines and sines are computed in
/// f64 and rounded to `T` once, so the f32 forward carries no error from the
/// angle itself.
pub fn rope<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    rope_styled(RopeStyle::Interleaved, x, width, start, head_dim, base);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_pair_i_with_i_plus_half() {
        // head_dim 4: (x0, x2) turn by pos, (x1, x3) by pos / base^(1/2).
        let mut x = vec![1.0f64, 1.0, 0.0, 0.0];
        rope_halves(&mut x, 4, 1, 4, 100.0);
        assert!((x[0] - 1f64.cos()).abs() < 1e-15 && (x[2] - 1f64.sin()).abs() < 1e-15);
        assert!((x[1] - 0.1f64.cos()).abs() < 1e-15 && (x[3] - 0.1f64.sin()).abs() < 1e-15);
        // The interleaved layout of the same numbers differs.
        let mut y = vec![1.0f64, 1.0, 0.0, 0.0];
        rope(&mut y, 4, 1, 4, 100.0);
        assert_ne!(x, y);
    }

    #[test]
    fn position_zero_is_identity() {
        let mut x = vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        rope(&mut x, 8, 0, 4, 10000.0);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn pairs_rotate_by_their_frequency() {
        // head_dim 4: pair 0 turns by pos, pair 1 by pos / base^(1/2).
        let mut x = vec![1.0f64, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        rope(&mut x, 4, 1, 4, 100.0);
        assert!((x[0] - 1f64.cos()).abs() < 1e-15 && (x[1] - 1f64.sin()).abs() < 1e-15);
        assert!((x[2] - 0.1f64.cos()).abs() < 1e-15 && (x[3] - 0.1f64.sin()).abs() < 1e-15);
        // Second row is position 2.
        assert!((x[4] - 2f64.cos()).abs() < 1e-15);
        // Rotation keeps the norm of every pair.
        assert!((x[6] * x[6] + x[7] * x[7] - 1.0).abs() < 1e-15);
    }
}
