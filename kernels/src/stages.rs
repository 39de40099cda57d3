//! The llama-family stage vocabulary, in forward order, with each stage's
//! inputs. The CPU and CUDA forwards tap exactly these names.

use capture::StageSpec;

pub const EMBEDDING: &str = "embedding";
pub const ATTN_NORM: &str = "attn_norm";
pub const Q_PROJ: &str = "q_proj";
pub const K_PROJ: &str = "k_proj";
pub const V_PROJ: &str = "v_proj";
pub const Q_ROPE: &str = "q_rope";
pub const K_ROPE: &str = "k_rope";
pub const ATTN: &str = "attn";
pub const O_PROJ: &str = "o_proj";
pub const POST_ATTN_RESIDUAL: &str = "post_attn_residual";
pub const FFN_NORM: &str = "ffn_norm";
pub const FFN_GATE: &str = "ffn_gate";
pub const FFN_UP: &str = "ffn_up";
pub const FFN_SWIGLU: &str = "ffn_swiglu";
pub const FFN_DOWN: &str = "ffn_down";
pub const POST_FFN_RESIDUAL: &str = "post_ffn_residual";
pub const FINAL_NORM: &str = "final_norm";
pub const LOGITS: &str = "logits";

/// The vocabulary written into every manifest by the llama forwards.
///
/// Every tap is `[rows, width]` with axis 0 = positions. `attn` is
/// softmax(QK^T)V before `o_proj`; its inputs include the K/V of earlier
/// positions, which live in the same stages' earlier taps.
pub fn llama() -> Vec<StageSpec> {
    vec![
        StageSpec::global(EMBEDDING, &[]),
        StageSpec::layer(ATTN_NORM, &["post_ffn_residual@prev"])
            .with_first_layer_inputs(&[EMBEDDING]),
        StageSpec::layer(Q_PROJ, &[ATTN_NORM]),
        StageSpec::layer(K_PROJ, &[ATTN_NORM]),
        StageSpec::layer(V_PROJ, &[ATTN_NORM]),
        StageSpec::layer(Q_ROPE, &[Q_PROJ]),
        StageSpec::layer(K_ROPE, &[K_PROJ]),
        StageSpec::layer(ATTN, &[Q_ROPE, K_ROPE, V_PROJ]),
        StageSpec::layer(O_PROJ, &[ATTN]),
        StageSpec::layer(POST_ATTN_RESIDUAL, &[O_PROJ, "post_ffn_residual@prev"])
            .with_first_layer_inputs(&[O_PROJ, EMBEDDING]),
        StageSpec::layer(FFN_NORM, &[POST_ATTN_RESIDUAL]),
        StageSpec::layer(FFN_GATE, &[FFN_NORM]),
        StageSpec::layer(FFN_UP, &[FFN_NORM]),
        StageSpec::layer(FFN_SWIGLU, &[FFN_GATE, FFN_UP]),
        StageSpec::layer(FFN_DOWN, &[FFN_SWIGLU]),
        StageSpec::layer(POST_FFN_RESIDUAL, &[FFN_DOWN, POST_ATTN_RESIDUAL]),
        StageSpec::global(FINAL_NORM, &["post_ffn_residual@last"]),
        StageSpec::global(LOGITS, &[FINAL_NORM]),
    ]
}
