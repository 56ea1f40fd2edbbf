#!/usr/bin/env bash
# H200 captures of each runtime pathology alone (runtime/faults.py), on top of the overlap scheduler, with
# the same prompts and rounds as the clean overlap baselines in fixtures/traces/h200_runtime (not recaptured here).
# One line per capture; logs next to the traces.
#
#   python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .    # once, on the GPU machine
#   bash maintainer/gpu/capture_faults.sh [OUTDIR [DEVICE [SPEC ...]]]       # default /tmp/faults cuda, every SPEC below
#
# SPEC = PRESET:BATCH:FAULT, e.g. tiny:1:eager-commit-glue. Writes OUTDIR/h200_PRESET_overlap_bsBATCH_B12_FAULT.json.gz
# (+ .gaptrace.json sidecar, + .log). The default SPECs: every fault on both presets at batch size 8, and
# eager-commit-glue on the tiny preset at batch size 1, where the host, not the GPU, sets the round period (at bs 8
# both presets are GPU-bound and the overlap scheduler hides the glue behind the GPU: see the MANIFEST).
#
# jit-new-shape needs a new batch bucket inside the profiled rounds. A capture decodes exactly bs prompts, so the
# batch never shrinks by itself; `--shrink-at-round 10` cuts the last half of the running requests after round 10:
# they finish when round 10's results are read (while round 11 is queued), and round 12 runs in a smaller bucket.
# The profiled rounds are 8 .. 15 (6 warm-up + 1 profiler warm-up), so the Triton compile of that variant lands
# in profiled round 12, inside the `jit_new_shape` range (the engine warmed only the full batch's bucket, int64).
# Each jit-new-shape capture gets its own copy of a Triton cache that holds fla's kernels (compiled by the earlier
# captures) but never this kernel, so its compile is real, not a disk-cache hit from the previous preset.
#
# Budget: ~20-30 s per capture (start-up, graph capture, 15 rounds, trace write); a capture is only started while
# the script has run < ${BUDGET_S:-195} s, each under `timeout ${CAPTURE_TIMEOUT_S:-120}` (the first one compiles fla's
# Triton kernels, ~35-60 s), so the script ends in time; what is skipped says so.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/faults}
mkdir -p "$OUT"
PROMPTS=fixtures/prompts/heldout.jsonl
DEVICE=${2:-cuda}  # cpu: a smoke run of this script (no Triton, no device activity)
shift $(( $# >= 2 ? 2 : $# ))
SPECS=("$@")
if [ ${#SPECS[@]} -eq 0 ]; then
  for fault in lengths-copy dd-gather eager-commit-glue jit-new-shape token-list-rebuild; do
    SPECS+=("tiny:8:$fault" "bench:8:$fault")
  done
  SPECS+=("tiny:1:eager-commit-glue")
fi
BUDGET_S=${BUDGET_S:-195}
BASE_CACHE="$OUT/triton-cache-base"
mkdir -p "$BASE_CACHE"
if [ -d "$HOME/.triton/cache" ]; then cp -r "$HOME/.triton/cache/." "$BASE_CACHE/"; fi  # keep fla's compiles
find "$BASE_CACHE" -name 'window_len_kernel*' -printf '%h\n' | sort -u | xargs -r rm -rf  # never our kernel
START=$SECONDS
for spec in "${SPECS[@]}"; do
  IFS=: read -r preset bs fault <<< "$spec"
  name="h200_${preset}_overlap_bs${bs}_B12_${fault}"
  if (( SECONDS - START >= BUDGET_S )); then
    echo "$name: SKIPPED (time budget: $((SECONDS - START)) s used)"
    continue
  fi
  cache="$BASE_CACHE"
  extra=()
  if [ "$fault" = jit-new-shape ]; then
    cache="$OUT/triton-cache-$preset-$bs"
    rm -rf "$cache" && cp -r "$BASE_CACHE" "$cache"
    extra=(--shrink-at-round 10)
  fi
  t0=$SECONDS
  TRITON_CACHE_DIR="$cache" timeout "${CAPTURE_TIMEOUT_S:-120}" python3 -m gaptrace.cli capture --preset "$preset" --device "$DEVICE" \
    --scheduler overlap --batch-size "$bs" --block-size 12 --prompts "$PROMPTS" --warmup-rounds 6 --rounds 8 \
    --fault "$fault" ${extra[@]+"${extra[@]}"} -o "$OUT/$name.json.gz" > "$OUT/$name.log" 2>&1
  rc=$?
  last=$(tr '\r' '\n' < "$OUT/$name.log" | grep -v '^\s*$' | tail -n 1)
  echo "$name: rc=$rc $((SECONDS - t0)) s: $last"
done
rm -rf "$OUT"/triton-cache-*
echo "total $((SECONDS - START)) s"
