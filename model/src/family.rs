//! A model family: how its decoder layer differs from llama's, the one seam
//! the forwards and the stage vocabulary read.

/// How a family's decoder differs from llama's: the one description of the
/// layer that the forwards and the stage vocabulary read. A new family is a
/// new constructor of this (one file beside [`crate::gemma3`]) and its
/// tensor names in the loader, not a copy of the forward.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFamily {
    /// Which dimensions of a head rotate together.
    pub rope: RopeStyle,
    /// RMSNorm of each query and key head (`q_norm`, `k_norm`) before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention output and of the FFN output before each
    /// residual add (`post_attn_norm`, `post_ffn_norm`).
    pub post_norms: bool,
    /// The gate's nonlinearity.
    pub ffn: FfnActivation,
    /// The embedding row is multiplied by `sqrt(n_embd)`.
    pub embed_scale: bool,
    /// Per layer: RoPE base and sliding window; empty means every layer uses
    /// the config's `rope_base` over the whole context.
    pub layers: Vec<LayerAttention>,
}

impl ModelFamily {
    /// Llama: interleaved-pair RoPE (GGUF's permuted Q/K), two norms per
    /// layer, SwiGLU, unscaled embedding, global attention everywhere.
    pub fn llama() -> ModelFamily {
        ModelFamily {
            rope: RopeStyle::Interleaved,
            qk_norm: false,
            post_norms: false,
            ffn: FfnActivation::Silu,
            embed_scale: false,
            layers: Vec::new(),
        }
    }

    /// The attention of layer `l` (its RoPE base and window).
    pub fn attention(&self, l: usize, rope_base: f32) -> LayerAttention {
        self.layers.get(l).copied().unwrap_or(LayerAttention {
            rope_base,
            window: None,
        })
    }
}

/// Which dimensions of a head rotate together in the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(2i, 2i + 1)`: llama.cpp's `LLAMA_ROPE_TYPE_NORM`, for which GGUF
    /// permutes llama's Q/K rows.
    Interleaved,
    /// `(i, i + head_dim / 2)`: `LLAMA_ROPE_TYPE_NEOX`, Hugging Face's
    /// `rotate_half`, with Q/K rows as the checkpoint has them.
    Halves,
}

/// The nonlinearity of the FFN's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// `silu(gate) * up` (stage `ffn_swiglu`).
    Silu,
    /// `gelu_tanh(gate) * up` (stage `ffn_geglu`).
    GeluTanh,
}

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerAttention {
    /// RoPE frequency base of this layer.
    pub rope_base: f32,
    /// A query at position `p` sees positions `p - window + 1 ..= p`;
    /// `None`: every earlier position.
    pub window: Option<usize>,
}
