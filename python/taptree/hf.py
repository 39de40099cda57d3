"""Capture a Hugging Face transformers model of the llama family.

Llama, SmolLM2, Mistral and Qwen2 (q/k/v biases included): every stage of
taptree's vocabulary (taptree.stages), RoPE included, which is a function in
transformers, not a module, and is patched for the capture.

    from transformers import AutoModelForCausalLM
    from taptree.hf import capture_hf

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    capture_hf(model, [1, 9690, 198], out="runs/hf")

Hugging Face lays out q/k rows half-split for RoPE (pairs i, i + head_dim/2);
the rotary stages declare it (`rotary=half_split`) and the diff reconciles it
with taptree's interleaved pairs. The manifest records the input ids, the
compute dtype, where the model computes in float32 whatever the dtype (so an
"f64" run is not taken for a truth), and the versions of torch and
transformers.
"""

import inspect
import os
import sys

import torch

from . import stages as st
from .torch import TorchCapture

FAMILIES = ("llama", "mistral", "qwen2")
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


class EngineError(Exception):
    """The model cannot be captured by this adapter; the message says why."""


def mapping(prefix="model."):
    """Module names of a transformers llama-family model → stages."""
    layer = prefix + "layers.{layer}."
    return {
        prefix + "embed_tokens": st.EMBEDDING,
        layer + "input_layernorm": st.ATTN_NORM,
        layer + "self_attn.q_proj": st.Q_PROJ,
        layer + "self_attn.k_proj": st.K_PROJ,
        layer + "self_attn.v_proj": st.V_PROJ,
        layer + "self_attn.o_proj:input": st.ATTN,
        layer + "self_attn.o_proj": st.O_PROJ,
        layer + "post_attention_layernorm:input": st.POST_ATTN_RESIDUAL,
        layer + "post_attention_layernorm": st.FFN_NORM,
        layer + "mlp.gate_proj": st.FFN_GATE,
        layer + "mlp.up_proj": st.FFN_UP,
        layer + "mlp.down_proj:input": st.FFN_SWIGLU,
        layer + "mlp.down_proj": st.FFN_DOWN,
        prefix + "layers.{layer}": st.POST_FFN_RESIDUAL,
        prefix + "norm": st.FINAL_NORM,
        "lm_head": st.LOGITS,
    }


def float32_islands(model):
    """Where the model computes in float32 whatever its dtype, read from the
    transformers source it runs: its RMSNorm, its rotary tables, its
    attention softmax."""
    found = []
    layer = model.model.layers[0]
    checks = [
        ("RMSNorm (%s)" % type(layer.input_layernorm).__name__, type(layer.input_layernorm).forward),
        ("RoPE cos/sin tables (%s)" % type(model.model.rotary_emb).__name__, type(model.model.rotary_emb)),
    ]
    modeling = sys.modules[type(layer.self_attn).__module__]
    eager = getattr(modeling, "eager_attention_forward", None)
    if eager is not None and getattr(model.config, "_attn_implementation", "eager") == "eager":
        checks.append(("attention softmax (eager_attention_forward)", eager))
    for what, obj in checks:
        try:
            src = inspect.getsource(obj)
        except (OSError, TypeError):
            found.append("%s: source not readable, assumed float32" % what)
            continue
        if "torch.float32" in src or "dtype=torch.float)" in src or ".float()" in src:
            found.append("%s computes in float32" % what)
    return found


def versions():
    import transformers

    from . import __version__

    return {"torch": torch.__version__, "transformers": transformers.__version__, "taptree": __version__}


def _check_family(model):
    kind = getattr(model.config, "model_type", "?")
    if kind not in FAMILIES:
        raise EngineError(
            "%s: model type %r is not of the llama family (%s); map its modules with taptree.torch"
            % (type(model).__name__, kind, ", ".join(FAMILIES))
        )


