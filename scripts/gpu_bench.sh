#!/usr/bin/env bash
# The GPU figures of docs/PERFORMANCE.md from prebuilt binaries, on a machine
# with an NVIDIA GPU, its driver and NVRTC (no Rust needed there):
#
#   TAPTREE=path/to/taptree CUDA_PERF=path/to/cuda_perf MODEL=model.gguf scripts/gpu_bench.sh
#
# TAPTREE is taptree built with --features cuda, CUDA_PERF the cuda_perf test
# executable (`cargo test --release --features cuda -p kernels --test
# cuda_perf --no-run`; scripts/gpu_matrix.sh --bundle packs both; CUDA_PERF=none
# skips it). Prints:
#
# - cuda_perf's figures: prefill and decode tokens/s (decode launch by launch
#   and as a CUDA graph), batched decode, the armed capture's cost inside one
#   process, the tap copies;
# - the armed capture's cost end to end, as a user meets it: `taptree
#   capture` of a full tree against the same run keeping only the logits
#   (--select stage=logits), ROUNDS rounds (default 5) interleaved, wall
#   clock medians, and the ratio of the medians.
set -uo pipefail

TAPTREE=${TAPTREE:-taptree}
CUDA_PERF=${CUDA_PERF:-cuda_perf}
MODEL=${MODEL:?MODEL=path to the GGUF}
ROUNDS=${ROUNDS:-5}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
PROMPT=${PROMPT:-What is the capital of France?}
GEN=${GEN:-16}

echo "taptree: $TAPTREE; cuda_perf: $CUDA_PERF; model: $MODEL; rounds: $ROUNDS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1

if [[ $CUDA_PERF != none ]]; then
    echo "=== cuda_perf"
    echo "\$ TAPTREE_MODEL=$MODEL $CUDA_PERF --test-threads=1 --nocapture gpu_figures"
    TAPTREE_MODEL=$MODEL "$CUDA_PERF" --test-threads=1 --nocapture gpu_figures 2>&1 | grep -v '^test \|^running\|^$'
fi

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# Wall seconds of one command, its output to $WORK/last.log.
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$WORK/last.log" 2>&1 || { echo "failed: $*"; cat "$WORK/last.log"; exit 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
}

echo "=== armed capture end to end: full tree vs logits only ($ROUNDS rounds, interleaved)"
base=("$TAPTREE" capture --model "$MODEL" --backend cuda --chat "$PROMPT" --gen "$GEN" --force)
echo "\$ ${base[*]} --out $WORK/logits --select stage=logits"
echo "\$ ${base[*]} --out $WORK/full"
: >"$WORK/logits.s"
: >"$WORK/full.s"
# One warm-up of each (the PTX cache, the page cache of the model).
timed "${base[@]}" --out "$WORK/logits" --select stage=logits >/dev/null
timed "${base[@]}" --out "$WORK/full" >/dev/null
for _ in $(seq "$ROUNDS"); do
    timed "${base[@]}" --out "$WORK/logits" --select stage=logits >>"$WORK/logits.s"
    timed "${base[@]}" --out "$WORK/full" >>"$WORK/full.s"
done
grep '^captured' "$WORK/last.log"
l=$(median <"$WORK/logits.s")
f=$(median <"$WORK/full.s")
echo "logits only: $(xargs <"$WORK/logits.s") s; median $l s"
echo "full tree:   $(xargs <"$WORK/full.s") s; median $f s"
echo "full / logits-only: x$(awk -v a="$f" -v b="$l" 'BEGIN {printf "%.2f", a / b}')"
du -sh "$WORK/full" "$WORK/logits" 2>/dev/null
