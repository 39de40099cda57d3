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
    match style {
        RopeStyle::Interleaved => rope(x, width, start, head_dim, base),
        RopeStyle::Halves => rope_halves(x, width, start, head_dim, base),
    }
}

/// `base^(-2i / head_dim)` for each rotating pair `i`, in f64.
fn inv_freq(head_dim: usize, base: f32) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| (base as f64).powf(-2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// The cosines and sines of row `pos`, computed in f64 and rounded to `T`
/// once.
fn angles<T: Real>(pos: usize, inv_freq: &[f64], cs: &mut [(T, T)]) {
    for (c, f) in cs.iter_mut().zip(inv_freq) {
        let theta = pos as f64 * f;
        *c = (T::from_f64(theta.cos()), T::from_f64(theta.sin()));
    }
}

/// Rotates `x` as [`rope`] does, pairing dimension `i` with `i + head_dim/2`.
pub fn rope_halves<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    let half = head_dim / 2;
    let inv_freq = inv_freq(head_dim, base);
    let mut cs = vec![(T::ZERO, T::ZERO); half];
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        angles(start + r, &inv_freq, &mut cs);
        for head in row.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
            for ((a, b), (c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(&cs) {
                let (x0, x1) = (*a, *b);
                *a = x0 * *c - x1 * *s;
                *b = x1 * *c + x0 * *s;
            }
        }
    }
}

/// Rotates `x` (`[n, width]`, `width` a multiple of `head_dim`, row `r` at
/// position `start + r`) in place. Angles, cosines and sines are computed in
/// f64 and rounded to `T` once, so the f32 forward carries no error from the
/// angle itself.
pub fn rope<T: Real>(x: &mut [T], width: usize, start: usize, head_dim: usize, base: f32) {
    let inv_freq = inv_freq(head_dim, base);
    let mut cs = vec![(T::ZERO, T::ZERO); head_dim / 2];
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        angles(start + r, &inv_freq, &mut cs);
        for head in row.chunks_exact_mut(head_dim) {
            for (i, (c, s)) in cs.iter().enumerate() {
                let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = x0 * *c - x1 * *s;
                head[2 * i + 1] = x0 * *s + x1 * *c;
            }
        }
    }
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
