"""The stage vocabulary of the llama family, in forward order, with meanings.

The same names, scopes and inputs as the Rust forwards (kernels/src/stages.rs)
and docs/FORMAT.md "The stage contract". Every tap is `[rows, width]`, axis 0
= positions; a per-head tensor is laid out head after head
(`width = heads * head_dim`). An engine may tap a subset, or add its own
stages; the manifest's vocabulary is the authority.

A stage may declare a **layout** where engines legitimately differ; the diff
reconciles declared layouts before comparing. `layout(rotary=..., head_dim=...)`
builds one. Absent means the reference layout (`rotary=interleaved`).
"""

EMBEDDING = "embedding"
ATTN_NORM = "attn_norm"
Q_PROJ = "q_proj"
K_PROJ = "k_proj"
V_PROJ = "v_proj"
Q_ROPE = "q_rope"
K_ROPE = "k_rope"
ATTN = "attn"
O_PROJ = "o_proj"
POST_ATTN_RESIDUAL = "post_attn_residual"
FFN_NORM = "ffn_norm"
FFN_GATE = "ffn_gate"
FFN_UP = "ffn_up"
FFN_SWIGLU = "ffn_swiglu"
FFN_DOWN = "ffn_down"
POST_FFN_RESIDUAL = "post_ffn_residual"
FINAL_NORM = "final_norm"
LOGITS = "logits"
# Gemma 3's additions (docs/FORMAT.md, "Stages of the Gemma 3 family").
Q_NORM = "q_norm"
K_NORM = "k_norm"
POST_ATTN_NORM = "post_attn_norm"
FFN_GEGLU = "ffn_geglu"
POST_FFN_NORM = "post_ffn_norm"

# What each stage holds: the op, and where it sits relative to nonlinearities.
MEANING = {
    EMBEDDING: "token embedding rows of the input ids, [rows, hidden] (before any scaling an architecture adds)",
    ATTN_NORM: "RMSNorm of the layer input times its weight, [rows, hidden]",
    Q_PROJ: "attn_norm @ Wq (+ bias), before RoPE, [rows, n_head * head_dim]",
    K_PROJ: "attn_norm @ Wk (+ bias), before RoPE, [rows, n_head_kv * head_dim] (GQA: the KV heads only)",
    V_PROJ: "attn_norm @ Wv (+ bias), [rows, n_head_kv * head_dim]",
    Q_ROPE: "q_proj after rotary position embedding, [rows, n_head * head_dim]",
    K_ROPE: "k_proj after rotary position embedding, [rows, n_head_kv * head_dim]",
    ATTN: "softmax(q k^T / sqrt(head_dim) + causal mask) v per head, before o_proj, [rows, n_head * head_dim]",
    O_PROJ: "attn @ Wo, before the residual add, [rows, hidden]",
    POST_ATTN_RESIDUAL: "layer input + o_proj, [rows, hidden]",
    FFN_NORM: "RMSNorm of post_attn_residual times its weight, [rows, hidden]",
    FFN_GATE: "ffn_norm @ Wgate, before SiLU, [rows, ffn]",
    FFN_UP: "ffn_norm @ Wup, [rows, ffn]",
    FFN_SWIGLU: "silu(ffn_gate) * ffn_up, [rows, ffn]",
    FFN_DOWN: "ffn_swiglu @ Wdown, before the residual add, [rows, hidden]",
    POST_FFN_RESIDUAL: "post_attn_residual + ffn_down: the layer output, [rows, hidden]",
    FINAL_NORM: "RMSNorm of the last layer's output times its weight, [rows, hidden]",
    LOGITS: "final_norm @ Woutput, [rows, vocab]",
}

# Layout vocabulary. `rotary` is the pair order of RoPE within each head:
# interleaved pairs (2i, 2i+1), as GGUF and llama.cpp; or half-split pairs
# (i, i + head_dim/2), as Hugging Face transformers.
ROTARY = "rotary"
INTERLEAVED = "interleaved"
HALF_SPLIT = "half_split"
HEAD_DIM = "head_dim"
# The stages whose width order depends on the rotary pair order.
ROTARY_STAGES = (Q_PROJ, K_PROJ, Q_ROPE, K_ROPE)


def layout(rotary=None, head_dim=None):
    """A stage's declared layout, as the manifest stores it."""
    out = {}
    if rotary is not None:
        if rotary not in (INTERLEAVED, HALF_SPLIT):
            raise ValueError("rotary layout %r: expected %r or %r" % (rotary, INTERLEAVED, HALF_SPLIT))
        out[ROTARY] = rotary
    if head_dim is not None:
        out[HEAD_DIM] = int(head_dim)
    return out


