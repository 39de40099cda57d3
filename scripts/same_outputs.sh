#!/usr/bin/env bash
# Shows that a change which should not change behaviour did not: records the
# outputs of the release binary, then compares two recordings byte for byte.
#
#   scripts/same_outputs.sh record DIR [RUNS]   # the current build's outputs into DIR
#   scripts/same_outputs.sh compare BEFORE AFTER
#
# Recorded: the golden trees recaptured from their specs (their roots must be
# the checked-in ones), verify/ls/stat of every golden tree, diffs of golden
# pairs (table, --json, --html, --controls, --bitwise, --all-metrics), a
# damaged and an incomplete tree, and with RUNS (a directory holding the
# SmolLM2 trees cpu-f32, cpu-q8, cpu-f64 of scripts/demo.sh; captured there
# when missing) the real-model diff f32 vs q8 with the f64 truth. The diffs
# read the same trees in both recordings, so paths in outputs agree; set
# RECAPTURE=1 to also recapture the SmolLM2 trees into DIR and record their
# roots (slow: the f64 forward). TAPTREE=path records that binary instead of
# building this checkout; FIXTURES=dir takes the fixture models from there.
set -uo pipefail
cd "$(dirname "$0")/.."

compare() {
    local before=$1 after=$2 bad=0
    for f in $(cd "$before" && find . -type f ! -path './runs/*' | sort); do
        if [ ! -f "$after/$f" ]; then
            echo "missing in $after: $f"; bad=1
        elif ! cmp -s "$before/$f" "$after/$f"; then
            echo "differs: $f"; bad=1
        fi
    done
    for f in $(cd "$after" && find . -type f ! -path './runs/*' | sort); do
        [ -f "$before/$f" ] || { echo "only in $after: $f"; bad=1; }
    done
    local n
    n=$(cd "$before" && find . -type f ! -path './runs/*' | wc -l)
    if [ "$bad" = 0 ]; then
        echo "same outputs: $n files byte-identical"
    fi
    return "$bad"
}

# `out NAME CMD...`: stdout to NAME.out, stderr to NAME.err, exit code to NAME.rc.
out() {
    local name=$1; shift
    "$@" >"$dir/$name.out" 2>"$dir/$name.err"
    echo $? >"$dir/$name.rc"
}

record() {
    dir=$1
    local runs=${2:-}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # TAPTREE: a binary built earlier (the "before" one), else this build's.
    local t=${TAPTREE:-target/release/taptree} g=fixtures/golden
    if [ -z "${TAPTREE:-}" ]; then cargo build --release --quiet --bin taptree --bin taptree-full || exit 2; fi
    # FIXTURES: where the fixture models are (written when missing).
    local fx=${FIXTURES:-target/fixtures}
    if [ ! -f "$fx/tiny-q.gguf" ]; then
        cargo run --release -q -p fixtures --bin generate -- models "$fx" >/dev/null || exit 2
    fi
    # Global: the EXIT trap reads it after this function returned.
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT

    # The golden trees, recaptured: roots as `verify` prints them.
    grep -v '^#' $g/specs.txt | while read -r name fixture precision tokens gen; do
        [ -n "$name" ] || continue
        $t capture --model "$fx/$fixture.gguf" --tokens "$tokens" --gen "$gen" \
            --precision "$precision" --out "$scratch/$name" --force >/dev/null 2>&1
        out "recapture-$name" $t verify "$scratch/$name"
        out "recapture-vs-golden-$name" $t verify $g/$name "$scratch/$name"
    done
    sed -i "s|$scratch|SCRATCH|g" "$dir"/recapture-*

    for tree in tiny-q-f32 tiny-q-q8 tiny-q-f64 tiny-outlier-f32 tiny-outlier-q8 tiny-f32-f32; do
        out "verify-$tree" $t verify $g/$tree
        out "ls-$tree" $t ls $g/$tree
        out "ls-json-$tree" $t ls --json $g/$tree
        out "ls-select-$tree" $t ls --select "stage=ffn_*;layer=1" $g/$tree
        out "stat-$tree" $t stat $g/$tree
        out "stat-json-$tree" $t stat --json $g/$tree
    done
    out stat-at $t stat $g/tiny-outlier-f32 --at L1/ffn_down@0
    out stat-at-json $t stat --json $g/tiny-outlier-f32 --at L1/ffn_down

