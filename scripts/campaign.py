#!/usr/bin/env python3
"""Corruption and kill campaign: tries to make taptree accept a damaged,
hostile or partial tree, and counts what it catches.

  python3 scripts/campaign.py [--corruptions 1000] [--kills 100] [--seed 1]

Needs a release build (`cargo build --release`; TAPTREE=path to use another
binary) and the tiny fixture models (written to target/fixtures by
`cargo run --release -p fixtures --bin generate -- models` if absent).

Three parts, each a number of tries:

- corruption: a copy of a tree (alternately the format 2.0 golden tree and
  a format 2.3 tree captured here, with its index) with one random flip,
  truncation or append in one tap file, the manifest or the index.
  `taptree verify TREE` (which rehashes) must refuse every one; trusted
  `taptree verify GOLDEN TREE` must refuse every damaged manifest or index,
  wherever the damage lies (of a 2.1 or 2.3 tree, the index head's checksums cover
  every byte of both files); it reads no tap file (docs/FORMAT.md), so a
  pass over a damaged tap file is counted apart.
- kill: `taptree capture` and `capture --force` killed (SIGKILL) at a random
  moment. The path must then hold the old tree, intact, or the new one,
  complete (or, for a first capture, no tree or an incomplete one), and the
  next capture to the path must leave nothing beside it but the path's
  spare (the tree a `--force` capture replaced).
- hostile: inputs built to exhaust memory or time or to block; each must exit
  2 with a one-line message within the time limit, under a 4 GiB address
  space limit.

Prints tried / detected / silent pass / panic / hang / leaked files per part;
exits 1 if any silent pass, panic, hang or leak was seen.
"""

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAPTREE = os.environ.get("TAPTREE", os.path.join(ROOT, "target/release/taptree"))
GOLDEN = os.path.join(ROOT, "fixtures/golden/tiny-q-f32")
FIXTURES = os.path.join(ROOT, "target/fixtures")
LIMIT_S = 20
MEMORY = 4 << 30


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


class Tally:
    def __init__(self, name):
        self.name = name
        self.tried = self.detected = self.silent = self.panic = self.hang = self.leaked = 0
        self.contract = 0
        self.notes = []

    def note(self, what):
        if len(self.notes) < 10:
            self.notes.append(what)

    def line(self):
        extra = ""
        if self.contract:
            extra = " (+%d damaged tap files passed by trusted verify: outside its contract)" % self.contract
        return "%-10s tried %5d  detected %5d  silent pass %d  panic %d  hang %d  leaked files %d%s" % (
            self.name,
            self.tried,
            self.detected,
            self.silent,
            self.panic,
            self.hang,
            self.leaked,
            extra,
        )

    def bad(self):
        return self.silent + self.panic + self.hang + self.leaked


def run(args, timeout=LIMIT_S, **kw):
    """(exit code or 'hang', stderr)."""
    try:
        p = subprocess.run(
            [TAPTREE] + args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            preexec_fn=limited,
            **kw,
        )
    except subprocess.TimeoutExpired:
        return "hang", ""
    return p.returncode, p.stderr.decode(errors="replace")


def panicked(code, err):
    # A Rust panic exits 101; an abort (failed allocation) dies by a signal.
    return code == 101 or (isinstance(code, int) and code < 0) or "panicked" in err


def classify(t, code, err, what, must_refuse=True):
    if code == "hang":
        t.hang += 1
        t.note("hang: " + what)
    elif panicked(code, err):
        t.panic += 1
        t.note("panic (%s): %s: %s" % (code, what, err.strip()[:200]))
    elif code == 0 and must_refuse:
        t.silent += 1
        t.note("silent pass: " + what)
    else:
        t.detected += 1


def mutate(rng, path):
    data = bytearray(open(path, "rb").read())
    kind = rng.choice(["flip", "flip", "truncate", "append"])
    i = None
    if kind == "flip" and data:
        i = rng.randrange(len(data))
        bit = 1 << rng.randrange(8)
        data[i] ^= bit
        what = "flip bit %d of byte %d" % (bit, i)
    elif kind == "truncate" and data:
        n = rng.randrange(len(data))
        data = data[:n]
        what = "truncate to %d bytes" % n
        i = None
    else:
        extra = rng.choice([b"\n", b" ", b"}", b"\x00", os.urandom(rng.randrange(1, 64))])
        data += extra
        what = "append %d bytes" % len(extra)
        i = None
    open(path, "wb").write(bytes(data))
    return what, i


def fresh_golden(work):
    """A tree of the format this build writes (2.3) of the tiny-q fixture, captured by this build."""
    out = os.path.join(work, "golden21")
    code, err = run(["capture", "--model", os.path.join(FIXTURES, "tiny-q.gguf"), "--tokens", "0,75,108,35,104", "--out", out])
    if code != 0:
        sys.exit("campaign: could not capture %s: %s" % (out, err))
    return out