def _spec(name, scope, inputs, first_layer_inputs=None):
    spec = {"name": name, "scope": scope, "inputs": list(inputs)}
    if first_layer_inputs:
        spec["first_layer_inputs"] = list(first_layer_inputs)
    return spec


def llama(rotary=None, head_dim=None):
    """The llama-family vocabulary (manifest `stages`), in forward order.

    With `rotary` and `head_dim`, the rotary stages declare that layout.
    """
    prev = "post_ffn_residual@prev"
    specs = [
        _spec(EMBEDDING, "global", []),
        _spec(ATTN_NORM, "layer", [prev], [EMBEDDING]),
        _spec(Q_PROJ, "layer", [ATTN_NORM]),
        _spec(K_PROJ, "layer", [ATTN_NORM]),
        _spec(V_PROJ, "layer", [ATTN_NORM]),
        _spec(Q_ROPE, "layer", [Q_PROJ]),
        _spec(K_ROPE, "layer", [K_PROJ]),
        _spec(ATTN, "layer", [Q_ROPE, K_ROPE, V_PROJ]),
        _spec(O_PROJ, "layer", [ATTN]),
        _spec(POST_ATTN_RESIDUAL, "layer", [O_PROJ, prev], [O_PROJ, EMBEDDING]),
        _spec(FFN_NORM, "layer", [POST_ATTN_RESIDUAL]),
        _spec(FFN_GATE, "layer", [FFN_NORM]),
        _spec(FFN_UP, "layer", [FFN_NORM]),
        _spec(FFN_SWIGLU, "layer", [FFN_GATE, FFN_UP]),
        _spec(FFN_DOWN, "layer", [FFN_SWIGLU]),
        _spec(POST_FFN_RESIDUAL, "layer", [FFN_DOWN, POST_ATTN_RESIDUAL]),
        _spec(FINAL_NORM, "global", ["post_ffn_residual@last"]),
        _spec(LOGITS, "global", [FINAL_NORM]),
    ]
    declared = layout(rotary, head_dim)
    if declared:
        for s in specs:
            if s["name"] in ROTARY_STAGES:
                s["layout"] = dict(declared)
    return specs


def gemma3():
    """The Gemma 3 vocabulary, in forward order: llama's with `q_norm`,
    `k_norm` before RoPE, `post_attn_norm` and `post_ffn_norm` before the
    residual adds, and `ffn_geglu` in place of `ffn_swiglu`; RoPE over halves
    in the checkpoint's own q/k order, as taptree's Gemma forward computes
    (the same vocabulary as `kernels::stages::for_config`)."""
    prev = "post_ffn_residual@prev"
    return [
        _spec(EMBEDDING, "global", []),
        _spec(ATTN_NORM, "layer", [prev], [EMBEDDING]),
        _spec(Q_PROJ, "layer", [ATTN_NORM]),
        _spec(K_PROJ, "layer", [ATTN_NORM]),
        _spec(V_PROJ, "layer", [ATTN_NORM]),
        _spec(Q_NORM, "layer", [Q_PROJ]),
        _spec(K_NORM, "layer", [K_PROJ]),
        _spec(Q_ROPE, "layer", [Q_NORM]),
        _spec(K_ROPE, "layer", [K_NORM]),
        _spec(ATTN, "layer", [Q_ROPE, K_ROPE, V_PROJ]),
        _spec(O_PROJ, "layer", [ATTN]),
        _spec(POST_ATTN_NORM, "layer", [O_PROJ]),
        _spec(POST_ATTN_RESIDUAL, "layer", [POST_ATTN_NORM, prev], [POST_ATTN_NORM, EMBEDDING]),
        _spec(FFN_NORM, "layer", [POST_ATTN_RESIDUAL]),
        _spec(FFN_GATE, "layer", [FFN_NORM]),
        _spec(FFN_UP, "layer", [FFN_NORM]),
        _spec(FFN_GEGLU, "layer", [FFN_GATE, FFN_UP]),
        _spec(FFN_DOWN, "layer", [FFN_GEGLU]),
        _spec(POST_FFN_NORM, "layer", [FFN_DOWN]),
        _spec(POST_FFN_RESIDUAL, "layer", [POST_FFN_NORM, POST_ATTN_RESIDUAL]),
        _spec(FINAL_NORM, "global", ["post_ffn_residual@last"]),
        _spec(LOGITS, "global", [FINAL_NORM]),
    ]


NAMES = [s["name"] for s in llama()]
