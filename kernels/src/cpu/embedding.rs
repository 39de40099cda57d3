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

/// Multiplies embedding rows by `sqrt(n_embd)` (Gemma's scaled embedding),
/// the factor rounded to the activation type first, as Hugging Face's
/// `embed_scale` tensor is.
pub fn scale_embedding<T: Real>(x: &mut [T], n_embd: usize) {
    let scale = T::from_f64((n_embd as f64).sqrt());
    x.iter_mut().for_each(|v| *v = *v * scale);
}