def capture_hf(model, input_ids, out, gen=0, stop=(), select=None, force=False, run=None):
    """Runs `input_ids` (then `gen` greedy tokens) through `model`, tapping
    every stage into the tree at `out`. Returns the writer's summary (root,
    taps, bytes, path) with `generated` (the greedy tokens)."""
    from .tree import TreeWriter

    _check_family(model)
    ids = [int(t) for t in (input_ids.reshape(-1).tolist() if torch.is_tensor(input_ids) else input_ids)]
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    precision = {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype))
    islands = float32_islands(model) if dtype != torch.float32 else []
    record = {
        "backend": "hf/%s" % next(model.parameters()).device.type,
        "precision": precision,
        "prompt_tokens": ids,
    }
    record.update(run or {})
    extra = dict(record.get("extra") or {})
    extra.update(
        {
            "engine": "hf",
            "engine_versions": versions(),
            "model_class": type(model).__name__,
            "compute_dtype": str(dtype).replace("torch.", ""),
            "all_ops_f64": dtype == torch.float64 and not islands,
            "float32_islands": islands,
        }
    )
    record["extra"] = extra
    vocabulary = st.llama(rotary=st.HALF_SPLIT, head_dim=head_dim)
    writer = TreeWriter(out, stages=vocabulary, run=record, force=force, select=select)
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original_rope = modeling.apply_rotary_pos_emb
    generated = []
    # transformers 5 renames past_key_values to cache.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        with TorchCapture(model, writer, mapping()) as cap:

            def rope(q, k, *args, **kwargs):
                q, k = original_rope(q, k, *args, **kwargs)
                cap.record(st.Q_ROPE, cap.layer, q, heads_first=True)
                cap.record(st.K_ROPE, cap.layer, k, heads_first=True)
                return q, k

            def enter_layer(i):
                def hook(module, args):
                    cap.layer = i

                return hook

            hooks = [
                layer.self_attn.register_forward_pre_hook(enter_layer(i)) for i, layer in enumerate(model.model.layers)
            ]
            modeling.apply_rotary_pos_emb = rope
            try:
                with torch.no_grad():
                    cap.position = 0
                    res = model(input_ids=torch.tensor([ids]), use_cache=True)
                    for step in range(gen):
                        nxt = int(res.logits[0, -1].argmax())
                        generated.append(nxt)
                        if nxt in stop or step == gen - 1:
                            break
                        cap.position = len(ids) + step
                        res = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{cache_arg: _cache_of(res)})
            finally:
                modeling.apply_rotary_pos_emb = original_rope
                for h in hooks:
                    h.remove()
        writer.run["extra"]["generated_tokens"] = [generated]
    except BaseException:
        writer.__exit__(RuntimeError, None, None)
        raise
    summary = writer.finish()
    summary["generated"] = generated
    return summary


def _cache_of(out):
    """The KV cache a forward returned (`cache` in transformers 5)."""
    return out["cache"] if "cache" in out else out.past_key_values


def load(model_file, precision="f32"):
    """A transformers model from an HF directory or a GGUF file (dequantized
    by transformers, so it sees the weights taptree's forward sees)."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[precision]
    kwargs = {"dtype": dtype, "attn_implementation": "eager"}
    if os.path.isdir(model_file):
        model = AutoModelForCausalLM.from_pretrained(model_file, **kwargs)
    else:
        folder, name = os.path.split(os.path.abspath(model_file))
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
    model.eval()
    return model


def capture(args):
    """`python3 -m taptree capture --engine hf` (see taptree.__main__)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = load(args.model_file, args.precision)
    except Exception as e:  # transformers raises many kinds; all mean "cannot load"
        raise EngineError("%s: transformers cannot load it: %s" % (args.model_file, str(e).splitlines()[0]))
    vocab = model.config.vocab_size
    bad = [t for t in args.tokens if t >= vocab]
    if bad:
        raise EngineError("%s: token id %d is outside the vocabulary (size %d)" % (args.model_file, bad[0], vocab))
    summary = capture_hf(
        model,
        args.tokens,
        out=args.out,
        gen=args.gen,
        stop=tuple(args.stop),
        select=args.selection,
        force=args.force,
        run=args.run,
    )
    return summary
