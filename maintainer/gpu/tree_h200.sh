#!/usr/bin/env bash
# Draft trees (DDTree) on the H200, for the shipped tiny pair: tau of a tree against the chain at equal
# verify width (chain B = 8 against a tree of N = 8 nodes, root included: 8 tokens verified per request per round),
# and captures of both tree builders (gpu, cpu-heapq = --fault cpu-tree-build) at batch sizes 1 and 8.
#
#   python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .    # once, on the GPU machine
#   bash maintainer/gpu/tree_h200.sh [OUTDIR [DEVICE]]                                 # default /tmp/tree cuda
#   SMOKE=1 bash maintainer/gpu/tree_h200.sh OUTDIR cpu                                # a small CPU run of every step
#   STEPS="decode_chain_B4 h200_tiny_tree_gpu_bs1" SMOKE=1 bash ...             # only the steps named
#
# writes to OUTDIR:
#   builders_check.log                                              gpu vs cpu-heapq trees on random inputs, on DEVICE
#   h200_tiny_tree_{cpu-heapq,gpu}_bs{1,8}.json.gz (+ .gaptrace.json sidecars)   `gaptrace capture`, 6 warm-up + 8
#                                                                   profiled rounds, overlap scheduler, CUDA graphs
#   decode_chain_B8.json, decode_tree_{gpu,cpu-heapq}_N8.json      `gaptrace decode --json` of the 32 held-out
#                                                                   prompts (bs 8, 128 new tokens; --check-exact
#                                                                   for the chain and the gpu tree)
#   tree_h200_table.txt / .json                                     the table printed at the end
#   one .log per step (stdout + stderr)
#
# Robustness: every step runs under `timeout`; a failing step is reported (rc, last log line) and the next one
# runs; a step is only started while the script has used < 240 s and may run 90 s (the first, 200 s: it pays
# fla's Triton compile, ~35-60 s; later processes hit Triton's disk cache), the table 20 s: the whole script ends
# within 6 minutes (240 + 90 + 20 + the builders check's start-up). The table step always runs and reports what
# is missing.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/tree}
DEVICE=${2:-cuda}
PY=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
PROMPTS=fixtures/prompts/heldout.jsonl
B=8; N=8; K=4; NEW=128; DEC_BS=8; CAP_BS="1 8"; WARM=6; ROUNDS=8; T_FIRST=200; T_STEP=90; BUDGET=240
if [ "$SMOKE" = 1 ]; then  # every step on a few tokens (the CPU test of this script)
  head -n 2 "$PROMPTS" > "$OUT/smoke_prompts.jsonl"
  PROMPTS="$OUT/smoke_prompts.jsonl"
  B=4; N=4; K=2; NEW=8; DEC_BS=2; CAP_BS="1 2"; WARM=1; ROUNDS=2; T_FIRST=100; T_STEP=100; BUDGET=200
fi
STEPS=${STEPS:-all}  # or a space-separated list of step names to run (tests/runtime/test_runtime_tree.py runs two)
START=$SECONDS
FIRST=1

step() {  # step NAME OUTFILE ARGS... : run `gaptrace ARGS` under timeout, stdout to OUTFILE (or /dev/null)
  local name=$1 outfile=$2; shift 2
  if [ "$STEPS" != all ] && [[ " $STEPS " != *" $name "* ]]; then
    return
  fi
  if (( SECONDS - START >= BUDGET )); then
    echo "$name: SKIPPED (time budget: $((SECONDS - START)) s used)"
    return
  fi
  local limit=$T_STEP
  if [ $FIRST = 1 ]; then limit=$T_FIRST; FIRST=0; fi
  local t0=$SECONDS
  timeout "$limit" "$PY" -m gaptrace.cli "$@" > "${outfile:-/dev/null}" 2> "$OUT/$name.log"
  local rc=$?
  local last
  last=$(tr '\r' '\n' < "$OUT/$name.log" | grep -v '^\s*$' | tail -n 1)
  echo "$name: rc=$rc $((SECONDS - t0)) s: $last"
}

# 0. the two builders on this device: the same trees on random top-k inputs with ties
if [ "$STEPS" = all ] || [[ " $STEPS " == *" builders_check "* ]]; then
  timeout 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_gpu.py -k tree_builders \
    > "$OUT/builders_check.log" 2>&1
  echo "builders_check: rc=$? $(tail -n 1 "$OUT/builders_check.log")"
fi
common=(--preset tiny --device "$DEVICE" --scheduler overlap --block-size "$B")
# 1. captures of both builders at bs 1 and 8 (first: they are the fixtures; the first one pays fla's compile)
for bs in $CAP_BS; do
  for builder in cpu-heapq gpu; do
    name="h200_tiny_tree_${builder}_bs$bs"
    step "$name" "" capture "${common[@]}" --batch-size "$bs" --prompts "$PROMPTS" --tree-budget "$N" \
      --tree-topk "$K" --tree-builder "$builder" --warmup-rounds "$WARM" --rounds "$ROUNDS" -o "$OUT/$name.json.gz"
  done
done
# 2. tau at equal verify width: chain B, tree N = B (gpu builder, then cpu-heapq: the same trees, so the same
#    tokens; its exactness follows from that, so only the first two are checked against the greedy reference)
step decode_chain_B$B "$OUT/decode_chain_B$B.json" decode "${common[@]}" --batch-size "$DEC_BS" \
  --prompts "$PROMPTS" --max-new-tokens "$NEW" --check-exact --json
for builder in gpu cpu-heapq; do
  exact=(); [ "$builder" = gpu ] && exact=(--check-exact)
  step "decode_tree_${builder}_N$N" "$OUT/decode_tree_${builder}_N$N.json" decode "${common[@]}" \
    --batch-size "$DEC_BS" --prompts "$PROMPTS" --max-new-tokens "$NEW" --tree-budget "$N" --tree-topk "$K" \
    --tree-builder "$builder" ${exact[@]+"${exact[@]}"} --json
done
# 3. the table (always)
timeout 20 "$PY" maintainer/gpu/tree_h200_table.py "$OUT" --block-size "$B" --tree-budget "$N"
echo "table rc=$? total $((SECONDS - START)) s"
