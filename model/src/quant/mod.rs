//! GGML tensor types, their block layouts, and dequantization to f32.
//!
//! Dequantization follows ggml's reference `dequantize_row_*` functions
//! operation for operation (f16 scales widened exactly, products formed in
//! the same order, no fused multiply-add), so the result is bit-identical to
//! ggml's and to the `gguf` Python package's `gguf.quants.dequantize`; a test
//! checks that on every tensor of the real model.

mod dequant;
mod ggml_type;
mod quantize;
#[cfg(test)]
mod tests;

pub use dequant::{dequantize, dequantize_rows};
pub use ggml_type::{GgmlType, QuantError};
pub use quantize::{encode_float, quantize_q4_1, quantize_q8_0, quantize_row_q8_k, BlockQ8K};
