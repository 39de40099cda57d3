//! Gemma 3 as a [`ModelFamily`]: what its layers add to llama's, read from
//! the GGUF's `gemma3.*` metadata and the constants llama.cpp and Hugging
//! Face's `Gemma3TextConfig` fix for the family.
//!
//! - RoPE over halves of each head (`LLAMA_ROPE_TYPE_NEOX`; GGUF keeps the
//!   checkpoint's Q/K rows as they are).
//! - RMSNorm of every query and key head before RoPE, and of the attention
//!   and FFN outputs before their residual adds: four norms per layer.
//! - `gelu_tanh(gate) * up`, an embedding scaled by `sqrt(n_embd)`.
//! - Sliding-window attention (`gemma3.attention.sliding_window`, 512) with
//!   RoPE base 10,000 on five layers of every six; global attention with the
//!   file's `gemma3.rope.freq_base` (1e6) on every sixth (layers 5, 11, 17).
//! - Queries scaled by `query_pre_attn_scalar^-1/2` with the scalar equal to
//!   the head size (256 for the 270M model), i.e. the llama scaling.
//! - Norm weights: llama.cpp's converter stores Gemma's `1 + w` in the GGUF
//!   (Hugging Face's `Gemma3RMSNorm` multiplies by `1 + w`, and its GGUF
//!   loader subtracts the 1 again), so the GGUF value is the multiplier, as
//!   for llama.

use crate::family::{FfnActivation, LayerAttention, ModelFamily, RopeStyle};

/// The RoPE base of the sliding-window layers (Hugging Face's
/// `rope_local_base_freq`; not in the GGUF).
pub const ROPE_BASE_LOCAL: f32 = 10_000.0;
/// Every sixth layer is global (`sliding_window_pattern`).
pub const GLOBAL_EVERY: usize = 6;

/// Whether layer `l` attends globally.
pub fn is_global(l: usize) -> bool {
    (l + 1).is_multiple_of(GLOBAL_EVERY)
}

/// Gemma 3's layer description for `n_layer` layers.
pub fn family(n_layer: usize, rope_base_global: f32, sliding_window: usize) -> ModelFamily {
    let layers = (0..n_layer)
        .map(|l| {
            if is_global(l) {
                LayerAttention {
                    rope_base: rope_base_global,
                    window: None,
                }
            } else {
                LayerAttention {
                    rope_base: ROPE_BASE_LOCAL,
                    window: Some(sliding_window),
                }
            }
        })
        .collect();
    ModelFamily {
        rope: RopeStyle::Halves,
        qk_norm: true,
        post_norms: true,
        ffn: FfnActivation::GeluTanh,
        embed_scale: true,
        layers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sixth_layer_is_global_with_the_file_base() {
        let f = family(18, 1e6, 512);
        let global: Vec<usize> = (0..18).filter(|&l| f.layers[l].window.is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(f.attention(5, 1e6).rope_base, 1e6);
        assert_eq!(f.attention(0, 1e6).rope_base, 1e4);
        assert_eq!(f.attention(4, 1e6).window, Some(512));
    }
}
