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
    elementwise(gate, up, gelu_mul)
}

#[inline(always)]
fn gelu_mul<T: Real>(g: T, u: T) -> T {
    let k = T::from_f64((2.0 / std::f64::consts::PI).sqrt());
    let c = T::from_f64(0.044715);
    let half = T::from_f64(0.5);
    (half * g * (T::ONE + (k * (g + c * g * g * g)).tanh())) * u
}

#[inline(always)]
fn silu_mul<T: Real>(g: T, u: T) -> T {
    (g / (T::ONE + (-g).exp())) * u
}

/// [`gated`] of one row into `out`, element by element as [`gated`] computes it.
#[inline]
pub(crate) fn gated_into<T: Real>(act: FfnActivation, gate: &[T], up: &[T], out: &mut [T]) {
    let pairs = out.iter_mut().zip(gate).zip(up);
    match act {
        FfnActivation::Silu => pairs.for_each(|((o, g), u)| *o = silu_mul(*g, *u)),
        FfnActivation::GeluTanh => pairs.for_each(|((o, g), u)| *o = gelu_mul(*g, *u)),
    }
}

/// `f(g, u)` for each pair, in parallel over blocks of elements when there
/// are many (a prefill): every element is its own expression, so the split
/// changes no bit.
fn elementwise<T: Real>(gate: &[T], up: &[T], f: impl Fn(T, T) -> T + Sync) -> Vec<T> {
    const BLOCK: usize = 4096;
    let _p = super::profile::op(super::profile::Op::Gated);
    let mut y = vec![T::ZERO; gate.len()];
    let body = |o: &mut [T], g: &[T], u: &[T]| {
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = f(*g, *u);
        }
    };
    let blocks = gate.len().div_ceil(BLOCK);
    if super::par::worth(gate.len(), blocks) {
        let py = super::par::Ptr(y.as_mut_ptr());
        super::par::for_each(blocks, &|b| {
            let (lo, hi) = (b * BLOCK, ((b + 1) * BLOCK).min(gate.len()));
            // SAFETY: block b of `y` (in bounds), which task b alone writes.
            let o = unsafe { std::slice::from_raw_parts_mut(py.at(lo), hi - lo) };
            body(o, &gate[lo..hi], &up[lo..hi]);
        });
    } else {
        body(&mut y, gate, up);
    }
    y
}

/// `silu(g) * u = g / (1 + exp(-g)) * u`, elementwise.
pub fn swiglu<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    elementwise(gate, up, silu_mul)
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
