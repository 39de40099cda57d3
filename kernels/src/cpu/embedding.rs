//! Token embedding lookup.

use super::matmul::Matrix;
use super::Real;

/// Rows of `table` (`[vocab, n_embd]`) for `tokens`, as `T`. Ids are checked
/// by the caller before anything runs.
pub fn embed<T: Real>(table: &Matrix, tokens: &[u32]) -> Vec<T> {
    let mut x = Vec::with_capacity(tokens.len() * table.cols);
    for &t in tokens {
        x.extend(table.row(t as usize).iter().map(|v| T::from_f32(*v)));
    }
    x
}
