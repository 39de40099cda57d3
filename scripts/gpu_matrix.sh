#!/usr/bin/env bash
# The whole GPU test matrix in one command, on a machine with an NVIDIA GPU,
# its driver and NVRTC (no Rust needed there):
#
#   scripts/gpu_matrix.sh [BUNDLE]
#
# BUNDLE (default .device) holds what `scripts/gpu_matrix.sh --bundle` made on
# the build machine: bin.tar.gz (taptree and taptree-full built with --features cuda and the
# cuda_* test executables) and the SmolLM2 GGUF, whole (model.gguf) or in
# parts (model.part*) joined here and checked against its sha256. Outputs:
# $OUT (default ./gpu-out): matrix.log, the reports; trees under $WORK/runs.
#
#   scripts/gpu_matrix.sh --bundle   # on the build machine: build and pack
#
# STAGE=tests stops after the tests; STAGE=model skips them (the model's
# parts may come in later calls on the same machine).
#
# Steps (each logged with its exact command): the per-kernel differential
# tests and the forward tests; the greedy chat answer on CUDA and CPU; CPU
# f32 vs CUDA f32 over every stage and position, with the f64 truth; two
# CUDA captures (bitwise identical?); batched m=4 vs each prompt alone, with
# its controls; CUDA q8 vs CPU q8; the figures (tokens/s, capture cost, tap
# copy throughput vs pinned copy bandwidth).
set -uo pipefail

MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [[ "${1:-}" == "--bundle" ]]; then
    set -e
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-cuda}
    cargo build --release --features cuda
    cargo test --release --features cuda -p kernels --test cuda_kernels --test cuda_kernels_q8 --test cuda_kernels_gemma --test cuda_forward --test cuda_fused --test cuda_chain --test cuda_perf --test cuda_tp --no-run
    stage=$(mktemp -d)
    # taptree is the front (the tree commands); taptree-full, beside it, runs the rest.
    for b in taptree taptree-full; do strip -o "$stage/$b" "$CARGO_TARGET_DIR/release/$b"; done
    for t in cuda_kernels cuda_kernels_q8 cuda_kernels_gemma cuda_forward cuda_fused cuda_chain cuda_perf cuda_tp; do
        f=$(ls -t "$CARGO_TARGET_DIR"/release/deps/$t-* | grep -v '\.d$' | head -1)
        strip -o "$stage/$t" "$f"
    done
    mkdir -p .device
    tar -C "$stage" -czf .device/bin.tar.gz .
    rm -rf "$stage"
    ls -la .device
    exit 0
fi

BUNDLE=$(cd "${1:-.device}" && pwd)
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-/tmp/taptree-gpu}
mkdir -p "$OUT" "$WORK/bin"
LOG=$OUT/matrix.log
exec > >(tee -a "$LOG") 2>&1

source "$(dirname "$0")/gpu_env.sh"

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
echo "nvrtc: ${nvrtc:-not found}"

# The model: parts may arrive in separate calls; they wait in $WORK.
join_model

# STAGE=model skips the tests (run already by STAGE=tests in an earlier call).
if [[ ${STAGE:-all} != model ]]; then
    step "differential kernel tests and forward tests"
    run cuda_kernels --test-threads=1 --nocapture
    run cuda_kernels_q8 --test-threads=1 --nocapture
    run cuda_kernels_gemma --test-threads=1 --nocapture
    run cuda_forward --test-threads=1 --nocapture
    run cuda_fused --test-threads=1 --nocapture
    run cuda_chain --test-threads=1 --nocapture
    # The tensor-parallel forward (its NCCL tests skip without libnccl.so;
    # the real-model TP matrix is scripts/gpu_tp.sh).
    run cuda_tp --test-threads=1 --nocapture
fi

if [[ ! -f $MODEL ]]; then
    echo "no model in $BUNDLE or $WORK: the real-model steps are skipped"
    exit 0
fi
echo "model: $MODEL sha256 $MODEL_SHA256 (verified)"
if [[ ${STAGE:-all} == tests ]]; then
    exit 0