def corruption(n, rng, work):
    t = Tally("corruption")
    bases = [GOLDEN, fresh_golden(work)]
    files = {}
    for base in bases:
        files[base] = []
        for d, _, names in os.walk(base):
            files[base] += [os.path.relpath(os.path.join(d, f), base) for f in names if f != ".taptree"]
        files[base].sort()
    for i in range(n):
        base = bases[i % 2]
        tree = os.path.join(work, "c%d" % i)
        shutil.copytree(base, tree)
        manifests = [f for f in ("manifest.json", "manifest.idx") if f in files[base]]
        rel = rng.choice(manifests) if rng.random() < 0.3 else rng.choice(files[base])
        what, at = mutate(rng, os.path.join(tree, rel))
        what = "%s: %s" % (rel, what)
        t.tried += 1
        code, err = run(["verify", tree])
        classify(t, code, err, "verify TREE: " + what)
        code, err = run(["verify", base, tree])
        if rel in manifests:
            t.tried += 1
            classify(t, code, err, "verify GOLDEN TREE: " + what)
        elif code == 0:
            t.contract += 1
        elif code == "hang" or panicked(code, err):
            t.tried += 1
            classify(t, code, err, "verify GOLDEN TREE: " + what)
        shutil.rmtree(tree)
    return t


def complete(tree):
    return run(["verify", tree])[0] == 0


