#!/usr/bin/env bash
# The main job: capture SmolLM2-135M-Instruct on the CPU in f32, q8 and f64
# (the truth), then diff f32 against q8 with the f64 truth deciding which side
# is wrong. Fetches the model on first use. Trees go to ${1:-runs}.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs}
prompt=${TAPTREE_DEMO_CHAT:-"What is the capital of France?"}

cargo build --release --quiet
taptree=target/release/taptree

for precision in f32 q8 f64; do
    echo "== taptree capture --precision $precision"
    "$taptree" capture --model smollm2 --chat "$prompt" --gen 16 \
        --precision "$precision" --out "$out/cpu-$precision" --force
done

echo "== taptree verify (a tree against itself)"
"$taptree" verify "$out/cpu-f32" "$out/cpu-f32"

echo "== taptree diff f32 vs q8, truth f64"
# Exit 1 means "diverged", the expected finding here; 2 would be a failure.
status=0
"$taptree" diff "$out/cpu-f32" "$out/cpu-q8" --truth "$out/cpu-f64" \
    --html "$out/diff-f32-q8.html" || status=$?
if [ "$status" -gt 1 ]; then
    echo "demo: taptree diff could not compare (exit $status)" >&2
    exit "$status"
fi
echo "== trees are in $out/, the HTML report (error against depth, layer x stage heatmap) is $out/diff-f32-q8.html;"
echo "   docs/GUIDE.md says what each column and line of the report means"
