#!/bin/bash
# The measured pairs of fixtures/traces/h200_pairs: each capture in a fresh process, interleaved (a cause, then its
# fixed twin), 40 unprofiled warm-up rounds (the sidecar keeps the last 30 periods and the unprofiled graph launch
# and device times of the early ones) and 8 profiled rounds.
#   OUT=DIR BUDGET_S=540 bash maintainer/gpu/capture_pairs.sh [NAME ...]   (default: every capture, in order)
source "$(dirname "$0")/_steps.sh"
OUT=${OUT:-/tmp/pairs}; BUDGET_S=${BUDGET_S:-540}; RESERVE=${RESERVE:-10}
steps_init pairs
P=fixtures/prompts/heldout.jsonl
BENCH="--preset bench --device cuda --batch-size 8 --block-size 12 --prompts $P --warmup-rounds 40 --rounds 8"
TINY1="--preset tiny --device cuda --batch-size 1 --block-size 12 --prompts $P --warmup-rounds 40 --rounds 8"
TREE="--preset tiny --device cuda --batch-size 8 --block-size 8 --prompts $P --warmup-rounds 40 --rounds 8 --tree-budget 8 --tree-topk 4"
declare -A CMD=(
  [bench_overlap_bs8_B12_clean_a]="$BENCH --scheduler overlap"
  [bench_overlap_bs8_B12_lengths-copy]="$BENCH --scheduler overlap --fault lengths-copy"
  [bench_overlap_bs8_B12_dd-gather]="$BENCH --scheduler overlap --fault dd-gather"
  [bench_sync_bs8_B12]="$BENCH --scheduler sync"
  [bench_overlap_bs8_B12_eager-commit-glue]="$BENCH --scheduler overlap --fault eager-commit-glue"
  [bench_overlap_bs8_B12_clean_b]="$BENCH --scheduler overlap"
  [tiny_overlap_bs1_B12_clean_a]="$TINY1 --scheduler overlap"
  [tiny_overlap_bs1_B12_eager-commit-glue_a]="$TINY1 --scheduler overlap --fault eager-commit-glue"
  [tiny_tree_gpu_bs8]="$TREE --scheduler overlap --tree-builder gpu"
  [tiny_tree_cpu-heapq_bs8]="$TREE --scheduler overlap --tree-builder cpu-heapq"
  [tiny_overlap_bs1_B12_clean_b]="$TINY1 --scheduler overlap"
  [tiny_overlap_bs1_B12_eager-commit-glue_b]="$TINY1 --scheduler overlap --fault eager-commit-glue"
)
ORDER=(bench_overlap_bs8_B12_clean_a bench_overlap_bs8_B12_lengths-copy bench_overlap_bs8_B12_dd-gather
       bench_sync_bs8_B12 bench_overlap_bs8_B12_eager-commit-glue bench_overlap_bs8_B12_clean_b
       tiny_overlap_bs1_B12_clean_a tiny_overlap_bs1_B12_eager-commit-glue_a tiny_tree_gpu_bs8
       tiny_tree_cpu-heapq_bs8 tiny_overlap_bs1_B12_clean_b tiny_overlap_bs1_B12_eager-commit-glue_b)
(( $# )) && ORDER=("$@")
for n in "${ORDER[@]}"; do
  [[ -n "${CMD[$n]}" ]] || { echo "unknown capture $n" >&2; continue; }
  # shellcheck disable=SC2086
  step "$n" 120 python3 -m gaptrace.cli capture ${CMD[$n]} -o "$OUT/$n.json.gz"
done
cp "$STEPS_MD" "$OUT/steps.md"; cp -r "$LOGS" "$OUT/logs"
cat "$OUT/steps.md"