def kills(n, rng, work):
    t = Tally("kill")
    model = os.path.join(FIXTURES, "tiny-q.gguf")
    parent = os.path.join(work, "kills")
    os.makedirs(parent)
    out = os.path.join(parent, "t")
    base = ["capture", "--model", model, "--tokens", "0,75,108,35,104", "--out", out]
    for i in range(n):
        force = i % 2 == 1
        old = force and os.path.exists(os.path.join(out, "manifest.json"))
        if not force:
            shutil.rmtree(out, ignore_errors=True)
        args = base + ["--gen", str(rng.randrange(1, 40))] + (["--force"] if force else [])
        p = subprocess.Popen([TAPTREE] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limited)
        time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        t.tried += 1
        # After the kill: a complete tree at the path (the old one or its
        # replacement), or, killed between the two renames of a replacement,
        # no path and the old tree set aside (the next capture restores it);
        # a first capture may leave an incomplete tree (no manifest).
        if os.path.exists(os.path.join(out, "manifest.json")):
            ok = complete(out)
        elif old:
            ok = not os.path.exists(out) and any(".t.taptree-old-" in n for n in os.listdir(parent))
        else:
            ok = True
        if not ok:
            t.silent += 1
            t.note("kill %d (%s): a damaged tree at the path" % (i, "force" if force else "fresh"))
            continue
        # The next capture cleans up whatever the killed one left.
        code, err = run(base + ["--gen", "1", "--force"])
        if code != 0 or not complete(out):
            if panicked(code, err) or code == "hang":
                classify(t, code, err, "capture after kill %d" % i)
            else:
                t.silent += 1
                t.note("kill %d: the next capture failed: %s" % (i, err.strip()[:200]))
            continue
        # The tree a --force capture replaced stays as the path's spare
        # (docs/FORMAT.md), a tree (incomplete if the replaced one was);
        # anything else is a leftover.
        spare = os.path.join(parent, ".t.taptree-spare")
        left = sorted(set(os.listdir(parent)) - {"t", ".t.taptree-spare"})
        if os.path.exists(spare) and not os.path.exists(os.path.join(spare, ".taptree")):
            left.append(".t.taptree-spare (not a tree)")
        if left:
            t.leaked += 1
            t.note("kill %d (%s): left %s" % (i, "force" if force else "fresh", left))
            for name in left:
                path = os.path.join(parent, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        else:
            t.detected += 1
    return t


def hostile(work):
    """Each case: (name, args) that must exit 2 with one line in time."""
    t = Tally("hostile")
    model = os.path.join(FIXTURES, "tiny-q.gguf")

    def tree(name, edit_manifest=None, edit=None):
        path = os.path.join(work, "h-" + name)
        shutil.copytree(GOLDEN, path)
        if edit_manifest:
            mpath = os.path.join(path, "manifest.json")
            m = json.load(open(mpath))
            edit_manifest(m)
            sys.path.insert(0, os.path.join(ROOT, "python"))
            from taptree import tree as taptree_tree

            m["dirs"], m["root"] = taptree_tree.tree_hashes(m["entries"], m)
            m["manifest_blake3"] = taptree_tree.UNSEALED
            raw = json.dumps(m, separators=(",", ":")).encode() + b"\n"
            open(mpath, "wb").write(taptree_tree.sealed(raw))
        if edit:
            edit(path)
        return path

    def first(m):
        return m["entries"][0]

    def shape(m):
        first(m)["shape"] = [first(m)["shape"][0], 1 << 40]
        first(m)["bytes"] = first(m)["shape"][0] * (1 << 40) * 4

    def layer(m):
        e = [e for e in m["entries"] if e["key"]["layer"] is not None][0]
        e["key"]["layer"] = 4294967295

    def positions(m):
        e = first(m)
        e["key"]["pos"] = {"start": 0, "end": 4294967295}
        e["shape"] = [4294967295, 0]
        e["bytes"] = 0

    def fifo(path):
        m = json.load(open(os.path.join(path, "manifest.json")))
        f = os.path.join(path, m["entries"][3]["path"])
        os.remove(f)
        os.mkfifo(f)

    def urandom(path):
        os.remove(os.path.join(path, "manifest.json"))
        os.symlink("/dev/urandom", os.path.join(path, "manifest.json"))

    def outside(path):
        other = os.path.join(work, "elsewhere.json")
        shutil.copy(os.path.join(GOLDEN, "manifest.json"), other)
        os.remove(os.path.join(path, "manifest.json"))
        os.symlink(other, os.path.join(path, "manifest.json"))

    def manifest_fifo(path):
        os.remove(os.path.join(path, "manifest.json"))
        os.mkfifo(os.path.join(path, "manifest.json"))

    cases = [
        ("overflowing shape", lambda: ["verify", tree("shape", shape)]),
        ("overflowing shape, ls", lambda: ["ls", tree("shape-ls", shape)]),
        ("layer 4294967295", lambda: ["diff", GOLDEN, tree("layer", layer)]),
        ("positions 0..4294967295", lambda: ["diff", GOLDEN, tree("pos", positions)]),
        ("tap file is a FIFO", lambda: ["verify", tree("fifo", edit=fifo)]),
        ("tap file is a FIFO, rehash", lambda: ["verify", "--rehash", GOLDEN, tree("fifo2", edit=fifo)]),
        ("manifest is /dev/urandom", lambda: ["verify", GOLDEN, tree("urandom", edit=urandom)]),
        ("manifest links outside", lambda: ["verify", GOLDEN, tree("outside", edit=outside)]),
        ("manifest is a FIFO", lambda: ["ls", tree("mfifo", edit=manifest_fifo)]),
        (
            "--gen 18446744073709551615",
            lambda: ["capture", "--model", model, "--tokens", "0,1", "--gen", "18446744073709551615", "--out", os.path.join(work, "never")],
        ),
        ("--tokens 1,,2", lambda: ["capture", "--model", model, "--tokens", "1,,2", "--out", os.path.join(work, "never")]),
        (
            "--select stage=ffn_dwon",
            lambda: ["capture", "--model", model, "--tokens", "1,2", "--select", "stage=ffn_dwon", "--out", os.path.join(work, "never")],
        ),
        ("tolerance 20,000 parentheses deep", lambda: ["diff", GOLDEN, GOLDEN, "-t", "(" * 20000 + "cos>=0.9" + ")" * 20000]),
    ]
    for name, args in cases:
        t.tried += 1
        start = time.time()
        code, err = run(args())
        took = time.time() - start
        if code == 2 and err.count("\n") == 1 and not os.path.exists(os.path.join(work, "never")):
            t.detected += 1
        else:
            classify(t, code, err, name)
            if code not in (0, "hang") and not panicked(code, err):
                t.silent += 1
                t.detected -= 1
                t.note("%s: exit %s, %d lines: %s" % (name, code, err.count("\n"), err.strip()[:200]))
        t.note("%s: exit %s in %.2f s: %s" % (name, code, took, err.strip()[:120])) if os.environ.get("VERBOSE") else None
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corruptions", type=int, default=1000)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not os.path.exists(TAPTREE):
        sys.exit("campaign: %s: no taptree binary (cargo build --release)" % TAPTREE)
    if not os.path.exists(os.path.join(FIXTURES, "tiny-q.gguf")):
        subprocess.run(
            ["cargo", "run", "--release", "-q", "-p", "fixtures", "--bin", "generate", "--", "models", FIXTURES],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="taptree-campaign.")
    try:
        started = time.time()
        tallies = [corruption(a.corruptions, rng, work), kills(a.kills, rng, work), hostile(work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("taptree campaign, seed %d, %.0f s" % (a.seed, time.time() - started))
    for t in tallies:
        print(t.line())
        for n in t.notes:
            print("    " + n)
    sys.exit(1 if any(t.bad() for t in tallies) else 0)


if __name__ == "__main__":
    main()
