//! RMSNorm: `y = x / sqrt(mean(x^2) + eps) * w`, row by row.

use super::Real;

/// Normalizes each row of `x` (`[n, w.len()]`) and scales it by `w`.
///
/// The sum of squares accumulates in f64 whatever `T` is, as ggml's
/// `rms_norm` does (`ggml_float`); the scale and products are in `T`.
/// Rows are independent: a prefill's rows run in parallel (see
/// `par_rows`), each in the same order as alone.
pub fn rms_norm<T: Real>(x: &[T], w: &[f32], eps: f32) -> Vec<T> {
    let _p = super::profile::op(super::profile::Op::Norm);
    let width = w.len();
    let mut y = vec![T::ZERO; x.len()];
    super::par_rows(&mut y, x, width, |row, out| norm_row(row, w, eps, out));
    y
}

/// One row of [`rms_norm`]: `out = row / sqrt(mean(row^2) + eps) * w`.
#[inline]
pub(crate) fn norm_row<T: Real>(row: &[T], w: &[f32], eps: f32, out: &mut [T]) {
    let sum: f64 = row.iter().map(|v| v.to_f64() * v.to_f64()).sum();
    let mean = T::from_f64(sum / w.len() as f64);
    let scale = T::ONE / (mean + T::from_f32(eps)).sqrt();
    for ((o, v), g) in out.iter_mut().zip(row).zip(w) {
        *o = (*v * scale) * T::from_f32(*g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rows_keep_their_shape() {
        // A row of equal values normalizes to ones (up to eps), then takes w.
        let x = [2.0f64; 4];
        let y = rms_norm(&x, &[1.0, 2.0, 3.0, 4.0], 0.0);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rows_are_independent() {
        let x = [3.0f32, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let y = rms_norm(&x, &[1.0; 4], 0.0);
        let r0 = 2.5f64; // sqrt((9 + 16) / 4)
        assert!((y[0] as f64 - 3.0 / r0).abs() < 1e-6);
        assert!((y[1] as f64 + 4.0 / r0).abs() < 1e-6);
        assert_eq!(&y[4..], &[1.0; 4]);
    }
}
