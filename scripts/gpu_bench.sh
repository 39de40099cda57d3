#!/usr/bin/env bash
# The GPU figures of docs/PERFORMANCE.md from prebuilt binaries, on a machine
# with an NVIDIA GPU, its driver and NVRTC (no Rust needed there):
#
#   TAPTREE=path/to/taptree CUDA_PERF=path/to/cuda_perf MODEL=model.gguf scripts/gpu_bench.sh
#
# BACKEND=cpu times the CPU forward's armed capture the same way (no GPU, no
# cuda_perf; any taptree build): `BACKEND=cpu MODEL=model.gguf scripts/gpu_bench.sh`.
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
#   clock medians, and the ratio of the medians; SYNC_THREADS="8 64" repeats
#   it per TAPTREE_SYNC_THREADS value, WRITERS="4 8" per
#   TAPTREE_CAPTURE_WRITERS value, FRESH=1 writes every capture to a new
#   directory instead of replacing the last tree (no deletion in the timed
#   region). TAPTREE_TIMING=1 in the environment makes each capture print
#   its finish's phases (see the last capture's log); TAPTREE_SPARE=0 makes
#   each --force capture delete the tree it replaces instead of keeping it
#   as the next one's spare (docs/FORMAT.md).
set -uo pipefail

TAPTREE=${TAPTREE:-taptree}
BACKEND=${BACKEND:-cuda}
if [[ $BACKEND == cpu ]]; then
    CUDA_PERF=${CUDA_PERF:-none}
else
    CUDA_PERF=${CUDA_PERF:-cuda_perf}
fi
MODEL=${MODEL:?MODEL=path to the GGUF}
ROUNDS=${ROUNDS:-5}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
PROMPT=${PROMPT:-What is the capital of France?}
GEN=${GEN:-16}

echo "taptree: $TAPTREE; backend: $BACKEND; cuda_perf: $CUDA_PERF; model: $MODEL; rounds: $ROUNDS"
if [[ $BACKEND == cpu ]]; then
    echo "cpu: $(nproc) threads; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
else
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
fi

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

# One end-to-end comparison: ROUNDS rounds of the logits-only and the full
# capture, interleaved, after one warm-up of each. By default each replaces
# the last tree with --force, as a user re-running does, writing over the
# files of the tree replaced the time before (the spare); with
# TAPTREE_SPARE=0 it deletes the tree it replaces, and the filesystem's
# work for that (on ext4 mounted with discard, seconds) lands on the next
# capture. With FRESH=1 each capture writes a new
# directory and nothing is deleted until every round is done: the capture's
# own cost.
e2e() {
    local label=$1
    echo "=== armed capture end to end, $label: full tree vs logits only ($ROUNDS rounds, interleaved)"
    local base=("$TAPTREE" capture --model "$MODEL" --backend "$BACKEND" --chat "$PROMPT" --gen "$GEN")
    local force=(--force)
    [[ ${FRESH:-0} == 1 ]] && force=()
    local tag=""
    [[ ${FRESH:-0} == 1 ]] && tag="-ROUND"
    echo "\$ ${base[*]} ${force[*]} --out $WORK/logits$tag --select stage=logits"
    echo "\$ ${base[*]} ${force[*]} --out $WORK/full$tag"
    : >"$WORK/logits.s"
    : >"$WORK/full.s"
    local round
    for round in $(seq 0 "$ROUNDS"); do
        local l f sfx=""
        [[ ${FRESH:-0} == 1 ]] && sfx="-$round"
        l=$(timed "${base[@]}" "${force[@]}" --out "$WORK/logits$sfx" --select stage=logits)
        f=$(timed "${base[@]}" "${force[@]}" --out "$WORK/full$sfx")
        # Round 0 is the warm-up (the PTX cache, the page cache of the model).
        if ((round > 0)); then
            echo "$l" >>"$WORK/logits.s"
            echo "$f" >>"$WORK/full.s"
        fi
    done
    grep '^captured' "$WORK/last.log"
    l=$(median <"$WORK/logits.s")
    f=$(median <"$WORK/full.s")
    echo "logits only: $(xargs <"$WORK/logits.s") s; median $l s"
    echo "full tree:   $(xargs <"$WORK/full.s") s; median $f s"
    echo "full / logits-only ($label): x$(awk -v a="$f" -v b="$l" 'BEGIN {printf "%.2f", a / b}')"
    if [[ ${FRESH:-0} == 1 ]]; then
        du -sh "$WORK/full-$ROUNDS" "$WORK/logits-$ROUNDS" 2>/dev/null
        rm -rf "$WORK"/full-* "$WORK"/logits-*
    fi
}

# SYNC_THREADS="8 64": one comparison per TAPTREE_SYNC_THREADS value (the
# threads that fdatasync the tap files at the end); WRITERS="4 8" the same
# per TAPTREE_CAPTURE_WRITERS value (the threads that hash and write the
# taps); default: the built-in.
for w in ${WRITERS:-default}; do
    if [[ $w == default ]]; then
        unset TAPTREE_CAPTURE_WRITERS
    else
        export TAPTREE_CAPTURE_WRITERS=$w
    fi
    for t in ${SYNC_THREADS:-default}; do
        if [[ $t == default ]]; then
            unset TAPTREE_SYNC_THREADS
        else
            export TAPTREE_SYNC_THREADS=$t
        fi
        fresh_label=""; [[ ${FRESH:-0} == 1 ]] && fresh_label=", fresh trees"
        e2e "writers $w, sync threads $t$fresh_label"
    done
done
[[ ${FRESH:-0} == 1 ]] || du -sh "$WORK/full" "$WORK/logits" 2>/dev/null
