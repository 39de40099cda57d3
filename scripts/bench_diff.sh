#!/usr/bin/env bash
# Benchmarks of `taptree diff`, in one run, ratios printed:
#   1. full-metric throughput on two ~1 GB trees that differ everywhere,
#      from the page cache (target >= 1 GB/s on 2 cores);
#   2. the same comparison by scripts/numpy_diff.py (target: taptree >= 10x);
#   3. diff time when 1% of the taps differ (target <= 5% of case 1);
#   4. the peer of case 1 on this host's cores: reading A's and B's tap
#      files with one `cat` per core at once (target: case 1 >= 60% of it).
# The trees are written by the capture API (diff/examples/bench_trees.rs)
# into a temporary directory and deleted afterwards.
#
# usage: scripts/bench_diff.sh [MB per tree, default 1024] [runs, default 5]
#
# TAPTREE=path and BENCH_TREES=path use prebuilt binaries (taptree, and
# diff's bench_trees example), so that the bench runs on a host without
# Rust; NUMPY=0 skips the numpy peer (case 2). BEFORE=path times a second
# taptree (an older build) on the same trees, each of its runs interleaved
# with one of TAPTREE's, and prints its figures too. TREES=dir takes the
# trees from dir (written there by an earlier run's bench_trees, kept)
# instead of writing them afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-1024}
runs=${2:-5}

if [[ -z "${TAPTREE:-}" || -z "${BENCH_TREES:-}" ]]; then
  cargo build --release --quiet --bin taptree --bin taptree-full
  cargo build --release --quiet -p diff --example bench_trees
fi
taptree=${TAPTREE:-target/release/taptree}
bench_trees=${BENCH_TREES:-target/release/examples/bench_trees}
if [[ -n "${TREES:-}" ]]; then
    dir=$TREES
    [[ -f "$dir/A/manifest.json" && -f "$dir/B/manifest.json" && -f "$dir/C/manifest.json" ]] ||
        { echo "TREES=$dir: no trees A, B and C there (bench_trees writes them)" >&2; exit 2; }
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/taptree-bench.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
    "$bench_trees" "$dir" "$mb"
fi
# Warm the page cache: the targets are "from page cache".
find "$dir" -type f -print0 | xargs -0 cat > /dev/null

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
time_diff() { # A B [taptree] [cpu] -> "wall cpu" seconds of one `taptree diff --json` (exit 1 is a finding)
    # Wall time from bash's microsecond clock (/usr/bin/time's hundredths
    # are a step of 0.7 points at the 1%-differ case's 0.06 s); CPU time
    # from /usr/bin/time where it is printed (cpu=1: the all-differ case),
    # else none: its own start (0.65 ms on a 16-core host) would count as
    # the 1%-differ diff's.
    local t start end taptree=${3:-$taptree}
    t=$(mktemp)
    start=$EPOCHREALTIME
    if [[ ${4:-0} == 1 && -x /usr/bin/time ]]; then
        /usr/bin/time -f "%U %S" -o "$t" "$taptree" diff "$1" "$2" --json > /dev/null || [ $? -eq 1 ]
    else # no CPU time asked for, or none on this host: reported as 0
        echo "0 0" > "$t"
        "$taptree" diff "$1" "$2" --json > /dev/null || [ $? -eq 1 ]
    fi
    end=$EPOCHREALTIME
    awk -v s="$start" -v e="$end" '{printf "%.4f %.3f\n", e - s, $1 + $2}' "$t"
    rm -f "$t"
}
# The tensor bytes of A and B: each manifest's head total (its first "bytes").
head_bytes() { awk 'match($0, /"bytes":[0-9]+/) { print substr($0, RSTART + 8, RLENGTH - 8); exit }' "$1/manifest.json"; }
bytes=$(( $(head_bytes "$dir/A") + $(head_bytes "$dir/B") ))
load=$(cut -d' ' -f1 /proc/loadavg)
# With BEFORE, each run of TAPTREE is followed by one of BEFORE, whose
# times go to a file of their own.
before_full=$(mktemp) before_skip=$(mktemp)
timed() { # A B file [cpu]: one run of TAPTREE to stdout, then one of BEFORE to file
    time_diff "$1" "$2" "$taptree" "${4:-0}"
    if [[ -n "${BEFORE:-}" ]]; then time_diff "$1" "$2" "$BEFORE" "${4:-0}" >> "$3"; fi
}
full_runs=$(for _ in $(seq "$runs"); do timed "$dir/A" "$dir/B" "$before_full" 1; done)
# The 1%-differ diff takes a twenty-fifth of the time: three times the runs
# for a steadier median on a shared machine.
skip_n=$((3 * runs))
skip_runs=$(for _ in $(seq "$skip_n"); do timed "$dir/A" "$dir/C" "$before_skip"; done)
full=$(echo "$full_runs" | cut -d' ' -f1 | median)
full_cpu=$(echo "$full_runs" | cut -d' ' -f2 | median)
skip=$(echo "$skip_runs" | cut -d' ' -f1 | median)
skip_min=$(echo "$skip_runs" | cut -d' ' -f1 | sort -g | head -1)
skip_max=$(echo "$skip_runs" | cut -d' ' -f1 | sort -g | tail -1)
# The page cache's speed on every core: A's and B's tap files read by one
# `cat` per core at once, in batches of 64 files.
cores=$(nproc)
cat_runs=$(for _ in $(seq "$runs"); do
    start=$EPOCHREALTIME
    find "$dir/A" "$dir/B" -name '*.safetensors' -print0 | xargs -0 -P "$cores" -n 64 cat > /dev/null
    end=$EPOCHREALTIME
    awk -v s="$start" -v e="$end" 'BEGIN {printf "%.4f\n", e - s}'
done)
cat_t=$(echo "$cat_runs" | median)
np=0
if [[ "${NUMPY:-1}" != 0 ]]; then
    np=$(for _ in $(seq 3); do python3 scripts/numpy_diff.py "$dir/A" "$dir/B" | python3 -c "import json,sys; print(json.load(sys.stdin)['seconds'])"; done | median)
