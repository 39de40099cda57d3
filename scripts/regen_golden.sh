#!/usr/bin/env bash
# Rewrites the golden trees under fixtures/golden/ from fixtures/golden/specs.txt.
# Run after an intended change to the CPU forward's numerics; commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --bin taptree --bin taptree-full
cargo run --release -q -p fixtures --bin generate -- golden "$target/release/taptree" >/dev/null
