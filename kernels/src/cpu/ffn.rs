//! The gated feed-forward's elementwise part: `silu(gate) * up` (SwiGLU,
//! llama) or `gelu_tanh(gate) * up` (GeGLU, Gemma).

use super::Real;
use model::FfnActivation;

/// [`swiglu`] or [`geglu`], as `act` says.
pub fn gated<T: Real>(act: FfnActivation, gate: &[T], up: &[T]) -> Vec<T> {
    match act {
        FfnActivation::Silu => swiglu(gate, up),
        FfnActivation::GeluTanh => geglu(gate, up),
    }
}

/// `gelu_tanh(g) * u` with PyTorch's `gelu(approximate="tanh")`:
/// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`.
pub fn geglu<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    let k = T::from_f64((2.0 / std::f64::consts::PI).sqrt());
    let c = T::from_f64(0.044715);
    let half = T::from_f64(0.5);
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            let g = *g;
            (half * g * (T::ONE + (k * (g + c * g * g * g)).tanh())) * *u
        })
        .collect()
}

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
    fn gelu_tanh_values() {
        let y = geglu(&[0.0f64, 1.0, -3.0, 10.0], &[5.0, 1.0, 1.0, 2.0]);
        assert_eq!(y[0], 0.0);
        // torch.nn.functional.gelu(torch.tensor(1.0, dtype=float64), approximate="tanh")
        assert!((y[1] - 0.8411919906082768).abs() < 1e-15, "{}", y[1]);
        assert!((y[2] + 0.0036373920817729943).abs() < 1e-15, "{}", y[2]);
        assert!((y[3] - 20.0).abs() < 1e-12);
    }

    #[test]
    fn silu_values() {
        let y = swiglu(&[0.0f64, 1.0, -1.0, 30.0], &[5.0, 2.0, 1.0, 1.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 2.0 / (1.0 + (-1f64).exp())).abs() < 1e-15);
        assert!((y[2] + 1.0 / (1.0 + 1f64.exp())).abs() < 1e-15);
        assert!((y[3] - 30.0).abs() < 1e-9);
    }
}
