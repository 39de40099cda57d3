#!/usr/bin/env python3
"""The straightforward numpy + safetensors peer of `taptree diff`.

Reads two trees' manifests, loads each matched tap with
safetensors.numpy.load_file, and computes per position, in float64, the
metrics taptree computes: cosine, max abs, max rel, RMSE, NMSE, SQNR dB, max
ULP distance (same dtype), bitwise-equal count, argmax agreement, nonfinite
and zero counts per side. No hash skipping: every matched tap is read (that
is the point of comparison for scripts/bench_diff.sh).

usage: numpy_diff.py A B           ->  positions, bytes, seconds, GB/s (JSON)
       numpy_diff.py A B --dump    ->  one JSON line of metrics per position
                                       (the cross-check in tests/diff_cli.rs)
"""

import json
import sys
import time

import numpy as np
from safetensors.numpy import load_file


def ordinal(x):
    """Position in the ordered set of representable values (-0.0 == 0.0)."""
    if x.dtype == np.float32:
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, np.int64(-(2**31)) - i, i)
    if x.dtype == np.float16:
        i = x.view(np.int16).astype(np.int64)
        return np.where(i < 0, np.int64(-(2**15)) - i, i)
    if x.dtype == np.float64:
        i = x.view(np.int64).astype(object)
        return np.where(i < 0, -(2**63) - i, i)
    return x.astype(np.int64)


def metrics(a, b):
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    xf, yf = x[both], y[both]
    d = xf - yf
    saa, sbb, sab, sdd = xf @ xf, yf @ yf, xf @ yf, d @ d
    if saa == 0 and sbb == 0:
        cos = 1.0
    elif saa == 0 or sbb == 0:
        cos = 0.0
    else:
        cos = sab / np.sqrt(saa * sbb)
    nmse = 0.0 if sdd == 0 else (np.inf if saa == 0 else sdd / saa)
    ad = np.abs(d)
    m = np.maximum(np.abs(xf), np.abs(yf))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(m > 0, ad / m, 0.0)
    same = a.dtype == b.dtype
    ulp = int(np.max(np.abs(ordinal(a[both]) - ordinal(b[both])))) if same and both.any() else 0
    nan_same = np.isnan(x) & np.isnan(y)
    inf_same = np.isinf(x) & (x == y)
    return {
        "cos": float(cos),
        "max_abs": float(ad.max()) if ad.size else 0.0,
        "max_rel": float(rel.max()) if rel.size else 0.0,
        "rmse": float(np.sqrt(sdd / max(d.size, 1))),
        "nmse": float(nmse),
        "sqnr_db": float(-10 * np.log10(nmse)) if nmse > 0 else float("inf"),
        "max_ulp": ulp,
        "bitwise_equal": int(np.count_nonzero(a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")))
        if same
        else 0,
        "argmax_agree": bool(np.argmax(np.where(fa, x, -np.inf)) == np.argmax(np.where(fb, y, -np.inf))),
        "nonfinite_a": int((~fa).sum()),
        "nonfinite_b": int((~fb).sum()),
        "nonfinite_mismatch": int((~both & ~nan_same & ~inf_same).sum()),
        "zero_a": int((x == 0).sum()),
        "zero_b": int((y == 0).sum()),
    }


def positions(tree):
    manifest = json.load(open(f"{tree}/manifest.json"))
    out = {}
    for e in manifest["entries"]:
        k = e["key"]
        for row, pos in enumerate(range(k["pos"]["start"], k["pos"]["end"])):
            out[(k["stage"], k["layer"], k.get("slot"), pos)] = (e["path"], row)
    return out


def main():
    a_tree, b_tree = sys.argv[1], sys.argv[2]
    dump = "--dump" in sys.argv[3:]
    start = time.perf_counter()
    pa, pb = positions(a_tree), positions(b_tree)
    cache = {}

    def row(tree, path, r):
        key = (tree, path)
        if key not in cache:
            cache.clear() if len(cache) > 4 else None
            cache[key] = next(iter(load_file(f"{tree}/{path}").values()))
        t = cache[key]
        return t[r].reshape(-1)

    n_pos, nbytes, worst = 0, 0, 1.0
    for key in sorted(pa, key=lambda k: (pa[k][0], pa[k][1])):
        if key not in pb:
            continue
        a = row(a_tree, *pa[key])
        b = row(b_tree, *pb[key])
        m = metrics(a, b)
        if dump:
            stage, layer, slot, pos = key
            print(json.dumps({"stage": stage, "layer": layer, "slot": slot, "pos": pos, **m}))
        worst = min(worst, m["cos"])
        n_pos += 1
        nbytes += a.nbytes + b.nbytes
    secs = time.perf_counter() - start
    if dump:
        return
    print(json.dumps({"positions": n_pos, "bytes": nbytes, "seconds": secs,
                      "gb_per_s": nbytes / secs / 1e9, "min_cos": worst}))


if __name__ == "__main__":
    main()
