//! The model's weights as the CPU forward uses them: dequantized to f32 once,
//! at open, each matrix remembering its source block size for the q8 path.

use super::matmul::Matrix;
use crate::forward::ForwardError;
use crate::model::{ModelWeights, QTensor};

/// One decoder layer, dense.
#[derive(Debug, Clone)]
pub struct DenseLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

/// All weights, dense. The output matrix is a copy of the embedding when
/// tied: the forward never needs to know.
#[derive(Debug, Clone)]
pub struct DenseWeights {
    pub token_embd: Matrix,
    pub layers: Vec<DenseLayer>,
    pub output_norm: Vec<f32>,
    pub output: Matrix,
}

impl DenseWeights {
    pub fn new(w: &ModelWeights) -> Result<DenseWeights, ForwardError> {
        let c = &w.config;
        let q_width = c.n_head * c.head_dim;
        let kv_width = c.n_head_kv * c.head_dim;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(DenseLayer {
                    attn_norm: vector(&l.attn_norm, c.n_embd)?,
                    wq: matrix(&l.wq, q_width, c.n_embd)?,
                    wk: matrix(&l.wk, kv_width, c.n_embd)?,
                    wv: matrix(&l.wv, kv_width, c.n_embd)?,
                    wo: matrix(&l.wo, c.n_embd, q_width)?,
                    ffn_norm: vector(&l.ffn_norm, c.n_embd)?,
                    w_gate: matrix(&l.w_gate, c.n_ff, c.n_embd)?,
                    w_up: matrix(&l.w_up, c.n_ff, c.n_embd)?,
                    w_down: matrix(&l.w_down, c.n_embd, c.n_ff)?,
                })
            })
            .collect::<Result<Vec<_>, ForwardError>>()?;
        let token_embd = matrix(&w.token_embd, c.vocab_size, c.n_embd)?;
        let output = match &w.output {
            Some(o) => matrix(o, c.vocab_size, c.n_embd)?,
            None => token_embd.clone(),
        };
        Ok(DenseWeights {
            token_embd,
            layers,
            output_norm: vector(&w.output_norm, c.n_embd)?,
            output,
        })
    }
}

fn matrix(t: &QTensor, rows: usize, cols: usize) -> Result<Matrix, ForwardError> {
    if t.rows() != rows || t.cols() != cols {
        return Err(ForwardError::Unsupported(format!(
            "{}: shape {:?}, expected [{rows}, {cols}] from the model's hyperparameters",
            t.name, t.shape
        )));
    }
    Ok(Matrix {
        rows,
        cols,
        data: dequantize(t)?,
        block: t.ggml_type.block_size(),
    })
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