fi
cd "$WORK"
rm -rf runs
Q="What is the capital of France?"

step "greedy chat answer, CUDA and CPU"
run taptree capture --model "$MODEL" --backend cuda --chat "$Q" --gen 24
run taptree capture --model "$MODEL" --backend cpu --chat "$Q" --gen 24

step "CPU f32 vs CUDA f32, every stage and position (prompt + 8 generated)"
run taptree capture --model "$MODEL" --backend cpu --precision f32 --chat "$Q" --gen 8 --out runs/cpu-f32
run taptree capture --model "$MODEL" --backend cuda --precision f32 --chat "$Q" --gen 8 --out runs/cuda-f32
run taptree capture --model "$MODEL" --backend cpu --precision f64 --chat "$Q" --gen 8 --out runs/cpu-f64
run taptree diff runs/cpu-f32 runs/cuda-f32 --all-metrics --html "$OUT/cpu-vs-cuda.html"
run taptree diff runs/cpu-f32 runs/cuda-f32 --truth runs/cpu-f64 --only-red
run taptree diff runs/cpu-f32 runs/cuda-f32 --bitwise --only-red --sort growth
run taptree diff runs/cpu-f32 runs/cuda-f32 --controls --only-red

step "two CUDA captures of the same run"
run taptree capture --model "$MODEL" --backend cuda --precision f32 --chat "$Q" --gen 8 --out runs/cuda-f32-again
run taptree verify runs/cuda-f32 runs/cuda-f32-again

step "batched m=4 vs each prompt alone"
P=("$Q" "Name three primary colors." "What is 2+2?" "Write a haiku about the sea.")
run taptree capture --model "$MODEL" --backend cuda --chat "${P[0]}" --chat "${P[1]}" --chat "${P[2]}" --chat "${P[3]}" --gen 8 --out runs/cuda-m4
for i in 0 1 2 3; do
    run taptree capture --model "$MODEL" --backend cuda --chat "${P[$i]}" --gen 8 --out runs/cuda-m1-$i
    run taptree diff runs/cuda-m4 runs/cuda-m1-$i --slot-a $i --slot-b none --bitwise
done
echo "control: the batched run twice"
run taptree capture --model "$MODEL" --backend cuda --chat "${P[0]}" --chat "${P[1]}" --chat "${P[2]}" --chat "${P[3]}" --gen 8 --out runs/cuda-m4-again
run taptree verify runs/cuda-m4 runs/cuda-m4-again
echo "control: a slot fed a different prompt must not pass for another (slot 1 against prompt 0 alone: the diff must stop where the inputs differ)"
run taptree diff runs/cuda-m4 runs/cuda-m1-0 --slot-a 1 --slot-b none --only-red
echo "control: batched CPU (slots run one by one) against batched CUDA"
run taptree capture --model "$MODEL" --backend cpu --chat "${P[0]}" --chat "${P[1]}" --chat "${P[2]}" --chat "${P[3]}" --gen 8 --out runs/cpu-m4
run taptree diff runs/cpu-m4 runs/cuda-m4 --only-red

step "CUDA q8 (DP4A) vs CPU q8"
run taptree capture --model "$MODEL" --backend cpu --precision q8 --chat "$Q" --gen 8 --out runs/cpu-q8
run taptree capture --model "$MODEL" --backend cuda --precision q8 --chat "$Q" --gen 8 --out runs/cuda-q8
run taptree diff runs/cpu-q8 runs/cuda-q8 --truth runs/cpu-f64 --only-red
echo "where CPU q8 and CUDA q8 first differ at all, and by how many ulps (layers 0-1)"
taptree diff runs/cpu-q8 runs/cuda-q8 --bitwise --all-metrics --color never | grep -E '^(op|embedding|L0/|L1/)|first diverging'
run taptree diff runs/cuda-f32 runs/cuda-q8 --truth runs/cpu-f64 --only-red

step "figures"
TAPTREE_MODEL=$MODEL run cuda_perf --test-threads=1 --nocapture
du -sh runs/* 2>/dev/null
