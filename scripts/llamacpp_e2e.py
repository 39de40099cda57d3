#!/usr/bin/env python3
"""llama.cpp against the f64 truth, end to end, on three prompts.

For each prompt: the f64 truth, taptree f32, taptree q8 and taptree
--precision llamacpp (all `taptree capture`), and llama.cpp itself (the
adapter, python/taptree/llamacpp.py) on the same token ids. Prints, per
prompt, the mean over positions of (1 - cos) of the final logits against
the truth, the min cos and the argmax agreement, and the ratio
llamacpp-mode / llama.cpp, then runs `taptree diff` of each run against
the truth to name its first op outside tolerance.

    python3 scripts/llamacpp_e2e.py runs/e2e      # after cargo build --release
    python3 scripts/llamacpp_e2e.py runs/e2e-gemma --model gemma3-270m

Trees are kept under the given directory (replaced with --force). With
TAPTREE_LLAMACPP_FLASH_ATTN=1 in the environment, llama.cpp and
--precision llamacpp both run flash attention.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from taptree.tree import open_tree  # noqa: E402

TAPTREE = os.path.join(ROOT, "target", "release", "taptree")
PROMPTS = [
    ("chat-capital", ["--chat", "What is the capital of France?"]),
    ("chat-sky", ["--chat", "Explain in two sentences why the sky is blue."]),
    ("text", ["--prompt", "The quick brown fox jumps over the lazy dog. Meanwhile, in the city of"]),
]
RUNS = ["f64", "f32", "q8", "llamacpp"]


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def logits(tree):
    t = open_tree(tree)
    rows = [t.read(e) for e in t.entries if e["key"]["stage"] == "logits"]
    return np.concatenate(rows).astype(np.float64)


def cos_rows(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def first_divergence(a, b):
    r = subprocess.run([TAPTREE, "diff", a, b, "--json"], capture_output=True, text=True)
    if r.returncode == 2:
        return "could not compare: " + r.stderr.strip()
    rep = json.loads(r.stdout)
    i = rep.get("first_divergence")
    if i is None:
        return "none"
    row = rep["rows"][i]
    worst = row["positions"][row["worst"]]
    layer = "" if row.get("layer") is None else "L%d/" % row["layer"]
    cos = worst["metrics"].get("cos")
    return "%s%s (pos %s, cos %s, %s)" % (
        layer, row["stage"], worst["pos"], "%.6f" % cos if cos is not None else "-", row["cause"]["kind"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="runs/e2e")
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), gemma3-270m or a GGUF file")
    ap.add_argument("--keep", action="store_true", help="keep the taptree trees already captured (a manifest present)")
    args = ap.parse_args()
    out, model = args.out, args.model
    print("| prompt | positions | run | mean(1-cos) vs f64 | min cos | argmax agree | first op outside tolerance vs f64 |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name, prompt in PROMPTS:
        d = os.path.join(out, name)
        for p in RUNS:
            # The flash attention switch is llama.cpp's: only llamacpp takes it.
            env = dict(os.environ)
            if p != "llamacpp":
                env.pop("TAPTREE_LLAMACPP_FLASH_ATTN", None)
            if args.keep and os.path.isfile(os.path.join(d, p, "manifest.json")):
                continue
            sh([TAPTREE, "capture", "--model", model, "--precision", p, *prompt, "--out", os.path.join(d, p), "--force"],
               env=env)
        with open(os.path.join(d, "f64", "manifest.json")) as f:
            tokens = json.load(f)["run"]["prompt_tokens"]
        sh(
            [TAPTREE, "capture", "--engine", "llama.cpp", "--model", model, *prompt, "--threads", "2",
             "--out", os.path.join(d, "llama.cpp"), "--force"]
        )
        with open(os.path.join(d, "llama.cpp", "manifest.json")) as f:
            assert json.load(f)["run"]["prompt_tokens"] == tokens, "llama.cpp got other token ids"
        truth = logits(os.path.join(d, "f64"))
        means = {}
        for run in ["f32", "q8", "llamacpp", "llama.cpp"]:
            x = logits(os.path.join(d, run))
            c = cos_rows(x, truth)
            means[run] = float(np.mean(1 - c))
            agree = float(np.mean(x.argmax(1) == truth.argmax(1)))
            fd = first_divergence(os.path.join(d, "f64"), os.path.join(d, run))
            label = {"llamacpp": "taptree --precision llamacpp", "llama.cpp": "llama.cpp (CPU)"}.get(run, "taptree " + run)
            print("| %s | %d | %s | %.3e | %.6f | %.1f%% | %s |" % (name, len(tokens), label, means[run], c.min(), 100 * agree, fd))
        ratios.append((name, means["llamacpp"] / means["llama.cpp"], means["q8"] / means["llama.cpp"]))
    print()
    print("| prompt | llamacpp-mode / llama.cpp | q8 / llama.cpp |")
    print("|---|---|---|")
    for name, r, q in ratios:
        print("| %s | %.2f | %.2f |" % (name, r, q))


if __name__ == "__main__":
    main()
