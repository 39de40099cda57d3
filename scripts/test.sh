#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Python side of the cross-checks: reading taps with safetensors.numpy, the
# gguf package's dequantization, the tokenizers library, a numpy reference forward.
python3 -m pip install --quiet --disable-pip-version-check numpy safetensors gguf tokenizers

cargo test --workspace --release
