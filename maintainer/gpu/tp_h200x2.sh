#!/usr/bin/env bash
# Tensor parallelism on two H200s (the nvidia-h200-x2 machine; docs/DESIGN.md "Tensor parallelism"), in one call of
# at most BUDGET_S seconds (default 540), each step under `timeout`, its log kept, a failing step not stopping the
# others. NVLink multicast stays off: exported here, and every rank sets the same three variables itself.
#
#   python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .    # once, on the GPU machine
#   bash maintainer/gpu/tp_h200x2.sh [STEP ...]                                  # default: every step, in this order
#
# Steps:
#   gpu_tests      pytest -m gpu tests/runtime/test_tp_gpu.py: tiny pair, float32, CUDA graphs with the NCCL
#                  all-reduces captured, --tp 2 against one process (sync, overlap, tree); a flip names its margin
#   capture_clean  gaptrace capture --tp 2, bench preset, overlap, bs 8, B 12, 6 warm-up + 8 profiled rounds
#                  -> $OUT/h200x2_bench_overlap_bs8_B12_tp2/ (one trace + sidecar per rank)
#   capture_late   the same with --fault late-rank -> $OUT/h200x2_bench_overlap_bs8_B12_tp2_late-rank/
#   analyze        gaptrace analyze --json of both directories (per-rank occupancy, findings)
#   bench          benchmarks/bench_tp.py: TP 1 and TP 2 side by side, bench preset, overlap and sync, bs 8, B 12,
#                  8 profiled rounds per rank (occupancy per rank) -> $OUT/h200x2_tp.json/.md
#   exact          gaptrace decode --check-exact of the 32 held-out prompts (tiny, float32, bs 8) at --tp 1 and
#                  --tp 2, and maintainer/gpu/tp_flips.py: each request's first token where they differ, with
#                  the one-process greedy top-2 logit gap there
#
# Returned under $OUT: the two capture directories, analyze_*.json, h200x2_tp.json/.md, decode_tp{1,2}.json,
# tp_flips.txt, steps.md and logs/. Environment: OUT (default ./tp_out), BUDGET_S (540), PY (python3).
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/tp_out}
BUDGET_S=${BUDGET_S:-540}
RESERVE=10
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source maintainer/gpu/_steps.sh  # steps_init, left, step
steps_init tp
PROMPTS=fixtures/prompts/heldout.jsonl
CAP=(capture --preset bench --device cuda --tp 2 --scheduler overlap --batch-size 8 --block-size 12
     --prompts "$PROMPTS" --warmup-rounds 6 --rounds 8)
CLEAN=$OUT/h200x2_bench_overlap_bs8_B12_tp2
LATE=$OUT/h200x2_bench_overlap_bs8_B12_tp2_late-rank
DEC=(decode --preset tiny --device cuda --dtype float32 --batch-size 8 --prompts "$PROMPTS" --max-new-tokens 128
     --check-exact --json)
want() { [[ $# -eq 0 ]] || [[ " $* " == *" $STEP "* ]]; }
ARGS=("$@")

STEP=gpu_tests; want "${ARGS[@]}" && step gpu_tests 200 "$PY" -m pytest -q -m gpu tests/runtime/test_tp_gpu.py
STEP=capture_clean; want "${ARGS[@]}" && step capture_clean 150 "$PY" -m gaptrace.cli "${CAP[@]}" -o "$CLEAN"
STEP=capture_late; want "${ARGS[@]}" && step capture_late 120 "$PY" -m gaptrace.cli "${CAP[@]}" --fault late-rank \
  -o "$LATE"
STEP=analyze; want "${ARGS[@]}" && {
  step analyze_clean 60 sh -c "\"$PY\" -m gaptrace.cli analyze \"$CLEAN\" --json > \"$OUT/analyze_clean.json\""
  step analyze_late 60 sh -c "\"$PY\" -m gaptrace.cli analyze \"$LATE\" --json > \"$OUT/analyze_late.json\""
}
STEP=bench; want "${ARGS[@]}" && step bench 240 "$PY" benchmarks/bench_tp.py --device cuda --preset bench --tp 1,2 \
  --schedulers overlap,sync --batch-sizes 8 --blocks 12 --profiled-rounds 8 --out "$OUT" --name h200x2_tp
STEP=exact; want "${ARGS[@]}" && {
  step decode_tp1 120 sh -c "\"$PY\" -m gaptrace.cli ${DEC[*]} --tp 1 > \"$OUT/decode_tp1.json\""
  step decode_tp2 120 sh -c "\"$PY\" -m gaptrace.cli ${DEC[*]} --tp 2 > \"$OUT/decode_tp2.json\""
  step tp_flips 60 sh -c "\"$PY\" maintainer/gpu/tp_flips.py \"$OUT/decode_tp1.json\" \"$OUT/decode_tp2.json\" \
    > \"$OUT/tp_flips.txt\""
}
cp "$STEPS_MD" "$OUT/steps.md"
cp -r "$LOGS" "$OUT/logs"
cat "$OUT/steps.md"
