//! One rank's weights on its device: the replicated ones whole (embedding,
//! norms; the output matrix on rank 0 only, which alone computes the
//! logits), and its shards of the matmuls, cut from the file's blocks as
//! [`crate::cpu::tp::shard`] cuts the CPU's prepared weights: output rows of
//! the column-parallel q/k/v and gate/up, block-aligned input columns of the
//! row-parallel o_proj and ffn_down.

use std::ops::Range;

use cudarc::driver::CudaSlice;

use crate::cpu::tp::plan::RankPlan;
use crate::cuda::device::Device;
use crate::cuda::ops::DeviceMatrix;
use crate::cuda::CudaError;
use model::{LayerWeights, ModelWeights, QTensor};

/// Rows `r` (output features) of the matrix `t`.
pub fn shard_rows(t: &QTensor, r: Range<usize>) -> QTensor {
    let rb = t.ggml_type.row_bytes(t.cols());
    QTensor {
        name: format!("{}[rows {}..{}]", t.name, r.start, r.end),
        ggml_type: t.ggml_type,
        shape: vec![r.len(), t.cols()],
        data: t.data.slice(r.start * rb..r.end * rb),
    }
}

/// Columns `c` (input features, whole blocks) of the matrix `t`: the same
/// span of blocks from every row.
pub fn shard_cols(t: &QTensor, c: Range<usize>) -> Result<QTensor, CudaError> {
    let (bs, ts) = (t.ggml_type.block_size(), t.ggml_type.type_size());
    if !c.start.is_multiple_of(bs) || !c.end.is_multiple_of(bs) {
        return Err(CudaError::Shape(format!(
            "{}: columns {}..{} are not whole blocks of {bs}",
            t.name, c.start, c.end
        )));
    }
    let rb = t.ggml_type.row_bytes(t.cols());
    let span = c.start / bs * ts..c.end / bs * ts;
    let bytes: Vec<u8> = t
        .data
        .chunks_exact(rb)
        .flat_map(|row| row[span.clone()].iter().copied())
        .collect();
    Ok(QTensor {
        name: format!("{}[cols {}..{}]", t.name, c.start, c.end),
        ggml_type: t.ggml_type,
        shape: vec![t.rows(), c.len()],
        data: bytes.into(),
    })
}

use crate::cuda::forward::norm_weight as norm;

/// One layer on one rank.
pub(super) struct RankLayer {
    pub attn_norm: CudaSlice<f32>,
    pub ffn_norm: CudaSlice<f32>,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub post_attn_norm: Option<CudaSlice<f32>>,
    pub post_ffn_norm: Option<CudaSlice<f32>>,
    /// The rank's query heads' rows.
    pub wq: DeviceMatrix,
    /// The rows of the KV heads it holds.
    pub wk: DeviceMatrix,
    pub wv: DeviceMatrix,
    /// The columns of its query heads.
    pub wo: DeviceMatrix,
    /// The rows of its FFN columns.
    pub w_gate: DeviceMatrix,
    pub w_up: DeviceMatrix,
    /// The columns of its FFN columns.
    pub w_down: DeviceMatrix,
}

impl RankLayer {
    fn upload(
        dev: &Device,
        l: &LayerWeights,
        p: &RankPlan,
        head_dim: usize,
    ) -> Result<RankLayer, CudaError> {
        let hd = |r: &Range<usize>| r.start * head_dim..r.end * head_dim;
        let m = |t: QTensor| DeviceMatrix::upload(dev, &t);
        let opt = |t: &Option<QTensor>| t.as_ref().map(|t| norm(dev, t)).transpose();
        let x = &l.extra_norms;
        Ok(RankLayer {
            attn_norm: norm(dev, &l.attn_norm)?,
            ffn_norm: norm(dev, &l.ffn_norm)?,
            q_norm: opt(&x.q_norm)?,
            k_norm: opt(&x.k_norm)?,
            post_attn_norm: opt(&x.post_attn_norm)?,
            post_ffn_norm: opt(&x.post_ffn_norm)?,
            wq: m(shard_rows(&l.wq, hd(&p.heads)))?,
            wk: m(shard_rows(&l.wk, hd(&p.kv_held)))?,
            wv: m(shard_rows(&l.wv, hd(&p.kv_held)))?,
            wo: m(shard_cols(&l.wo, hd(&p.heads))?)?,
            w_gate: m(shard_rows(&l.w_gate, p.ffn.clone()))?,
            w_up: m(shard_rows(&l.w_up, p.ffn.clone()))?,
            w_down: m(shard_cols(&l.w_down, p.ffn.clone())?)?,
        })
    }
}

/// Everything one rank reads.
pub(super) struct RankWeights {
    pub token_embd: DeviceMatrix,
    pub layers: Vec<RankLayer>,
    /// Rank 0 only: the final norm and the output matrix (`None` inside
    /// when tied to the embedding).
    pub head: Option<(CudaSlice<f32>, Option<DeviceMatrix>)>,
}

impl RankWeights {
    /// Uploads rank `rank`'s share (plan `p`) of `w` to `dev`.
    pub fn upload(
        dev: &Device,
        w: &ModelWeights,
        p: &RankPlan,
        rank: usize,
    ) -> Result<RankWeights, CudaError> {
        let hd = w.config.head_dim;
        let layers = w
            .layers
            .iter()
            .map(|l| RankLayer::upload(dev, l, p, hd))
            .collect::<Result<Vec<_>, _>>()?;
        let head = if rank == 0 {
            let out = w
                .output
                .as_ref()
                .map(|t| DeviceMatrix::upload(dev, t))
                .transpose()?;
            Some((norm(dev, &w.output_norm)?, out))
        } else {
            None
        };
        Ok(RankWeights {
            token_embd: DeviceMatrix::upload(dev, &w.token_embd)?,
            layers,
            head,
        })
    }

    /// The output matrix (rank 0).
    pub fn output(&self) -> Option<(&CudaSlice<f32>, &DeviceMatrix)> {
        self.head
            .as_ref()
            .map(|(n, o)| (n, o.as_ref().unwrap_or(&self.token_embd)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::quant::GgmlType;

    fn q8_matrix(rows: usize, cols: usize) -> QTensor {
        // Q8_0: per 32 values, an f16 scale and 32 int8 quants.
        let mut data = Vec::new();
        for r in 0..rows {
            for b in 0..cols / 32 {
                data.extend_from_slice(&half::f16::from_f32(0.5 + b as f32).to_le_bytes());
                data.extend((0..32).map(|i| ((r * 7 + b * 3 + i) % 11) as u8));
            }
        }
        QTensor {
            name: "w".into(),
            ggml_type: GgmlType::Q8_0,
            shape: vec![rows, cols],
            data: data.into(),
        }
    }

    #[test]
    fn shards_hold_the_values_of_their_rows_and_columns() {
        let t = q8_matrix(6, 96);
        let full = t.to_f32().unwrap();
        let rows = shard_rows(&t, 2..5).to_f32().unwrap();
        assert_eq!(rows, full[2 * 96..5 * 96]);
        let cols = shard_cols(&t, 32..96).unwrap().to_f32().unwrap();
        let want: Vec<f32> = full
            .chunks_exact(96)
            .flat_map(|r| r[32..96].iter().copied())
            .collect();
        assert_eq!(cols, want);
        let e = shard_cols(&t, 16..64).err().unwrap().to_string();
        assert!(e.contains("not whole blocks of 32"), "{e}");
    }
}
