//! The model's weights as the CPU forward uses them: block-quantized matrices
//! kept in their GGUF blocks ([`QMatrix`], dequantized a few rows at a time
//! where read), float ones and norms as f32, each matrix remembering its
//! source block size for the q8 path.

use super::matmul::{matmul_with_mins, Act, Linear};
use super::qmatrix::{Matrix, QMatrix, Weight};
use super::Real;
use crate::forward::ForwardError;
use model::quant::GgmlType;
use model::{ModelWeights, QTensor};

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct DenseLayer {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Q projection (rows in interleaved RoPE order; bias for Qwen2).
    pub wq: Linear,
    /// K projection (rows in interleaved RoPE order; bias for Qwen2).
    pub wk: Linear,
    /// V projection (bias for Qwen2).
    pub wv: Linear,
    /// Attention output projection.
    pub wo: Linear,
    /// RMSNorm weight before the FFN.
    pub ffn_norm: Vec<f32>,
    /// FFN gate projection.
    pub w_gate: Linear,
    /// FFN up projection.
    pub w_up: Linear,
    /// FFN down projection.
    pub w_down: Linear,
    /// The family's extra norms (see [`model::ExtraNorms`]).
    pub q_norm: Option<Vec<f32>>,
    /// `[head_dim]`, applied to every key head.
    pub k_norm: Option<Vec<f32>>,
    /// `[n_embd]`, applied to the attention output before its residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    /// `[n_embd]`, applied to the FFN output before its residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// All weights, as the forward reads them.
#[derive(Debug, Clone)]
pub struct DenseWeights {
    /// The token embedding, `[vocab, n_embd]`, read a row per token.
    pub token_embd: Weight,
    /// The decoder layers, in forward order.
    pub layers: Vec<DenseLayer>,
    /// The final RMSNorm weight before the logits.
    pub output_norm: Vec<f32>,
    /// `None` when the output is tied to the embedding (see [`Self::logits`]).
    pub output: Option<Linear>,
}

impl DenseWeights {
    /// Prepares `w` for the CPU forward: block-quantized matrices kept in their
    /// blocks, the rest as f32; refuses a tensor whose shape or size the
    /// hyperparameters contradict.
    pub fn new(w: &ModelWeights) -> Result<DenseWeights, ForwardError> {
        let c = &w.config;
        let q_width = c.n_head * c.head_dim;
        let kv_width = c.n_head_kv * c.head_dim;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                let e = &l.extra_norms;
                let opt = |t: &Option<QTensor>, len: usize| {
                    t.as_ref().map(|t| vector(t, len)).transpose()
                };
                Ok(DenseLayer {
                    q_norm: opt(&e.q_norm, c.head_dim)?,
                    k_norm: opt(&e.k_norm, c.head_dim)?,
                    post_attn_norm: opt(&e.post_attn_norm, c.n_embd)?,
                    post_ffn_norm: opt(&e.post_ffn_norm, c.n_embd)?,
                    attn_norm: vector(&l.attn_norm, c.n_embd)?,
                    wq: biased(linear(&l.wq, q_width, c.n_embd)?, &l.bq, q_width)?,
                    wk: biased(linear(&l.wk, kv_width, c.n_embd)?, &l.bk, kv_width)?,
                    wv: biased(linear(&l.wv, kv_width, c.n_embd)?, &l.bv, kv_width)?,
                    wo: linear(&l.wo, c.n_embd, q_width)?,
                    ffn_norm: vector(&l.ffn_norm, c.n_embd)?,
                    w_gate: linear(&l.w_gate, c.n_ff, c.n_embd)?,
                    w_up: linear(&l.w_up, c.n_ff, c.n_embd)?,
                    w_down: linear(&l.w_down, c.n_embd, c.n_ff)?,
                })
            })
            .collect::<Result<Vec<_>, ForwardError>>()?;
        let token_embd = matrix(&w.token_embd, c.vocab_size, c.n_embd)?;
        let output = match &w.output {
            Some(o) => Some(linear(o, c.vocab_size, c.n_embd)?),
            None => None,
        };
        Ok(DenseWeights {
            token_embd,
            layers,
            output_norm: vector(&w.output_norm, c.n_embd)?,
            output,
        })
    }

    /// `x W^T` for `n` rows of `x`, through the output matrix: its own, or
    /// the embedding when tied (never copied: for SmolLM2 that is 30 MB of Q8_0).
    pub fn logits<T: Real>(&self, x: &[T], n: usize, act: Act) -> Vec<T> {
        match &self.output {
            Some(o) => o.apply(x, n, act),
            None => matmul_with_mins(x, n, &self.token_embd, None, act),
        }
    }

    /// Bytes held for weight matrices (norms and biases aside).
    pub fn resident_bytes(&self) -> usize {
        let lin = |l: &Linear| l.m.resident_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .into_iter()
                    .map(lin)
                    .sum::<usize>()
            })
            .sum();
        layers + self.token_embd.resident_bytes() + self.output.as_ref().map_or(0, lin)
    }
}

/// A matrix in its GGUF blocks when block-quantized, else as f32.
fn matrix(t: &QTensor, rows: usize, cols: usize) -> Result<Weight, ForwardError> {
    if t.rows() != rows || t.cols() != cols {
        return Err(ForwardError::Unsupported(format!(
            "{}: shape {:?}, expected [{rows}, {cols}] from the model's hyperparameters",
            t.name, t.shape
        )));
    }
    let block = t.ggml_type.block_size();
    if block > 1 {
        if t.data.len() != t.ggml_type.row_bytes(cols) * rows {
            return Err(ForwardError::Unsupported(format!(
                "{}: {} bytes, expected {} for {rows} rows of {cols} {}",
                t.name,
                t.data.len(),
                t.ggml_type.row_bytes(cols) * rows,
                t.ggml_type
            )));
        }
        return Ok(Weight::Quant(QMatrix {
            rows,
            cols,
            ty: t.ggml_type,
            bytes: t.data.clone(),
        }));
    }
    Ok(Weight::Dense(Matrix {
        rows,
        cols,
        data: dequantize(t)?,
        block,
    }))
}

fn linear(t: &QTensor, rows: usize, cols: usize) -> Result<Linear, ForwardError> {
    Ok(Linear {
        m: matrix(t, rows, cols)?,
        mins: (t.ggml_type == GgmlType::Q4_1).then(|| q4_1_mins(t)),
        bias: None,
    })
}

fn biased(mut l: Linear, bias: &Option<QTensor>, len: usize) -> Result<Linear, ForwardError> {
    l.bias = bias.as_ref().map(|b| vector(b, len)).transpose()?;
    Ok(l)
}

fn vector(t: &QTensor, len: usize) -> Result<Vec<f32>, ForwardError> {
    if t.numel() != len {
        return Err(ForwardError::Unsupported(format!(
            "{}: shape {:?}, expected [{len}]",
            t.name, t.shape
        )));
    }
    dequantize(t)
}

/// The tensor's values as f32 (dequantized in parallel over rows).
pub fn dequantize(t: &QTensor) -> Result<Vec<f32>, ForwardError> {
    t.to_f32()
        .map_err(|e| ForwardError::Unsupported(format!("{}: {e}", t.name)))
}

/// The per-block minimums of a Q4_1 tensor (`f16 d, f16 m, 16 bytes`), in
/// block order.
fn q4_1_mins(t: &QTensor) -> Vec<f32> {
    t.data
        .chunks_exact(GgmlType::Q4_1.type_size())
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect()
}
