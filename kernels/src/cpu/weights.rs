//! The model's weights as the CPU forward uses them: dequantized to f32 once,
//! at open, each matrix remembering its source block size for the q8 path.

use super::matmul::Matrix;
use crate::forward::ForwardError;
use crate::model::{ModelWeights, QTensor};
use crate::quant::GgmlType;

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

/// The tensor's values as f32.
pub fn dequantize(t: &QTensor) -> Result<Vec<f32>, ForwardError> {
    let n = t.numel();
    let expect = t.ggml_type.row_bytes(t.cols()) * t.rows();
    if t.data.len() != expect {
        return Err(ForwardError::Unsupported(format!(
            "{}: {} bytes of {} data, expected {expect} for shape {:?}",
            t.name,
            t.data.len(),
            t.ggml_type,
            t.shape
        )));
    }
    let out = match t.ggml_type {
        GgmlType::F32 => t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => t
            .data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        GgmlType::BF16 => t
            .data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(ForwardError::Unsupported(format!(
                "{}: no dequantization for {other} yet",
                t.name
            )))
        }
    };
    debug_assert_eq!(Vec::<f32>::len(&out), n);
    Ok(out)
}
