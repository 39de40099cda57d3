use std::path::Path;

use super::error::LoadError;
use crate::weights::{ExtraNorms, LayerWeights, LlamaConfig, ModelWeights, QTensor};

/// Builds [`ModelWeights`] from tensors looked up by their GGUF names,
/// checking every shape against `config`.
pub(super) fn assemble(
    config: LlamaConfig,
    path: &Path,
    has_output: bool,
    mut lookup: impl FnMut(&str) -> Option<QTensor>,
) -> Result<ModelWeights, LoadError> {
    let c = &config;
    let q_dim = c.n_head * c.head_dim;
    let kv_dim = c.n_head_kv * c.head_dim;
    // A tensor of `expected` shape; an absent optional one is `None`.
    let mut find = |name: &str, expected: &[usize], required: bool| {
        let Some(t) = lookup(name) else {
            return match required {
                true => Err(LoadError::MissingTensor {
                    path: path.into(),
                    tensor: name.into(),
                }),
                false => Ok(None),
            };
        };
        if t.shape != expected {
            return Err(LoadError::Shape {
                path: path.into(),
                tensor: name.into(),
                expected: expected.to_vec(),
                got: t.shape,
            });
        }
        Ok(Some(t))
    };
    let required = |t: Option<QTensor>| t.expect("a required tensor is Some or an error");
    let mut layers = Vec::with_capacity(c.n_layer);
    for i in 0..c.n_layer {
        let mut t = |n: &str, shape: &[usize]| {
            find(&format!("blk.{i}.{n}.weight"), shape, true).map(required)
        };
        let f = &c.family;
        let extra_norms = ExtraNorms {
            q_norm: f
                .qk_norm
                .then(|| t("attn_q_norm", &[c.head_dim]))
                .transpose()?,
            k_norm: f
                .qk_norm
                .then(|| t("attn_k_norm", &[c.head_dim]))
                .transpose()?,
            post_attn_norm: f
                .post_norms
                .then(|| t("post_attention_norm", &[c.n_embd]))
                .transpose()?,
            post_ffn_norm: f
                .post_norms
                .then(|| t("post_ffw_norm", &[c.n_embd]))
                .transpose()?,
        };
        layers.push(LayerWeights {
            extra_norms,
            attn_norm: t("attn_norm", &[c.n_embd])?,
            wq: t("attn_q", &[q_dim, c.n_embd])?,
            wk: t("attn_k", &[kv_dim, c.n_embd])?,
            wv: t("attn_v", &[kv_dim, c.n_embd])?,
            wo: t("attn_output", &[c.n_embd, q_dim])?,
            ffn_norm: t("ffn_norm", &[c.n_embd])?,
            w_gate: t("ffn_gate", &[c.n_ff, c.n_embd])?,
            w_up: t("ffn_up", &[c.n_ff, c.n_embd])?,
            w_down: t("ffn_down", &[c.n_embd, c.n_ff])?,
            bq: None,
            bk: None,
            bv: None,
        });
        // Biases are optional (Qwen2 has them, Llama not); a present one has
        // its projection's width.
        let l = layers.last_mut().expect("just pushed");
        for (field, name, len) in [
            (&mut l.bq, "attn_q", q_dim),
            (&mut l.bk, "attn_k", kv_dim),
            (&mut l.bv, "attn_v", kv_dim),
        ] {
            *field = find(&format!("blk.{i}.{name}.bias"), &[len], false)?;
        }
    }
    let output = if has_output {
        Some(find("output.weight", &[c.vocab_size, c.n_embd], true).map(required)?)
    } else {
        None
    };
    Ok(ModelWeights {
        token_embd: find("token_embd.weight", &[c.vocab_size, c.n_embd], true).map(required)?,
        layers,
        output_norm: find("output_norm.weight", &[c.n_embd], true).map(required)?,
        output,
        config,
    })
}
