# taptree's common tasks. `just` lists them.

# List the recipes.
default:
    @just --list

# The main job: capture SmolLM2 in f32, q8, f64 and diff them (fetches the model once).
demo out="runs":
    bash scripts/demo.sh {{out}}

# Everything CI runs: Python cross-check deps, then the whole test suite.
test:
    bash scripts/test.sh

# No import cycle between the modules of any crate (the checker's self-test first).
cycles:
    python3 scripts/module_cycles.py --self-test
    python3 scripts/module_cycles.py

# Lints that must stay clean.
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings

# Build with the CUDA forward (needs no CUDA toolkit to build; a driver to run).
build-cuda:
    cargo build --release --features cuda

# Build taptree and the cuda_* test executables with CUDA and pack them into .device/ for a GPU machine.
gpu-bundle:
    bash scripts/gpu_matrix.sh --bundle

# On a GPU machine: the whole CUDA test matrix (kernel tests, CPU vs CUDA, batched vs single, figures).
gpu-matrix bundle=".device":
    bash scripts/gpu_matrix.sh {{bundle}}

# Tap cost (disarmed, armed but unselected), then the compiled-out baseline.
bench-tap:
    cargo bench -p capture --bench tap
    cargo bench -p capture --bench tap --features compile-out

# `taptree verify A B` and `--rehash` against `diff -rq` on two generated 7B-shaped trees (~1.9 GB, deleted after).
bench-verify runs="5":
    RUNS={{runs}} bash scripts/bench_verify.sh

# Trust campaign (not CI, minutes): random corruptions of a golden tree, captures killed mid-write, hostile inputs.
campaign corruptions="1000" kills="100" seed="1":
    cargo build --release --bin taptree --bin taptree-full
    cargo run --release -q -p fixtures --bin generate -- models target/fixtures >/dev/null
    python3 scripts/campaign.py --corruptions {{corruptions}} --kills {{kills}} --seed {{seed}}

# Fuzz one parser (manifest, index, tapfile, tolerance or gguf), or whole hostile trees through the command line (tree), for N seconds; a failure exits 1 and keeps its input.
fuzz target seconds="600" seed="1":
    cargo run --release -q -p fixtures --bin generate -- models target/fixtures >/dev/null
    cargo build --release --bin taptree --bin taptree-full
    cargo run --release --example fuzz -- {{target}} --seconds {{seconds}} --seed {{seed}}

# Rewrite the golden fixture trees (fixtures/golden/) after an intended change to the CPU forward's numerics.
golden:
    bash scripts/regen_golden.sh

# CPU forward throughput on SmolLM2 per precision, armed capture, then with taps compiled out.
bench-forward:
    cargo bench -p kernels --bench forward -- --save-baseline disarmed
    cargo bench -p kernels --bench forward --features capture/compile-out -- --baseline disarmed

# The f32 forward's logits against the independent numpy reference, on one prompt.
reference prompt="What is the capital of France?" out="runs/reference":
    cargo run --release -q -- capture --model smollm2 --chat "{{prompt}}" --select stage=logits --out {{out}} --force
    python3 scripts/reference_forward.py --model "$(cargo run --release -q -p fetch --example fetch_model 2>/dev/null | tail -1)" --tree {{out}}
