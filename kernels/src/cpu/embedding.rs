//! Token embedding lookup.

use super::qmatrix::WeightRows;
use super::Real;

/// Rows of `table` (`[vocab, n_embd]`) for `tokens`, as `T` (dequantized
/// when the table is held quantized). Ids are checked by the caller before
/// anything runs.
pub fn embed<T: Real, W: WeightRows>(table: &W, tokens: &[u32]) -> Vec<T> {
    let mut x = Vec::with_capacity(tokens.len() * table.cols());
    let mut buf = vec![0f32; table.cols()];
    for &t in tokens {
        let row = table.row_in(t as usize, &mut buf);
        x.extend(row.iter().map(|v| T::from_f32(*v)));
    }
    x
}
