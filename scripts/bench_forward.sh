#!/usr/bin/env bash
# taptree's CPU forward against llama.cpp (llama-cpp-python) on the same
# model, prompts and cores, interleaved; prints per-round figures and the
# medians of the quiet rounds (scripts/bench_forward.py says what is timed).
#
#   scripts/bench_forward.sh                      # builds target/release/taptree
#   TAPTREE=path/to/taptree scripts/bench_forward.sh   # a prebuilt binary, no cargo
#
#   SCALING="2 4 8 16" scripts/bench_forward.sh   # taptree's prefill at each
#                                                 # thread count (no llama.cpp)
#
# Settings: THREADS (2), CPUS (the CPU list both run on, default 0..THREADS-1),
# ROUNDS (5), GEN (64 decode steps), MODEL (smollm2), PRECISIONS ("f32 q8
# llamacpp": the taptree precisions timed). Needs llama-cpp-python
# and numpy.
set -euo pipefail
[ -z "${TAPTREE:-}" ] || TAPTREE=$(realpath "$TAPTREE")
cd "$(dirname "$0")/.."
if [ -z "${TAPTREE:-}" ]; then
  cargo build --release -q --bin taptree --bin taptree-full
  TAPTREE=${CARGO_TARGET_DIR:-target}/release/taptree
fi
THREADS=${THREADS:-2}
CPUS=${CPUS:-0-$((THREADS - 1))}
export TAPTREE THREADS RAYON_NUM_THREADS=$THREADS
if [ -n "${SCALING:-}" ]; then
  exec python3 scripts/bench_forward.py
fi
exec taskset -c "$CPUS" python3 scripts/bench_forward.py
