//! The model as the forwards see it: hyperparameters and (possibly quantized)
//! weights, whatever file they came from.
//!
//! Conventions, shared by every loader and every forward:
//! - A matrix is row-major `[rows, cols]` = `[out_features, in_features]`, as
//!   GGUF stores it (`ne0 = cols`). `y = W x` dots each row with `x`.
//! - Q and K projection rows are in GGUF order (permuted for interleaved-pair
//!   RoPE: dimensions `(2i, 2i+1)` of a head rotate together). A loader of a
//!   Hugging Face checkpoint permutes its Q/K rows into this order.
//! - Quantized weights stay quantized here; a forward dequantizes what it needs.

use crate::family::ModelFamily;
use crate::quant::{dequantize_rows, GgmlType, QuantError};
use crate::TensorBytes;

/// A weight tensor, stored in its file's format.
#[derive(Debug, Clone)]
pub struct QTensor {
    /// The tensor's name in the file it came from.
    pub name: String,
    /// The block layout of `data`.
    pub ggml_type: GgmlType,
    /// Outermost first: `[rows, cols]` for a matrix, `[len]` for a vector.
    pub shape: Vec<usize>,
    /// Raw bytes in `ggml_type`'s block layout, rows contiguous: a slice of
    /// the GGUF file's map when loaded from one (shared, never copied).
    pub data: TensorBytes,
}

impl QTensor {
    /// Rows of the tensor: the product of every dim but the last (1 for a vector).
    pub fn rows(&self) -> usize {
        if self.shape.len() >= 2 {
            self.shape[..self.shape.len() - 1].iter().product()
        } else {
            1
        }
    }

    /// Elements per row: the last dim (0 for a scalar of no dims).
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&0)
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl QTensor {
    /// The raw bytes of row `row`.
    ///
    /// # Panics
    /// When `row >= self.rows()`.
    pub fn row_bytes(&self, row: usize) -> &[u8] {
        let n = self.ggml_type.row_bytes(self.cols());
        &self.data[row * n..(row + 1) * n]
    }

    /// The whole tensor as f32, row-major, dequantized in parallel over rows.
    pub fn to_f32(&self) -> Result<Vec<f32>, QuantError> {
        let mut out = vec![0f32; self.numel()];
        dequantize_rows(self.ggml_type, &self.data, self.cols(), &mut out)?;
        Ok(out)
    }
}

/// Hyperparameters of a decoder of the llama shape (Llama, SmolLM, Qwen2-like:
/// q/k/v biases are weights, [`LayerWeights::bq`]) or a family described by
/// [`ModelFamily`] (Gemma 3).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `general.architecture` of the source (`llama`).
    pub arch: String,
    /// Number of decoder layers.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads (fewer than `n_head` under grouped-query attention).
    pub n_head_kv: usize,
    /// Size of one head: `attention.key_length`, else `n_embd / n_head`.
    pub head_dim: usize,
    /// FFN inner size.
    pub n_ff: usize,
    /// Number of entries of the vocabulary (rows of the embedding and output).
    pub vocab_size: usize,
    /// RoPE frequency base of the layers the family does not override.
    pub rope_base: f32,
    /// The epsilon inside every RMSNorm's square root.
    pub rms_eps: f32,
    /// Maximum positions the model was trained for.
    pub context_length: usize,
    /// How the layers differ from llama's.
    pub family: ModelFamily,
}

/// The weights of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// RMSNorm weight before attention, `[n_embd]`.
    pub attn_norm: QTensor,
    /// Q projection, `[n_head * head_dim, n_embd]`, rows in interleaved RoPE order.
    pub wq: QTensor,
    /// K projection, `[n_head_kv * head_dim, n_embd]`, rows in interleaved RoPE order.
    pub wk: QTensor,
    /// V projection, `[n_head_kv * head_dim, n_embd]`.
    pub wv: QTensor,
    /// Attention output projection, `[n_embd, n_head * head_dim]`.
    pub wo: QTensor,
    /// RMSNorm weight before the FFN, `[n_embd]`.
    pub ffn_norm: QTensor,
    /// FFN gate projection, `[n_ff, n_embd]`.
    pub w_gate: QTensor,
    /// FFN up projection, `[n_ff, n_embd]`.
    pub w_up: QTensor,
    /// FFN down projection, `[n_embd, n_ff]`.
    pub w_down: QTensor,
    /// Q, K and V projection biases (Qwen2); `None` for Llama. Q and K in
    /// the same interleaved RoPE order as their weight rows.
    pub bq: Option<QTensor>,
    /// K projection bias (Qwen2), in the same order as `wk`'s rows.
    pub bk: Option<QTensor>,
    /// V projection bias (Qwen2).
    pub bv: Option<QTensor>,
    /// The norms a family adds to llama's two (see [`ModelFamily`]).
    pub extra_norms: ExtraNorms,
}

/// Norm weights beyond `attn_norm` and `ffn_norm`; `None` where the family
/// has no such norm.
#[derive(Debug, Clone, Default)]
pub struct ExtraNorms {
    /// `[head_dim]`, applied to every query head.
    pub q_norm: Option<QTensor>,
    /// `[head_dim]`, applied to every key head.
    pub k_norm: Option<QTensor>,
    /// `[n_embd]`, applied to the attention output before its residual add.
    pub post_attn_norm: Option<QTensor>,
    /// `[n_embd]`, applied to the FFN output before its residual add.
    pub post_ffn_norm: Option<QTensor>,
}

impl ExtraNorms {
    /// The norms present, in the order q, k, post-attention, post-FFN.
    pub fn iter(&self) -> impl Iterator<Item = &QTensor> {
        [
            &self.q_norm,
            &self.k_norm,
            &self.post_attn_norm,
            &self.post_ffn_norm,
        ]
        .into_iter()
        .flatten()
    }
}

/// All weights of a llama-architecture model.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// The hyperparameters the tensors' shapes were checked against.
    pub config: LlamaConfig,
    /// `[vocab, n_embd]`.
    pub token_embd: QTensor,
    /// The decoder layers, in forward order.
    pub layers: Vec<LayerWeights>,
    /// The final RMSNorm weight before the logits, `[n_embd]`.
    pub output_norm: QTensor,
    /// `[vocab, n_embd]`; `None` when the output is tied to `token_embd`.
    pub output: Option<QTensor>,
}

impl ModelWeights {
    /// The logits matrix: `output`, or the token embedding when tied.
    pub fn output_matrix(&self) -> &QTensor {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Every tensor, in the order llama.cpp writes them.
    pub fn tensors(&self) -> Vec<&QTensor> {
        let mut v = vec![&self.token_embd];
        for l in &self.layers {
            v.extend([
                &l.attn_norm,
                &l.wq,
                &l.wk,
                &l.wv,
                &l.wo,
                &l.ffn_norm,
                &l.w_gate,
                &l.w_up,
                &l.w_down,
            ]);
            v.extend([&l.bq, &l.bk, &l.bv].into_iter().flatten());
            v.extend(l.extra_norms.iter());
        }
        v.push(&self.output_norm);
        v.extend(self.output.as_ref());
        v
    }
}
