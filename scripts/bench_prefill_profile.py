#!/usr/bin/env python3
"""Where a prefill's time goes, binary against binary, interleaved: each
round runs every variant at every thread count and precision (the
variants' order rotated round by round), each a `TAPTREE_CPU_PROFILE=1`
capture of the 37-token chat prompt keeping the logits, unpinned (so a
count above the machine's cores oversubscribes it).

  VARIANTS    "name=binary[:VAR=value...] ..." (the first is the reference)
  THREADS     RAYON_NUM_THREADS values (default "2 16")
  PRECISIONS  default "f32 q8"
  ROUNDS      default 5
  MODEL       for `capture --model` (default smollm2)

Prints, per variant, count and precision, the medians of the profile's
forward ms, serial ms (of it the tap's and `other`'s), the regions' util
and the capture's tokens/s, and where the layers' matmul regions' thread
time went (work, join, end, absent, between: the profile's second table),
the tasks' busy ms summed over threads, and how much of the forward the
threads spent on their CPUs, waiting for one, and neither (the profile's
last lines, where the build prints them); then each variant's per-round
differences from the first variant (same round, same count), medians.
"""
import os, re, statistics, subprocess, sys
from bench_forward import variants
if not os.environ.get("VARIANTS"):
    sys.exit("bench_prefill_profile.py: VARIANTS=\"name=binary[:VAR=value...] ...\" is required")
vs = variants()
threads = [int(t) for t in os.environ.get("THREADS", "2 16").split()]
precs = os.environ.get("PRECISIONS", "f32 q8").split()
rounds = int(os.environ.get("ROUNDS", "5"))
model = os.environ.get("MODEL", "smollm2")
res = {}
for r in range(rounds):
    for t in threads:
        for p in precs:
            k = r % len(vs)
            for name, b, e in vs[k:] + vs[:k]:
                env = dict(os.environ, RAYON_NUM_THREADS=str(t), TAPTREE_CPU_PROFILE="1", **e)
                out = subprocess.run([b, "capture", "--model", model, "--chat", "What is the capital of France?",
                                      "--precision", p, "--select", "stage=logits", "--out", f"/tmp/pfb-{name}", "--force"],
                                     capture_output=True, text=True, env=env)
                s = out.stdout + out.stderr
                fwd = float(re.search(r"threads, ([0-9.]+) ms", s).group(1))
                tot = re.search(r"^total\s+([0-9.]+)\s+([0-9.]+)\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+(\d+)%", s, re.M)
                row = lambda op: float(re.search(rf"^{op}\s+\d+\s+[0-9.]+\s+([0-9.]+)", s, re.M).group(1))
                rate = float(re.search(r"forward [0-9.]+ s, ([0-9.]+) positions/s", s).group(1))
                root = re.search(r"root ([0-9a-f]{8})", s).group(1)
                # The idle split (none from a build before the profile had it).
                m = re.search(r"^matmul\s+(\d+)%\s+(\d+)%\s+(\d+)%\s+(\d+)%\s+(\d+)%", s, re.M)
                split = [int(v) for v in m.groups()] if m else None
                # The threads on their CPUs (none from a build before the profile had it).
                c = re.search(r"on cpu ([0-9.]+)%, waiting for a cpu ([0-9.]+)%, neither ([0-9.]+)%.*?"
                              r"(\d+) times asked \(sleeps\), (\d+) not", s)
                oncpu = [float(v) for v in c.groups()] if c else None
                d = res.setdefault((name, t, p), [])
                d.append(dict(fwd=fwd, serial=float(tot.group(2)), tap=row("tap"), other=row("other"),
                              util=int(tot.group(5)), busy=float(tot.group(4)), tps=rate, root=root,
                              split=split, oncpu=oncpu))
    print(f"round {r} load {os.getloadavg()[0]:.2f}: " + " ".join(
        f"{n}/{t}/{p}={res[(n,t,p)][-1]['tps']:.0f}" for t in threads for p in precs for n,_,_ in vs), flush=True)
med = lambda xs: statistics.median(xs)
print(f"\nmedians of {rounds} rounds: forward ms / serial ms (tap, other) / regions' util / tok/s [min-max]")
for p in precs:
    for t in threads:
        for n, _, _ in vs:
            d = res[(n, t, p)]
            tps = [x['tps'] for x in d]
            print(f"{p} {t:>2} thr {n:>5}: {med([x['fwd'] for x in d]):7.2f} / {med([x['serial'] for x in d]):5.2f} "
                  f"({med([x['tap'] for x in d]):.2f}, {med([x['other'] for x in d]):.2f}) / {med([x['util'] for x in d]):.0f}% / "
                  f"{med(tps):6.1f} [{min(tps):.0f}-{max(tps):.0f}]  roots {sorted(set(x['root'] for x in d))}")
            # The medians of a listed field, where every round's build printed it.
            cols = lambda key: [med(v) for v in zip(*(x[key] for x in d))] if all(x[key] for x in d) else None
            if split := cols('split'):
                print("           matmul regions: " + ", ".join(f"{k} {v:.0f}%" for k, v in
                      zip(["work", "join", "end", "absent", "between"], split)))
            print(f"           busy {med([x['busy'] for x in d]):.1f} ms summed over threads")
            if c := cols('oncpu'):
                print(f"           threads: on cpu {c[0]:.1f}%, waiting {c[1]:.1f}%, neither {c[2]:.1f}%; "
                      f"switched out {c[3]:.0f} asked, {c[4]:.0f} not")
    for n, _, _ in vs:
        a, b = med([x['tps'] for x in res[(n, threads[-1], p)]]), med([x['tps'] for x in res[(n, threads[0], p)]])
        print(f"{p} {n}: {threads[-1]} over {threads[0]} threads {a/b:.2f}x")
print("\npaired per round (each variant against the first, same round, same count): median of forward ms differences")
for p in precs:
    for t in threads:
        b0 = res[(vs[0][0], t, p)]
        for n, _, _ in vs[1:]:
            d = [x['fwd'] - y['fwd'] for x, y in zip(res[(n, t, p)], b0)]
            s = [x['serial'] - y['serial'] for x, y in zip(res[(n, t, p)], b0)]
            print(f"{p} {t:>2} thr {n} - {vs[0][0]}: forward {med(d):+.2f} ms (rounds faster: {sum(x < 0 for x in d)}/{len(d)}), serial {med(s):+.2f} ms")
