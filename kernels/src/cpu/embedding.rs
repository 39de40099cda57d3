//! Token embedding lookup.

use super::qmatrix::WeightRows;
use super::Real;

/// Rows of `table` (`[vocab, n_embd]`) for `tokens`, as `T` (dequantized
/// when the table is held quantized). Ids are checked by the caller before
/// anything runs.
pub fn embed<T: Real, W: WeightRows>(table: &W, tokens: &[u32]) -> Vec<T> {
    let _p = super::profile::op(super::profile::Op::Embed);
    let mut x = Vec::with_capacity(tokens.len() * table.cols());
    let mut buf = vec![0f32; table.cols()];
    for &t in tokens {
        let row = table.row_in(t as usize, &mut buf);
        x.extend(row.iter().map(|v| T::from_f32(*v)));
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