fi

awk -v b="$bytes" -v full="$full" -v cpu="$full_cpu" -v skip="$skip" -v np="$np" -v cat_t="$cat_t" -v runs="$runs" -v skip_n="$skip_n" -v skip_min="$skip_min" -v skip_max="$skip_max" -v load="$load" -v cores="$(nproc)" 'BEGIN {
    printf "trees: A and B %.0f MB each (%.0f bytes read in all), %d runs, medians; %d cores, load average %s at start\n", b/2/1048576, b, runs, cores, load
    printf "taptree diff A B (all taps differ):  %.3f s  %.2f GB/s (A+B bytes); %.3f CPU-s = %.2f GB per CPU-second\n", full, b/full/1e9, cpu, b/cpu/1e9
    if (np > 0) {
        printf "numpy_diff.py A B:                   %.3f s  %.3f GB/s\n", np, b/np/1e9
        printf "speedup over numpy:                  %.1fx\n", np/full
    }
    printf "%d parallel cats of A and B:         %.3f s  %.2f GB/s; the diff reads at %.0f%% of their speed\n", cores, cat_t, b/cat_t/1e9, 100*cat_t/full
    printf "taptree diff A C (1%% of taps differ): %.4f s  = %.2f%% of the all-differ time (median of %d runs, %.4f to %.4f s)\n", skip, 100*skip/full, skip_n, skip_min, skip_max
}'
if [[ -n "${BEFORE:-}" ]]; then
    b_full=$(cut -d' ' -f1 "$before_full" | median)
    b_cpu=$(cut -d' ' -f2 "$before_full" | median)
    b_skip=$(cut -d' ' -f1 "$before_skip" | median)
    awk -v b="$bytes" -v full="$b_full" -v cpu="$b_cpu" -v skip="$b_skip" -v cat_t="$cat_t" -v who="$BEFORE" 'BEGIN {
        printf "BEFORE=%s, interleaved with the runs above:\n", who
        printf "  diff A B (all taps differ):  %.3f s  %.2f GB/s; %.3f CPU-s; %.0f%% of the cats\x27 speed\n", full, b/full/1e9, cpu, 100*cat_t/full
        printf "  diff A C (1%% of taps differ): %.4f s  = %.2f%% of its all-differ time\n", skip, 100*skip/full
    }'
fi
rm -f "$before_full" "$before_skip"
