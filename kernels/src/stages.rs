//! The stage vocabulary, in forward order, with each stage's inputs: llama's
//! ([`llama`]), and the one a [`ModelFamily`] implies ([`for_family`]: Gemma
//! 3 adds `q_norm`, `k_norm`, `post_attn_norm`, `post_ffn_norm` and gates with
//! `ffn_geglu`). The CPU and CUDA forwards tap exactly these names.

use capture::StageSpec;

use model::{FfnActivation, LlamaConfig, ModelFamily};

/// The token embedding row (scaled by `sqrt(n_embd)` where the family says so).
pub const EMBEDDING: &str = "embedding";
/// RMSNorm before attention.
pub const ATTN_NORM: &str = "attn_norm";
/// The Q projection (plus bias where the model has one).
pub const Q_PROJ: &str = "q_proj";
/// The K projection (plus bias where the model has one).
pub const K_PROJ: &str = "k_proj";
/// The V projection (plus bias where the model has one).
pub const V_PROJ: &str = "v_proj";
/// Q after the rotary embedding.
pub const Q_ROPE: &str = "q_rope";
/// K after the rotary embedding (what the KV cache holds).
pub const K_ROPE: &str = "k_rope";
/// `softmax(QKᵀ / sqrt(d)) V`, before `o_proj`.
pub const ATTN: &str = "attn";
/// The attention output projection.
pub const O_PROJ: &str = "o_proj";
/// The residual stream after adding the attention's output.
pub const POST_ATTN_RESIDUAL: &str = "post_attn_residual";
/// RMSNorm before the FFN.
pub const FFN_NORM: &str = "ffn_norm";
/// The FFN gate projection.
pub const FFN_GATE: &str = "ffn_gate";
/// The FFN up projection.
pub const FFN_UP: &str = "ffn_up";
/// `silu(gate) * up` (llama).
pub const FFN_SWIGLU: &str = "ffn_swiglu";
/// `gelu_tanh(gate) * up` (Gemma 3).
pub const FFN_GEGLU: &str = "ffn_geglu";
/// RMSNorm of each query head (Gemma 3).
pub const Q_NORM: &str = "q_norm";
/// RMSNorm of each key head (Gemma 3).
pub const K_NORM: &str = "k_norm";
/// RMSNorm of the attention output before its residual add (Gemma 3).
pub const POST_ATTN_NORM: &str = "post_attn_norm";
/// RMSNorm of the FFN output before its residual add (Gemma 3).
pub const POST_FFN_NORM: &str = "post_ffn_norm";
/// The FFN down projection.
pub const FFN_DOWN: &str = "ffn_down";
/// The residual stream after adding the FFN's output (the layer's output).
pub const POST_FFN_RESIDUAL: &str = "post_ffn_residual";
/// RMSNorm after the last layer.
pub const FINAL_NORM: &str = "final_norm";
/// The output matmul: one score per vocabulary entry.
pub const LOGITS: &str = "logits";

/// The vocabulary written into every manifest by the llama forwards.
///
/// Every tap is `[rows, width]` with axis 0 = positions. `attn` is
/// softmax(QK^T)V before `o_proj`; its inputs include the K/V of earlier
/// positions, which live in the same stages' earlier taps.
pub fn llama() -> Vec<StageSpec> {
    for_family(&ModelFamily::llama())
}

/// Every stage any family's forward taps, each name once, in a forward
/// order: what a selection can name before the model is known.
pub fn every_family() -> Vec<StageSpec> {
    let mut all = llama();
    for spec in for_family(&model::gemma3::family(6, 1e6, 512)) {
        if !all.iter().any(|s| s.name == spec.name) {
            all.push(spec);
        }
    }
    all
}

/// The vocabulary of the model `config` describes.
pub fn for_config(config: &LlamaConfig) -> Vec<StageSpec> {
    for_family(&config.family)
}

/// The stage of the gated FFN product, named for its nonlinearity.
pub fn gated_stage(ffn: FfnActivation) -> &'static str {
    match ffn {
        FfnActivation::Silu => FFN_SWIGLU,
        FfnActivation::GeluTanh => FFN_GEGLU,
    }
}

/// The vocabulary of a family: llama's, with a family's extra norms inserted
/// where they run and its gate's stage named for its nonlinearity.
pub fn for_family(f: &ModelFamily) -> Vec<StageSpec> {
    let gated = gated_stage(f.ffn);
    let (q_in, k_in) = if f.qk_norm {
        (Q_NORM, K_NORM)
    } else {
        (Q_PROJ, K_PROJ)
    };
    let attn_out = if f.post_norms { POST_ATTN_NORM } else { O_PROJ };
    let ffn_out = if f.post_norms {
        POST_FFN_NORM
    } else {
        FFN_DOWN
    };
    let mut v = vec![
        StageSpec::global(EMBEDDING, &[]),
        StageSpec::layer(ATTN_NORM, &["post_ffn_residual@prev"])
            .with_first_layer_inputs(&[EMBEDDING]),
        StageSpec::layer(Q_PROJ, &[ATTN_NORM]),
        StageSpec::layer(K_PROJ, &[ATTN_NORM]),
        StageSpec::layer(V_PROJ, &[ATTN_NORM]),
    ];
    if f.qk_norm {
        v.push(StageSpec::layer(Q_NORM, &[Q_PROJ]));
        v.push(StageSpec::layer(K_NORM, &[K_PROJ]));
    }
    v.extend([
        StageSpec::layer(Q_ROPE, &[q_in]),
        StageSpec::layer(K_ROPE, &[k_in]),
        StageSpec::layer(ATTN, &[Q_ROPE, K_ROPE, V_PROJ]),
        StageSpec::layer(O_PROJ, &[ATTN]),
    ]);
    if f.post_norms {
        v.push(StageSpec::layer(POST_ATTN_NORM, &[O_PROJ]));
    }
    v.extend([
        StageSpec::layer(POST_ATTN_RESIDUAL, &[attn_out, "post_ffn_residual@prev"])
            .with_first_layer_inputs(&[attn_out, EMBEDDING]),
        StageSpec::layer(FFN_NORM, &[POST_ATTN_RESIDUAL]),
        StageSpec::layer(FFN_GATE, &[FFN_NORM]),
        StageSpec::layer(FFN_UP, &[FFN_NORM]),
        StageSpec::layer(gated, &[FFN_GATE, FFN_UP]),
        StageSpec::layer(FFN_DOWN, &[gated]),
    ]);
    if f.post_norms {
        v.push(StageSpec::layer(POST_FFN_NORM, &[FFN_DOWN]));
    }
    v.extend([
        StageSpec::layer(POST_FFN_RESIDUAL, &[ffn_out, POST_ATTN_RESIDUAL]),
        StageSpec::global(FINAL_NORM, &["post_ffn_residual@last"]),
        StageSpec::global(LOGITS, &[FINAL_NORM]),
    ]);
    v
}
