#!/usr/bin/env python3
"""An independent float64 numpy forward of a llama- or gemma3-architecture
GGUF, checked against the `logits` taps of a taptree tree.

The weights come from the `gguf` package's own reader and dequantizer (not
from taptree's), and every op is written here in numpy: the check is only as
strong as that independence.

    python3 scripts/reference_forward.py --model M.gguf --tree runs/x [--tree runs/y ...] [--min-cos 0.99999] [--max-rel 1e-12]

For each tree, the prompt is its `run.prompt_tokens`; every position of its
`logits` taps (slot-less ones) is compared: cosine, argmax, and the relative
error max|tree - reference| / max|reference| of the row. Prints one line per
position; exit 0 when every cosine >= --min-cos, every argmax agrees and (when
given) every relative error <= --max-rel in every tree, 1 otherwise, 2 when a
comparison could not run, 3 when a Python package is missing.

Gemma 3 (from Hugging Face's `modeling_gemma3`, read independently of
taptree's kernels): embedding times sqrt(n_embd); per layer RMSNorm of each
q and k head before RoPE over halves (`rotate_half`), RMSNorm of the attention
and FFN outputs before the residual adds, `gelu_tanh(gate) * up`; sliding
window `gemma3.attention.sliding_window` with RoPE base 10,000 on layers
l % 6 != 5, global attention with `gemma3.rope.freq_base` on the others. The
GGUF's norm weights are Gemma's `1 + w` already (llama.cpp's converter).
"""

import argparse
import json
import os
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import load_file
except ImportError as e:  # the caller decides whether a missing package is a skip
    print(f"reference_forward: missing python package: {e.name}", file=sys.stderr)
    sys.exit(3)


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise SystemExit(f"reference_forward: {key}: missing from the gguf metadata")
        return default
    v = f.parts[f.data[0]]
    return v.tolist()[0] if len(v) == 1 else v.tolist()


def load(path):
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    cfg = {
        "arch": arch,
        "window": field(reader, f"{arch}.attention.sliding_window", 0),
        "n_layer": field(reader, f"{arch}.block_count"),
        "n_head": field(reader, f"{arch}.attention.head_count"),
        "n_head_kv": field(reader, f"{arch}.attention.head_count_kv"),
        "eps": field(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_base": field(reader, f"{arch}.rope.freq_base", 10000.0),
    }
    w = {}
    for t in reader.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(s) for s in reversed(t.shape.tolist())]
        w[t.name] = a.reshape(shape)
    return cfg, w