    local pairs="tiny-q-f32:tiny-q-q8:tiny-q-f64 tiny-outlier-f32:tiny-outlier-q8: tiny-q-f32:tiny-q-f32: tiny-q-f32:tiny-f32-f32: tiny-q-f64:tiny-q-f32:"
    for p in $pairs; do
        IFS=: read -r a b truth <<<"$p"
        local tr=() n="$a-$b"
        [ -n "$truth" ] && tr=(--truth $g/$truth --force-truth) && n="$n-truth"
        out "diff-$n" $t diff $g/$a $g/$b "${tr[@]}"
        out "diff-json-$n" $t diff $g/$a $g/$b "${tr[@]}" --json
        out "diff-html-$n" $t diff $g/$a $g/$b "${tr[@]}" --html "$dir/diff-$n.html"
        out "diff-m-$n" $t diff $g/$a $g/$b "${tr[@]}" -m --sort growth
        out "diff-bitwise-$n" $t diff $g/$a $g/$b --bitwise --only-red
        out "diff-tol-$n" $t diff $g/$a $g/$b -t 'cos>=0.9999&abs<=1e-3'
        out "diff-controls-$n" $t diff $g/$a $g/$b --controls
        out "diff-controls-json-$n" $t diff $g/$a $g/$b --controls --json
        out "verify-$n" $t verify $g/$a $g/$b
        out "verify-json-$n" $t verify --json $g/$a $g/$b
    done
    out diff-perturb-at $t diff $g/tiny-q-f32 $g/tiny-q-q8 --controls --perturb-at L1/ffn_up@2
    out diff-slots $t diff $g/tiny-q-f32 $g/tiny-q-q8 --slot-a none --slot-b none
    out diff-align $t diff $g/tiny-q-f32 $g/tiny-q-q8 --align 1 --common-only

    # Trees that must not compare: damaged, incomplete, missing.
    cp -r $g/tiny-q-f32 "$scratch/damaged"
    local victim
    victim=$(cd "$scratch/damaged" && ls L001/*.safetensors | head -1)
    printf 'x' | dd of="$scratch/damaged/$victim" bs=1 seek=200 conv=notrunc 2>/dev/null
    cp -r $g/tiny-q-f32 "$scratch/crashed" && rm "$scratch/crashed/manifest.json"
    # A tap file cut short under an intact manifest: the one intended change
    # of the diff-by-steps refactor (exit 2 still, now with the row reported).
    cp -r $g/tiny-q-q8 "$scratch/truncated"
    victim=$(cd "$scratch/truncated" && ls L001/ffn_up*.safetensors | head -1)
    truncate -s -100 "$scratch/truncated/$victim"
    out diff-truncated $t diff $g/tiny-q-f32 "$scratch/truncated"
    out diff-json-truncated $t diff $g/tiny-q-f32 "$scratch/truncated" --json
    out diff-damaged $t diff $g/tiny-q-q8 "$scratch/damaged"
    out verify-damaged $t verify "$scratch/damaged"
    out verify-rehash-damaged $t verify --rehash $g/tiny-q-f32 "$scratch/damaged"
    out diff-crashed $t diff $g/tiny-q-f32 "$scratch/crashed"
    out verify-crashed $t verify $g/tiny-q-f32 "$scratch/crashed"
    out diff-missing $t diff $g/tiny-q-f32 "$scratch/nothing-here"
    sed -i "s|$scratch|SCRATCH|g" "$dir"/*-damaged.* "$dir"/*-crashed.* "$dir"/*-truncated.* "$dir"/diff-missing.*

    if [ -n "$runs" ]; then
        for precision in f32 q8 f64; do
            [ -f "$runs/cpu-$precision/manifest.json" ] && continue
            $t capture --model smollm2 --chat "What is the capital of France?" --gen 16 \
                --precision "$precision" --out "$runs/cpu-$precision" --force >/dev/null 2>&1
        done
        local r=$runs
        out real-diff $t diff $r/cpu-f32 $r/cpu-q8 --truth $r/cpu-f64
        out real-diff-json $t diff $r/cpu-f32 $r/cpu-q8 --truth $r/cpu-f64 --json
        out real-diff-html $t diff $r/cpu-f32 $r/cpu-q8 --truth $r/cpu-f64 --html "$dir/real-diff.html"
        out real-diff-bitwise $t diff $r/cpu-f32 $r/cpu-q8 --bitwise --only-red
        out real-stat-at $t stat $r/cpu-f32 --at L4/attn_norm@26
        out real-verify $t verify $r/cpu-f32 $r/cpu-q8
        out real-ls $t ls $r/cpu-f32
        if [ "${RECAPTURE:-0}" = 1 ]; then
            for precision in f32 q8 f64; do
                $t capture --model smollm2 --chat "What is the capital of France?" --gen 16 \
                    --precision "$precision" --out "$scratch/cpu-$precision" --force >/dev/null 2>&1
                out "real-recapture-$precision" $t verify "$r/cpu-$precision" "$scratch/cpu-$precision"
            done
            sed -i "s|$scratch|SCRATCH|g" "$dir"/real-recapture-*
        fi
    fi
    echo "recorded $(find "$dir" -type f | wc -l) files in $dir"
}

case ${1:-} in
    record) shift; record "$@" ;;
    compare) shift; compare "$@" ;;
    *) echo "usage: $0 record DIR [RUNS] | compare BEFORE AFTER" >&2; exit 2 ;;
esac
