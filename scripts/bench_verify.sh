#!/usr/bin/env bash
# Times `taptree verify A B` (manifests trusted), `taptree verify --rehash A B`
# and `diff -rq A B` on two identical generated trees with the shape of a 7B
# model's capture over 78 positions, in one run, and prints medians and ratios.
# Warm page cache: every command runs once untimed first. TURNS=1: the
# commands take turns, round by round (below).
#
#   bash scripts/bench_verify.sh            # RUNS=5 by default
#   RUNS=9 GEN_ARGS="--positions 50" bash scripts/bench_verify.sh
#
# The trees (about 1.7 GB together) go to a temporary directory under
# $TMPDIR (or WORK=dir) and are deleted on exit; TREES=dir keeps them in
# dir/a and dir/b instead (generated only where missing, never deleted), so
# that several runs time the same trees. TAPTREE=path and GEN=path use
# prebuilt binaries (taptree, and capture's gen_tree example) instead of
# building them; TAPTREE may name several taptree binaries, separated by
# spaces (a before and an after): each one's trusted verify is timed against
# the same `diff -rq`, the --rehash row is the first one's. REHASH=0 leaves
# the --rehash row out.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
GEN_ARGS=${GEN_ARGS:-}
REHASH=${REHASH:-1}
TARGET=${CARGO_TARGET_DIR:-target}
if [[ -n "${TREES:-}" ]]; then
  WORK=$TREES
  mkdir -p "$WORK"
else
  WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/taptree-bench.XXXXXX")}
  trap 'rm -rf "$WORK"' EXIT
fi

if [[ -z "${TAPTREE:-}" || -z "${GEN:-}" ]]; then
  cargo build --release --quiet --bin taptree --bin taptree-full
  cargo build --release --quiet -p capture --example gen_tree
fi
TAPTREE=${TAPTREE:-$TARGET/release/taptree}
GEN=${GEN:-$TARGET/release/examples/gen_tree}
read -r -a TAPTREES <<<"$TAPTREE"

for tree in a b; do
  if [[ ! -e "$WORK/$tree/manifest.json" ]]; then
    # shellcheck disable=SC2086
    "$GEN" "$WORK/$tree" $GEN_ARGS
  fi
done
echo "trees: $(find "$WORK/a" -name '*.safetensors' | wc -l) taps each, $(du -sh "$WORK/a" | cut -f1) each"

# Each command runs once untimed (warm-up), then RUNS times in a row, and
# its median is taken: the way the >= 279x target was set. TURNS=1 makes
# the commands take turns instead: each round times every taptree's trusted
# verify, the --rehash, then `diff -rq`, so that each verify starts right
# after 1.9 GB went through the caches (the manifests are then read from
# memory, not from the CPU's caches: slower; docs/PERFORMANCE.md has both).
# Times come from bash's own microsecond clock ($EPOCHREALTIME): a `date`
# process per reading would add its own start-up (about 1.5 ms here) to
# every sample, as much as the trusted verify itself takes.
# taptree must exit 0 (identical trees); diff -rq exits 1 only because the
# two manifests record different times and argv, which it cannot know to
# ignore; anything else aborts the bench.
time_once() {
  local start end rc=0
  start=$EPOCHREALTIME
  "$@" >/dev/null || rc=$?
  end=$EPOCHREALTIME
  if (( rc > 1 )) || { (( rc == 1 )) && [[ $1 != diff ]]; }; then
    echo "bench: '$*' exited $rc" >&2
    exit 2
  fi
  awk -v s="$start" -v e="$end" 'BEGIN { printf "%.6f\n", e - s }'
}
median() {
  tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ t[NR] = $1 } END { printf "%.6f\n", t[int((NR + 1) / 2)] }'
}

# The commands, in the order they are timed: every taptree's verify, the
# --rehash (REHASH=1), diff -rq; samples[c] collects command c's times.
commands=()
for bin in "${TAPTREES[@]}"; do commands+=("$bin verify $WORK/a $WORK/b"); done
[[ $REHASH != 0 ]] && commands+=("${TAPTREES[0]} verify --rehash $WORK/a $WORK/b")
commands+=("diff -rq $WORK/a $WORK/b")
samples=()
sample() {  # sample C ROUND: time command C once; keep it unless ROUND < 0
  local t
  # shellcheck disable=SC2086
  t=$(time_once ${commands[$1]}) || exit 2
  (( $2 >= 0 )) && samples[$1]="${samples[$1]:-} $t"
  return 0
}
if [[ ${TURNS:-0} == 1 ]]; then
  for ((round = -1; round < RUNS; round++)); do
    for c in "${!commands[@]}"; do sample "$c" "$round"; done
  done
else
  for c in "${!commands[@]}"; do
    for ((round = -1; round < RUNS; round++)); do sample "$c" "$round"; done
  done
fi
last=$(( ${#commands[@]} - 1 ))
rehash=
[[ $REHASH != 0 ]] && rehash=$(median <<<"${samples[last - 1]}")
diffrq=$(median <<<"${samples[last]}")
verify=()
for i in "${!TAPTREES[@]}"; do
  verify+=("$(median <<<"${samples[i]}")")
done

echo "median of $RUNS runs (warm cache$([[ ${TURNS:-0} == 1 ]] && echo ", in turns")), $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg):"
for i in "${!TAPTREES[@]}"; do
  (( ${#TAPTREES[@]} > 1 )) && echo "  ${TAPTREES[$i]}:"
  printf '  taptree verify A B            %9.5f s\n' "${verify[$i]}"
done
[[ -n $rehash ]] && printf '  taptree verify --rehash A B   %9.5f s\n' "$rehash"
printf '  diff -rq A B                  %9.5f s\n' "$diffrq"
for i in "${!TAPTREES[@]}"; do
  (( ${#TAPTREES[@]} > 1 )) && echo "  ${TAPTREES[$i]}:"
  awk -v v="${verify[$i]}" -v d="$diffrq" 'BEGIN {
    printf "  verify is %.1fx faster than diff -rq (target >= 279x)\n", d / v
  }'
done
if [[ -n $rehash ]]; then
  awk -v r="$rehash" -v d="$diffrq" 'BEGIN {
    printf "  verify --rehash takes %.2fx the time of diff -rq (target <= 1.0x)\n", r / d
  }'
fi
