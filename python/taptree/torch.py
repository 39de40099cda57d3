"""Capture any PyTorch module tree with forward hooks.

You map module names to stages; every forward while the capture is attached
writes those modules' outputs (or inputs) as taps:

    import taptree.torch as tt
    from taptree import TreeWriter, stages

    mapping = {
        "model.layers.{layer}.mlp.down_proj": stages.FFN_DOWN,
        "model.layers.{layer}.mlp.down_proj:input": stages.FFN_SWIGLU,
        "model.norm": stages.FINAL_NORM,
    }
    with TreeWriter("runs/mine", stages=stages.llama()) as w:
        with tt.TorchCapture(model, w, mapping) as cap:
            cap.position = 0              # the first position of this forward
            model(input_ids)

A name is a module's `named_modules()` name; `{layer}` matches the layer
number. `:input` taps the module's first input instead of its output. Tensors
are `[batch, tokens, width]` (batch 1 is dropped; a larger batch becomes one
slot per row), `[tokens, width]`, or, with `record(..., heads_first=True)`,
`[batch, heads, tokens, head_dim]`, which is written as `[tokens, heads *
head_dim]`. f32, f64 and f16 are written as they are, bf16 as BF16.

Ops that are not modules (RoPE in Hugging Face models) are tapped by calling
`cap.record(stage, layer, tensor)` from a patched function; taptree.hf does so.
"""

import re

import numpy as np
import torch


class MappingError(ValueError):
    """A mapping names no module of the model, or is malformed."""


def _pattern(name):
    base, _, which = name.partition(":")
    if which not in ("", "input", "output"):
        raise MappingError("mapping %r: the suffix must be :input or :output" % name)
    rx = re.escape(base).replace(re.escape("{layer}"), r"(?P<layer>\d+)")
    return re.compile("^%s$" % rx), which or "output"


def rows_of(tensor, heads_first=False):
    """A tensor as a list of (slot, [tokens, width] array, dtype override)."""
    t = tensor.detach()
    if heads_first:
        if t.dim() == 3:
            t = t.unsqueeze(0)
        b, h, n, d = t.shape
        t = t.permute(0, 2, 1, 3).reshape(b, n, h * d)
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3:
        t = t.reshape(t.shape[0], t.shape[1], -1)
    out = []
    for b in range(t.shape[0]):
        row = t[b].contiguous().cpu()
        slot = None if t.shape[0] == 1 else b
        if row.dtype == torch.bfloat16:
            out.append((slot, row.view(torch.int16).numpy().view(np.uint16), "BF16"))
        else:
            out.append((slot, row.numpy(), None))
    return out


class TorchCapture:
    """Forward hooks on `model` that write the mapped modules into `writer`.

    Set `position` to the first position of each forward before calling it
    (0 for a prefill, the cache length for a decode step). A context manager:
    the hooks are removed on exit.
    """

    def __init__(self, model, writer, mapping):
        self.model = model
        self.writer = writer
        self.position = 0
        self.layer = None  # the layer being run, for taps from patched functions
        self._handles = []
        self._mapping = [(_pattern(k), v) for k, v in mapping.items()]
        self._names = {_pattern(k)[0].pattern: k for k in mapping}
        self._matched = set()

    def __enter__(self):
        self.attach()
        return self

    def __exit__(self, *exc):
        self.detach()
        return False

    def attach(self):
        for name, module in self.model.named_modules():
            for (rx, which), stage in self._mapping:
                m = rx.match(name)
                if not m:
                    continue
                self._matched.add(rx.pattern)
                layer = int(m.group("layer")) if "layer" in rx.groupindex else None
                if which == "input":
                    hook = module.register_forward_pre_hook(self._pre(stage, layer))
                else:
                    hook = module.register_forward_hook(self._post(stage, layer))
                self._handles.append(hook)
        missing = [self._names[rx.pattern] for (rx, _), _ in self._mapping if rx.pattern not in self._matched]
        if missing:
            self.detach()
            raise MappingError("no module of %s matches %s" % (type(self.model).__name__, ", ".join(missing)))

    def detach(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, stage, layer):
        def hook(module, args):
            self.record(stage, layer, args[0])

        return hook

    def _post(self, stage, layer):
        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            if hasattr(out, "logits") and not torch.is_tensor(out):
                out = out.logits
            self.record(stage, layer, out)

        return hook

    def record(self, stage, layer, tensor, heads_first=False):
        """Writes one tap of the current forward (positions from `position`)."""
        for slot, rows, dtype in rows_of(tensor, heads_first):
            pos = (self.position, self.position + rows.shape[0])
            if self.writer.wants(stage, layer, pos, slot):
                self.writer.tap(stage, layer, pos, rows, slot=slot, dtype=dtype)
