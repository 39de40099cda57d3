//! The SwiGLU feed-forward's elementwise part: `silu(gate) * up`.

use super::Real;

/// `silu(g) * u = g / (1 + exp(-g)) * u`, elementwise.
pub fn swiglu<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| (*g / (T::ONE + (-*g).exp())) * *u)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_values() {
        let y = swiglu(&[0.0f64, 1.0, -1.0, 30.0], &[5.0, 2.0, 1.0, 1.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 2.0 / (1.0 + (-1f64).exp())).abs() < 1e-15);
        assert!((y[2] + 1.0 / (1.0 + 1f64.exp())).abs() < 1e-15);
        assert!((y[3] - 30.0).abs() < 1e-9);
    }
}
