//! What both CUDA forwards (one device, and tensor parallel) decide from
//! the model and the switches before uploading anything: the activations
//! each matmul family sees, and what a model must not have.

use crate::forward::{ForwardError, Precision};
use crate::switches::{ActPrecision, Family, Switches};
use model::ModelWeights;

/// Whether each matmul family sees int8 activations (shared with the
/// tensor-parallel forward).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acts {
    pub attn: bool,
    pub ffn_up: bool,
    pub ffn_down: bool,
    pub logits: bool,
}

impl Acts {
    /// Each family's activations as `switches` resolve them at `precision`.
    pub(crate) fn resolve(switches: &Switches, precision: Precision) -> Acts {
        let q8 = |f| switches.resolve(f, precision) == ActPrecision::Q8;
        Acts {
            attn: q8(Family::Attn),
            ffn_up: q8(Family::FfnUp),
            ffn_down: q8(Family::FfnDown),
            logits: q8(Family::Logits),
        }
    }
}

/// What the CUDA forwards (one device and tensor parallel) refuse in a
/// model, whatever the precision: a config the forward cannot run, q/k/v
/// biases, a family's extra norms missing from a layer.
pub(crate) fn check_model(weights: &ModelWeights) -> Result<(), ForwardError> {
    let c = &weights.config;
    crate::forward::check_config(c)?;
    if weights
        .layers
        .iter()
        .any(|l| l.bq.is_some() || l.bk.is_some() || l.bv.is_some())
    {
        return Err(ForwardError::Unsupported(
            "cuda: q/k/v projection biases (Qwen2) run on the cpu backend only".into(),
        ));
    }
    let fam = &c.family;
    if fam.qk_norm
        && weights
            .layers
            .iter()
            .any(|l| l.extra_norms.q_norm.is_none() || l.extra_norms.k_norm.is_none())
    {
        return Err(ForwardError::Unsupported(format!(
            "cuda: the {} family has q/k norms but a layer lacks their weights",
            c.arch
        )));
    }
    if fam.post_norms
        && weights.layers.iter().any(|l| {
            l.extra_norms.post_attn_norm.is_none() || l.extra_norms.post_ffn_norm.is_none()
        })
    {
        return Err(ForwardError::Unsupported(format!(
            "cuda: the {} family has post norms but a layer lacks their weights",
            c.arch
        )));
    }
    Ok(())
}

/// The capacity a sequence's KV cache grows to when it must hold `needed`
/// positions (both forwards): the next power of two, at least 64, never
/// past the model's context (unless `needed` is).
pub(crate) fn kv_capacity(c: &model::LlamaConfig, needed: usize) -> usize {
    needed
        .next_power_of_two()
        .max(64)
        .min(c.context_length.max(needed))
}
