#!/usr/bin/env python3
"""taptree's CPU forward against llama.cpp (llama-cpp-python) on the same
model, the same prompts and the same cores, interleaved round by round.

Run through scripts/bench_forward.sh, which pins both to the same CPUs and
passes the taptree binary and the settings in the environment:

  TAPTREE   taptree binary (required)
  MODEL     model for `taptree capture --model` (default smollm2)
  THREADS   threads of both forwards (default 2)
  ROUNDS    rounds (default 5)
  GEN       decode steps timed (default 64)
  PRECISIONS  taptree's precisions timed, in order (default "f32 q8 llamacpp")

Each round times, in this order: taptree prefill (each of PRECISIONS: the
last position's logits, then every position's), llama.cpp prefill (its
default, then every position's logits), taptree decode (each of
PRECISIONS), llama.cpp decode.

- Prefill: the 37-token chat prompt "What is the capital of France?" in one
  forward, twice: keeping the last position's logits (taptree `capture
  --gen 0 --select "stage=logits;pos=36"`, whose forward then computes
  that row of the logits alone; llama.cpp's `Llama.eval` of the same token
  ids after a reset, as it runs by default), and keeping every position's
  (`--select stage=logits`; llama.cpp with `logits_all=True`). taptree's
  figure is its own "forward" time (its positions over its printed
  positions/s, finer than the printed seconds).
- Decode: GEN greedy steps after a 23-token plain-text prompt, the end token
  ignored. taptree: the forward time of `--gen GEN+1 --ignore-eos` (one
  prefill and GEN one-token forwards) minus that of `--gen 0` on the same
  prompt in the same round; llama.cpp: GEN calls of `Llama.eval([token])`
  after the prompt, argmax of the last logits between them.

With SCALING set (say "2 4 8 16"), it times instead taptree's prefill of the
chat prompt (f32 and q8) at each thread count T, pinned to CPUs 0..T-1 with
T rayon threads, ROUNDS times each, and prints the median tokens/s, the
rounds' range and the ratio to the first count, and the median (and
range) of each round's ratio to the same round's first count (llama.cpp
is not run).
VARIANTS ("name=binary[:VAR=value...] ...", say "base=./old
new=./taptree rayon=./taptree:TAPTREE_CPU_TEAM=0") times several binaries
or settings instead of TAPTREE alone, interleaved: each round runs every
variant at every count and precision, the variants' order rotated round by
round.

A round is quiet when the one-minute load average at its start is below
THREADS + 1 (the bench's own forwards keep about THREADS busy); the medians are taken over the quiet rounds (over all rounds,
said so, when none was quiet).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

CHAT = "What is the capital of France?"
PLAIN = (
    "The old lighthouse keeper climbed the spiral stairs every evening to "
    "light the great lamp, and the ships far out at sea"
)


def taptree(args, out, cpus=None, binary=None, env=None, select="stage=logits"):
    """Runs `taptree capture` keeping the taps SELECT (under `taskset -c
    CPUS` when given; BINARY instead of TAPTREE, with ENV added to the
    environment, when given), returns (forward seconds, manifest)."""
    cmd = (["taskset", "-c", cpus] if cpus else []) + [binary or os.environ["TAPTREE"], "capture", "--model", MODEL, "--out", out, "--force",
           "--select", select] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        sys.exit(f"bench_forward: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    m = re.search(r"forward [0-9.]+ s, ([0-9.]+) positions/s", r.stdout)
    if not m:
        sys.exit(f"bench_forward: no forward time in taptree's output:\n{r.stdout}")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    # The forward's seconds from its rate (printed to four or more digits;
    # the seconds themselves to 10 ms, coarse for a prefill of 80 ms): the
    # positions are the prompt and every generated token but the last.
    generated = manifest["run"].get("extra", {}).get("generated_tokens", [[]])[0]
    positions = len(manifest["run"]["prompt_tokens"]) + max(len(generated) - 1, 0)
    return positions / float(m.group(1)), manifest


def variants():
    """VARIANTS ("name=binary[:VAR=value...] ..."), else TAPTREE alone."""
    spec = os.environ.get("VARIANTS")
    if not spec:
        return [("taptree", os.environ["TAPTREE"], {})]
    out = []
    for v in spec.split():
        name, rest = v.split("=", 1)
        binary, *envs = rest.split(":")
        out.append((name, binary, dict(e.split("=", 1) for e in envs)))
    return out


def scaling(counts, rounds):
    """Prefill tokens/s of taptree at each thread count, pinned; every
    variant, thread count and precision once a round (the variants' order
    rotated round by round)."""
    tmp = tempfile.mkdtemp(prefix="bench_forward.")
    out = os.path.join(tmp, "tree")
    vs = variants()
    _, man = taptree(["--chat", CHAT], out, binary=vs[0][1])
    n = len(man["run"]["prompt_tokens"])
    print(f"prefill of {n} tokens; variants: " + "; ".join(
        f"{name} = {b}" + "".join(f" {k}={v}" for k, v in e.items()) for name, b, e in vs))
    rates = {}
    for rnd in range(rounds):
        load = os.getloadavg()[0]
        for t in counts:
            os.environ["RAYON_NUM_THREADS"] = str(t)
            for p in ("f32", "q8"):
                k = rnd % len(vs)
                for name, b, e in vs[k:] + vs[:k]:
                    secs, _ = taptree(["--chat", CHAT, "--precision", p], out, f"0-{t - 1}", b, e)
                    rates.setdefault((name, t, p), []).append(n / secs)
        print(f"round {rnd} (load {load:.2f}): " + " ".join(
            f"{name}/{t}/{p}={rates[(name, t, p)][-1]:.0f}"
            for t in counts for p in ("f32", "q8") for name, _, _ in vs), flush=True)
    for p in ("f32", "q8"):
        print(f"\n{p} prefill tok/s, medians of {rounds} rounds [min-max] "
              f"(x = against the variant's own {counts[0]} threads)")
        print("| threads | " + " | ".join(name for name, _, _ in vs) + " |")
        print("|---" * (len(vs) + 1) + "|")
        for t in counts:
            cells = []
            for name, _, _ in vs:
                r = rates[(name, t, p)]
                med, first = statistics.median(r), statistics.median(rates[(name, counts[0], p)])
                cells.append(f"{med:.1f} ({med / first:.2f}x) [{min(r):.0f}-{max(r):.0f}]")
            print(f"| {t} | " + " | ".join(cells) + " |", flush=True)
        # Each round's count against the same round's first count: a host
        # whose speed drifts (or is taken for a while) moves both alike.
        for t in counts[1:]:
            cells = []
            for name, _, _ in vs:
                q = [a / b for a, b in zip(rates[(name, t, p)], rates[(name, counts[0], p)])]
                cells.append(f"{name} {statistics.median(q):.2f}x [{min(q):.2f}-{max(q):.2f}]")
            print(f"{p} {t} over {counts[0]} threads, round by round (median [min-max]): "
                  + "; ".join(cells), flush=True)
    subprocess.run(["rm", "-rf", tmp])


def main():
    global MODEL
    MODEL = os.environ.get("MODEL", "smollm2")
    if os.environ.get("SCALING"):
        counts = [int(t) for t in os.environ["SCALING"].split()]
        return scaling(counts, int(os.environ.get("ROUNDS", "5")))
    threads = int(os.environ.get("THREADS", "2"))
    rounds = int(os.environ.get("ROUNDS", "5"))
    gen = int(os.environ.get("GEN", "64"))
    precisions = os.environ.get("PRECISIONS", "f32 q8 llamacpp").split()
    from llama_cpp import Llama
    import numpy as np

    tmp = tempfile.mkdtemp(prefix="bench_forward.")
    out = os.path.join(tmp, "tree")
    _, man = taptree(["--chat", CHAT], out)
    chat_ids = man["run"]["prompt_tokens"]
    model_path = man["run"]["model"]
    _, man = taptree(["--prompt", PLAIN], out)
    plain_ids = man["run"]["prompt_tokens"]
    llm = Llama(model_path=model_path, n_ctx=256, n_batch=256, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    # The same forward computing every position's logits, as taptree's
    # capture of a prefill does (llama.cpp's default computes the last only).
    llm_all = Llama(model_path=model_path, n_ctx=256, n_batch=256, n_threads=threads,
                    n_threads_batch=threads, logits_all=True, verbose=False)
    print(f"model {model_path}; {threads} threads; chat prompt {len(chat_ids)} tokens, "
          f"plain prompt {len(plain_ids)} tokens, {gen} decode steps; "
          f"llama-cpp-python {__import__('llama_cpp').__version__}")

    def llama_prefill(model=llm):
        model.reset()
        t = time.perf_counter()
        model.eval(chat_ids)
        return time.perf_counter() - t

    def llama_decode():
        llm.reset()
        llm.eval(plain_ids)
        t = time.perf_counter()
        for _ in range(gen):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
        return time.perf_counter() - t

    def tt_decode(precision):
        base = ["--prompt", PLAIN, "--precision", precision]
        t0, _ = taptree(base + ["--gen", "0"], out)
        t1, m = taptree(base + ["--gen", str(gen + 1), "--ignore-eos"], out)
        assert len(m["run"]["extra"]["generated_tokens"][0]) == gen + 1
        return t1 - t0

    # The last position's logits only: the output matmul of one row, as
    # llama.cpp computes by default.
    last_logits = f"stage=logits;pos={len(chat_ids) - 1}"
    llama_prefill()  # warm-up
    llama_prefill(llm_all)
    assert llm_all.scores[: len(chat_ids)].any(axis=1).all(), "logits_all gave no logits"
    rows = []
    for r in range(rounds):
        load = os.getloadavg()[0]
        row = {"load": load}
        for p in precisions:
            row[f"tt_prefill_{p}"] = taptree(["--chat", CHAT, "--precision", p], out,
                                             select=last_logits)[0]
            row[f"tt_prefill_all_{p}"] = taptree(["--chat", CHAT, "--precision", p], out)[0]
        row["llama_prefill"] = llama_prefill()
        row["llama_prefill_all"] = llama_prefill(llm_all)
        for p in precisions:
            row[f"tt_decode_{p}"] = tt_decode(p)
        row["llama_decode"] = llama_decode()
        rows.append(row)
        rates = {what: ", ".join(f"{p} {n / row[f'tt_{what}_{p}']:.1f}" for p in precisions)
                 for what, n in (("prefill", len(chat_ids)), ("prefill_all", len(chat_ids)),
                                 ("decode", gen))}
        print(f"round {r + 1}: load {load:.2f}; prefill tok/s taptree {rates['prefill']}, "
              f"llama.cpp {len(chat_ids) / row['llama_prefill']:.1f} (every position's logits: "
              f"taptree {rates['prefill_all']}, llama.cpp "
              f"{len(chat_ids) / row['llama_prefill_all']:.1f}); decode tok/s taptree "
              f"{rates['decode']}, llama.cpp {gen / row['llama_decode']:.1f}", flush=True)

    quiet = [r for r in rows if r["load"] < threads + 1]
    which = f"{len(quiet)} quiet rounds of {len(rows)}"
    if not quiet:
        quiet, which = rows, f"all {len(rows)} rounds (none quiet: load >= {threads + 1})"
    med = {k: statistics.median(r[k] for r in quiet) for k in rows[0]}
    print(f"\nmedians over {which}:")
    print("| | taptree | llama.cpp | taptree time / llama.cpp time |")
    print("|---|---|---|---|")
    for what, n, ll, label in (
            ("prefill", len(chat_ids), "llama_prefill", " (the last position's logits)"),
            ("prefill_all", len(chat_ids), "llama_prefill_all", " (every position's logits)"),
            ("decode", gen, "llama_decode", "")):
        for p in precisions:
            tt = med[f"tt_{what}_{p}"]
            name = what.split("_")[0]
            print(f"| {name} {p}{label} | {n / tt:.1f} tok/s | {n / med[ll]:.1f} tok/s | "
                  f"{tt / med[ll]:.2f} |")
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