def rms_norm(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def rope(x, n_heads, base):
    # Interleaved pairs (2i, 2i+1) of each head, as GGUF's permuted Q/K expect.
    n, width = x.shape
    hd = width // n_heads
    pos = np.arange(n, dtype=np.float64)[:, None]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    p = x.reshape(n, n_heads, hd // 2, 2)
    x0, x1 = p[..., 0], p[..., 1]
    out = np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    return out.reshape(n, width)


def rope_halves(x, n_heads, base):
    # Dimension i of each head turns with i + hd/2 (Hugging Face's rotate_half).
    n, width = x.shape
    hd = width // n_heads
    pos = np.arange(n, dtype=np.float64)[:, None]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.concatenate([pos * inv[None, :]] * 2, axis=-1)[:, None, :]
    h = x.reshape(n, n_heads, hd)
    rot = np.concatenate([-h[..., hd // 2:], h[..., : hd // 2]], axis=-1)
    return (h * np.cos(ang) + rot * np.sin(ang)).reshape(n, width)


def attend(q, k, v, nh, nkv, window=0):
    n = q.shape[0]
    hd = q.shape[1] // nh
    q = q.reshape(n, nh, hd).transpose(1, 0, 2)
    k = np.repeat(k.reshape(n, nkv, hd).transpose(1, 0, 2), nh // nkv, axis=0)
    v = np.repeat(v.reshape(n, nkv, hd).transpose(1, 0, 2), nh // nkv, axis=0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    mask = np.tril(np.ones((n, n), dtype=bool))
    if window:
        mask &= ~np.tril(np.ones((n, n), dtype=bool), -window)
    s = np.where(mask[None], s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return (s @ v).transpose(1, 0, 2).reshape(n, nh * hd)


def forward_gemma3(cfg, w, tokens):
    x = w["token_embd.weight"][tokens] * np.sqrt(w["token_embd.weight"].shape[1])
    n = len(tokens)
    nh, nkv, eps = cfg["n_head"], cfg["n_head_kv"], cfg["eps"]
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        is_global = i % 6 == 5
        base = cfg["rope_base"] if is_global else 10000.0
        window = 0 if is_global else cfg["window"]
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = h @ w[p + "attn_q.weight"].T
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T
        hd = q.shape[1] // nh
        q = rms_norm(q.reshape(n, nh, hd), w[p + "attn_q_norm.weight"], eps).reshape(n, nh * hd)
        k = rms_norm(k.reshape(n, nkv, hd), w[p + "attn_k_norm.weight"], eps).reshape(n, nkv * hd)
        a = attend(rope_halves(q, nh, base), rope_halves(k, nkv, base), v, nh, nkv, window)
        x = x + rms_norm(a @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        gelu = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
        x = x + rms_norm((gelu * u) @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"], eps)
    h = rms_norm(x, w["output_norm.weight"], eps)
    out = w.get("output.weight", w["token_embd.weight"])
    return h @ out.T


def forward(cfg, w, tokens):
    if cfg["arch"] == "gemma3":
        return forward_gemma3(cfg, w, tokens)
    x = w["token_embd.weight"][tokens]
    n = len(tokens)
    nh, nkv = cfg["n_head"], cfg["n_head_kv"]
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg["eps"])
        q = rope(h @ w[p + "attn_q.weight"].T, nh, cfg["rope_base"])
        k = rope(h @ w[p + "attn_k.weight"].T, nkv, cfg["rope_base"])
        v = h @ w[p + "attn_v.weight"].T
        hd = q.shape[1] // nh
        q = q.reshape(n, nh, hd).transpose(1, 0, 2)
        k = np.repeat(k.reshape(n, nkv, hd).transpose(1, 0, 2), nh // nkv, axis=0)
        v = np.repeat(v.reshape(n, nkv, hd).transpose(1, 0, 2), nh // nkv, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((n, n), dtype=bool))[None], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, nh * hd)
        x = x + a @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg["eps"])
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    h = rms_norm(x, w["output_norm.weight"], cfg["eps"])
    out = w.get("output.weight", w["token_embd.weight"])
    return h @ out.T


def tree_logits(tree):
    with open(os.path.join(tree, "manifest.json")) as f:
        m = json.load(f)
    rows = {}
    for e in m["entries"]:
        k = e["key"]
        if k["stage"] != "logits" or k.get("slot") is not None:
            continue
        t = next(iter(load_file(os.path.join(tree, e["path"])).values()))
        for r, p in enumerate(range(k["pos"]["start"], k["pos"]["end"])):
            rows[p] = t[r].astype(np.float64)
    return m["run"]["prompt_tokens"], rows


def check(cfg, w, tree, min_cos, max_rel=None):
    """Compares one tree's logits with the reference; returns an exit code."""
    try:
        tokens, rows = tree_logits(tree)
    except (OSError, KeyError, ValueError) as e:
        print(f"reference_forward: {tree}: cannot read logits: {e}", file=sys.stderr)
        return 2
    positions = [p for p in range(len(tokens)) if p in rows]
    if not positions:
        print(f"reference_forward: {tree}: no logits taps for the prompt positions", file=sys.stderr)
        return 2
    ref = forward(cfg, w, np.array(tokens))
    ok = True
    worst = 1.0
    worst_rel = 0.0
    print(f"{tree}: {len(tokens)} prompt tokens")
    for p in positions:
        x, y = rows[p], ref[p]
        cos = float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
        rel = float(np.abs(x - y).max() / np.abs(y).max())
        same = int(x.argmax()) == int(y.argmax())
        worst = min(worst, cos)
        worst_rel = max(worst_rel, rel)
        good = cos >= min_cos and same and (max_rel is None or rel <= max_rel)
        ok &= good
        print(
            f"  pos {p:3d}  cosine {cos:.9f}  rel {rel:.2e}  argmax {int(x.argmax())} vs {int(y.argmax())}"
            f"{'' if good else '  FAIL'}"
        )
    print(
        f"{'ok' if ok else 'FAILED'}: {tree}: {len(positions)} positions, min cosine {worst:.9f}, "
        f"max rel {worst_rel:.2e}"
    )
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--tree", required=True, action="append", help="taptree tree with logits taps (repeatable)")
    ap.add_argument("--min-cos", type=float, default=0.99999)
    ap.add_argument("--max-rel", type=float, default=None, help="fail a row whose relative error exceeds this")
    a = ap.parse_args()
    cfg, w = load(a.model)
    return max(check(cfg, w, t, a.min_cos, a.max_rel) for t in a.tree)


if __name__ == "__main__":
    sys.exit(main())
