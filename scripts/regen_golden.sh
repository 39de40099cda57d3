#!/usr/bin/env bash
# Rewrites the golden trees under fixtures/golden/ from fixtures/golden/specs.txt.
# Run after an intended change to the CPU forward's numerics; commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --bin taptree
cargo run --release -q -p kernels --example write_fixtures "$target/fixtures" >/dev/null
grep -v '^#' fixtures/golden/specs.txt | while read -r name fixture precision tokens gen; do
  [ -n "$name" ] || continue
  "$target/release/taptree" capture --model "$target/fixtures/$fixture.gguf" \
    --tokens "$tokens" --gen "$gen" --precision "$precision" \
    --out "fixtures/golden/$name" --force
done
