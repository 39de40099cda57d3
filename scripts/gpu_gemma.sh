#!/usr/bin/env bash
# Gemma 3 270M on CUDA against the CPU, on a machine with an NVIDIA GPU (no
# Rust needed there):
#
#   scripts/gpu_gemma.sh [BUNDLE]
#
# BUNDLE (default .device) holds bin.tar.gz from `scripts/gpu_matrix.sh
# --bundle` and the Gemma GGUF in parts (gemma.part*), which may arrive over
# several calls: they wait in $WORK until all are there, then are joined and
# checked against the sha256. Outputs: $OUT (default ./gpu-out)/gemma.log.
#
# Steps (each logged with its exact command; STEPS=q8: the q8 ones only):
# the kernel and forward tests;
# the 16 greedy tokens of the France chat prompt and of a story prompt on
# CUDA and CPU (f32); CPU f32 vs CUDA f32 over every stage and position;
# batched m=4 vs each prompt alone (bitwise), with a control that must fail;
# CUDA q8 against CPU q8 (and both against the f64 truth).
set -uo pipefail

MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
BUNDLE=$(cd "${1:-.device}" && pwd)
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-/tmp/taptree-gpu}
mkdir -p "$OUT" "$WORK/bin"
LOG=$OUT/gemma.log
exec > >(tee -a "$LOG") 2>&1

source "$(dirname "$0")/gpu_env.sh"

# The tests need no model: with TESTS=1 they run before the parts are
# counted (so the first call of several does useful work), else once the
# model is complete.
tests() {
    step "device"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    step "differential kernel tests and forward tests"
    for t in cuda_kernels cuda_kernels_q8 cuda_kernels_gemma cuda_forward cuda_fused cuda_chain; do
        run "$t" --test-threads=1
    done
}
[[ ${TESTS:-0} == 1 ]] && tests

for p in "$BUNDLE"/gemma.part*; do
    [[ -f $p ]] && cp "$p" "$WORK/"
done
MODEL=$WORK/gemma.gguf
if [[ ! -f $MODEL ]] && [[ $(ls "$WORK"/gemma.part* 2>/dev/null | wc -l) == "${PARTS:-7}" ]]; then
    cat "$WORK"/gemma.part* > "$MODEL.tmp" && mv "$MODEL.tmp" "$MODEL"
    if [[ $(sha256sum "$MODEL" | cut -d' ' -f1) != "$MODEL_SHA256" ]]; then
        echo "model: sha256 mismatch (parts damaged): $(ls "$WORK"/gemma.part* | xargs)"
        rm -f "$MODEL"
    fi
fi
if [[ ! -f $MODEL ]]; then
    echo "parts so far: $(ls "$WORK"/gemma.part* 2>/dev/null | xargs)"
    exit 0
fi
echo "model: $MODEL sha256 $MODEL_SHA256 (verified)"
[[ ${TESTS:-0} == 1 ]] || tests

cd "$WORK"
rm -rf runs
Q="What is the capital of France?"
S="Once upon a time, there was a fox named"

# STEPS=q8 runs only the q8 steps (and the f32 capture they compare with).
if [[ ${STEPS:-all} == q8 ]]; then
    run taptree capture --model "$MODEL" --backend cuda --precision f32 --chat "$Q" --gen 16 --out runs/cuda-f32
else
step "greedy tokens, 16 steps, CUDA and CPU (f32)"
run taptree capture --model "$MODEL" --backend cuda --precision f32 --chat "$Q" --gen 16 --out runs/cuda-f32
run taptree capture --model "$MODEL" --backend cpu --precision f32 --chat "$Q" --gen 16 --out runs/cpu-f32
run taptree capture --model "$MODEL" --backend cuda --precision f32 --prompt "$S" --gen 16 --out runs/cuda-story
run taptree capture --model "$MODEL" --backend cpu --precision f32 --prompt "$S" --gen 16 --out runs/cpu-story

step "CPU f32 vs CUDA f32, every stage and position"
run taptree diff runs/cpu-f32 runs/cuda-f32 --only-red
run taptree diff runs/cpu-f32 runs/cuda-f32 --controls --only-red
run taptree diff runs/cpu-story runs/cuda-story --only-red
run taptree diff runs/cpu-f32 runs/cuda-f32 --bitwise --only-red --sort growth

step "batched m=4 vs each prompt alone"
P=("$Q" "Name three primary colors." "What is 2+2?" "Write a haiku about the sea.")
run taptree capture --model "$MODEL" --backend cuda --chat "${P[0]}" --chat "${P[1]}" --chat "${P[2]}" --chat "${P[3]}" --gen 8 --out runs/cuda-m4
for i in 0 1 2 3; do
    run taptree capture --model "$MODEL" --backend cuda --chat "${P[$i]}" --gen 8 --out runs/cuda-m1-$i
    run taptree diff runs/cuda-m4 runs/cuda-m1-$i --slot-a $i --slot-b none --bitwise
done
echo "control: slot 1 against prompt 0 alone must not pass"
run taptree diff runs/cuda-m4 runs/cuda-m1-0 --slot-a 1 --slot-b none --only-red
fi

step "q8: CUDA vs CPU (Q8_K activations for the K-quant weights, Q8_0 for the others)"
run taptree capture --model "$MODEL" --backend cpu --precision q8 --chat "$Q" --gen 16 --out runs/cpu-q8
run taptree capture --model "$MODEL" --backend cuda --precision q8 --chat "$Q" --gen 16 --out runs/cuda-q8
run taptree capture --model "$MODEL" --backend cpu --precision f64 --chat "$Q" --gen 16 --out runs/cpu-f64
run taptree diff runs/cpu-q8 runs/cuda-q8 --only-red
run taptree diff runs/cpu-q8 runs/cuda-q8 --controls --only-red
run taptree diff runs/cpu-q8 runs/cuda-q8 --truth runs/cpu-f64 --only-red
echo "where CPU q8 and CUDA q8 first differ at all (layers 0-1, every op)"
taptree diff runs/cpu-q8 runs/cuda-q8 --bitwise --all-metrics --color never | grep -E '^(op|embedding|L0/|L1/)|first diverging|bitwise'
run taptree diff runs/cuda-f32 runs/cuda-q8 --truth runs/cpu-f64 --only-red
echo "control: two CUDA q8 captures are identical"
run taptree capture --model "$MODEL" --backend cuda --precision q8 --chat "$Q" --gen 16 --out runs/cuda-q8-again
run taptree verify runs/cuda-q8 runs/cuda-q8-again
