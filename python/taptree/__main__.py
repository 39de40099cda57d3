"""`python3 -m taptree capture --engine NAME ...`: capture a foreign engine.

This is what `taptree capture --engine hf|llama.cpp` runs after it has
resolved the model and tokenized the prompt with taptree's own tokenizer, so
every engine sees the same ids. Each engine is a module with
`capture(args) -> dict` (the writer's summary: root, taps, bytes, path, and
`generated`, the greedy ids, when it generated); `ENGINES` maps the
`--engine` name to it. `args` carries: `model_file` (a GGUF file or an HF
directory), `tokens` (list of ints), `out`, `gen`, `stop` (ids that end the
greedy answer), `select` (the text) and `selection` (a parsed
`taptree.select.Selection`, to pass to `TreeWriter(select=...)`), `force`,
`precision` (f32, f64, bf16, f16), `threads` (0: the engine's default) and
`run` (a dict taptree fills with the model, its blake3, the prompt tokens,
argv and git revision: merge it into the manifest's run record). Raise an
exception named `EngineError` (or `taptree.tree.TreeError`) for a one-line
exit-2 message.

Exit codes: 0 captured, 2 could not capture (bad input, a missing package,
an engine failure); the message is one line naming what is wrong.
"""

import argparse
import importlib
import json
import sys

ENGINES = {
    "hf": "taptree.hf",
    "llama.cpp": "taptree.llamacpp",
}

PRECISIONS = ("f32", "f64", "bf16", "f16")


class EngineError(Exception):
    """An engine could not capture; the message says why (exit 2)."""


def _tokens(text):
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("bad token list %r: expected comma-separated ids" % text)
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError("bad token list %r: expected non-negative ids" % text)
    return ids


def _stop(text):
    return _tokens(text) if text.strip() else []


def parser():
    p = argparse.ArgumentParser(prog="python3 -m taptree", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="run an engine's forward and write every tap into a tree")
    c.add_argument("--engine", required=True, choices=sorted(ENGINES), help="which engine runs the forward")
    c.add_argument("--model-file", required=True, help="a GGUF file or a Hugging Face checkpoint directory")
    c.add_argument("--tokens", required=True, type=_tokens, help="prompt token ids, comma-separated")
    c.add_argument("--out", required=True, help="the tree to write")
    c.add_argument("--gen", type=int, default=0, help="tokens to generate greedily after the prefill")
    c.add_argument("--select", default="", help="which taps to write (stage=ffn_*;layer=20..30;pos=0)")
    c.add_argument("--force", action="store_true", help="replace an existing tree at --out")
    c.add_argument("--precision", default="f32", choices=PRECISIONS, help="the engine's compute dtype")
    c.add_argument("--threads", type=int, default=0, help="CPU threads (0: the engine's default)")
    c.add_argument("--stop", type=_stop, default=[], help="token ids that end the greedy answer, comma-separated")
    c.add_argument("--run", default="{}", help="JSON object merged into the manifest's run record")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.gen < 0:
        print("taptree: --gen: must be >= 0", file=sys.stderr)
        return 2
    try:
        args.run = json.loads(args.run)
        if not isinstance(args.run, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        print("taptree: --run: bad JSON: %s" % e, file=sys.stderr)
        return 2
    from .select import Selection, SelectionError
    from .tree import TreeError

    try:
        args.selection = Selection.parse(args.select)
    except SelectionError as e:
        print("taptree: --select: %s" % e, file=sys.stderr)
        return 2
    try:
        engine = importlib.import_module(ENGINES[args.engine])
    except ImportError as e:
        print("taptree: engine %s: cannot import %s: %s" % (args.engine, ENGINES[args.engine], e), file=sys.stderr)
        return 2
    try:
        summary = engine.capture(args)
    except (EngineError, TreeError, getattr(engine, "EngineError", EngineError)) as e:
        print("taptree: %s" % e, file=sys.stderr)
        return 2
    if summary.get("generated"):
        print("generated %d tokens: %s" % (len(summary["generated"]), ",".join(map(str, summary["generated"]))))
    print(
        "captured %d taps, %d bytes, root %s -> %s"
        % (summary["taps"], summary["bytes"], summary["root"], summary["path"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
