#!/usr/bin/env bash
# The CUDA tensor-parallel matrix in one command, on a machine with an
# NVIDIA GPU, its driver and NVRTC (docs/TP.md, "CUDA"):
#
#   scripts/gpu_tp.sh [BUNDLE]
#
# BUNDLE (default .device) as for scripts/gpu_matrix.sh: bin.tar.gz (taptree
# built with --features cuda and the cuda_tp test executable, from
# `scripts/gpu_tp.sh --bundle`) and the SmolLM2 GGUF whole or in parts.
# NCCL: cudarc loads `libnccl.so`; a pip wheel (nvidia-nccl-cu12, which
# torch installs) ships only libnccl.so.2, so it is linked under that name
# into $WORK/lib, on LD_LIBRARY_PATH. NVLink multicast stays off.
#
# STAGE=model skips the tests (a second call, once the model's parts are
# all there). Steps: the cuda_tp tests (NCCL with one rank; two GPUs if there are); on
# SmolLM2, CUDA TP=2 and TP=4 with every rank on one GPU
# (TAPTREE_CUDA_TP=shared) against CPU TP=2, CUDA TP=1 and CPU TP=1; the
# planted fault; --tp 2 through NCCL (refused with one GPU).
set -uo pipefail

MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [[ "${1:-}" == "--bundle" ]]; then
    set -e
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-cuda}
    cargo build --release --features cuda
    cargo test --release --features cuda -p kernels --test cuda_tp --no-run
    stage=$(mktemp -d)
    # taptree is the front (the tree commands); taptree-full, beside it, runs the rest.
    for b in taptree taptree-full; do strip -o "$stage/$b" "$CARGO_TARGET_DIR/release/$b"; done
    f=$(ls -t "$CARGO_TARGET_DIR"/release/deps/cuda_tp-* | grep -v '\.d$' | head -1)
    strip -o "$stage/cuda_tp" "$f"
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
LOG=$OUT/tp.log
exec > >(tee -a "$LOG") 2>&1

source "$(dirname "$0")/gpu_env.sh"
export NCCL_NVLS_ENABLE=0

nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
if [[ ! -f ${nccl:-} ]]; then
    nccl=$(find / -xdev -name 'libnccl.so*' 2>/dev/null | head -1)
fi
if [[ -f ${nccl:-} ]]; then
    ln -sf "$nccl" "$WORK/lib/libnccl.so"
    export LD_LIBRARY_PATH=$WORK/lib:${LD_LIBRARY_PATH:-}
fi

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
echo "nvrtc: ${nvrtc:-not found}; nccl: ${nccl:-not found}"

join_model
if [[ ${STAGE:-all} != model ]]; then
    step "cuda_tp tests"
    run cuda_tp --test-threads=1 --nocapture
fi

if [[ ! -f $MODEL ]]; then
    echo "no model in $BUNDLE or $WORK: the real-model steps are skipped"
    exit 0
fi
echo "model: $MODEL sha256 $MODEL_SHA256 (verified)"
cd "$WORK"
rm -rf runs
Q="What is the capital of France?"
cap() { run taptree capture --model "$MODEL" --chat "$Q" --gen 8 "$@"; }

step "captures: CUDA TP=1, CUDA TP=2 and TP=4 (ranks on one GPU), CPU TP=1 and TP=2"
cap --backend cuda --out runs/cuda-tp1
TAPTREE_CUDA_TP=shared cap --backend cuda --tp 2 --out runs/cuda-tp2
TAPTREE_CUDA_TP=shared cap --backend cuda --tp 4 --out runs/cuda-tp4
cap --backend cpu --out runs/cpu-tp1
cap --backend cpu --tp 2 --out runs/cpu-tp2

step "CUDA TP=2 against CPU TP=2, row by row"
run taptree diff runs/cuda-tp2 runs/cpu-tp2
step "CUDA TP=2 against CUDA TP=1 (unsharded)"
run taptree diff runs/cuda-tp2 runs/cuda-tp1
step "CUDA TP=4 against CUDA TP=1, CUDA TP=2 against CPU TP=1"
run taptree diff runs/cuda-tp4 runs/cuda-tp1 --only-red
run taptree diff runs/cuda-tp2 runs/cpu-tp1 --only-red
step "a second CUDA TP=2 capture: bitwise the first?"
TAPTREE_CUDA_TP=shared cap --backend cuda --tp 2 --out runs/cuda-tp2-again
run taptree verify runs/cuda-tp2 runs/cuda-tp2-again

step "planted fault: rank 1 skips its o_proj contribution in layer 5"
TAPTREE_FAULT_TP_SKIP_ALLREDUCE=1@5/o_proj TAPTREE_CUDA_TP=shared cap --backend cuda --tp 2 --out runs/cuda-tp2-bug
run taptree diff runs/cuda-tp2-bug runs/cuda-tp1 --only-red
run taptree diff runs/cuda-tp2-bug runs/cuda-tp2 --only-red

step "--tp 2 through NCCL (one GPU per rank)"
cap --backend cuda --tp 2
