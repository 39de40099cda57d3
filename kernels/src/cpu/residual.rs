//! The residual add: `x += y`, elementwise, in the activation type.

use super::Real;

/// Adds `y` to `x` in place (`post_attn_residual`, `post_ffn_residual`).
pub fn add_residual<T: Real>(x: &mut [T], y: &[T]) {
    debug_assert_eq!(x.len(), y.len());
    let _p = super::profile::op(super::profile::Op::Residual);
    for (xi, yi) in x.iter_mut().zip(y) {
        *xi += *yi;
    }
}
