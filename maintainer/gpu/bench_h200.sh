#!/usr/bin/env bash
# The runtime's GPU benchmarks in one run on the H200 (at most BUDGET_S seconds, default 510, from the start of
# this script; each step under `timeout`, its log kept; a failing step does not stop the others).
#
#   bash maintainer/gpu/bench_h200.sh                  # every step, most important first (see STEPS below)
#   bash maintainer/gpu/bench_h200.sh runtime_grid     # only the named steps (a second call: the whole grid)
#   bash maintainer/gpu/bench_h200.sh train-plain      # only train the plain-attention tiny pair; checkpoints into $OUT
#
# Steps, in this order (later steps get the time that is left):
#   env               GPU, torch, transformers versions
#   runtime_bs8_B12   benchmarks/bench_runtime.py: overlap and sync at bs 8, B 12 + the plain greedy floor at bs 8
#   train_plain       scripts/train_pair.py --plain-attention, short budget, only if fixtures/models/tiny-*-plain
#                     is missing (better: run `train-plain` once in its own call and commit what it returns)
#   vs_transformers   benchmarks/bench_vs_transformers.py on the plain pair, all held-out prompts
#   capture_report    a 200-round capture (overlap, bs 8, B 12), then `gaptrace report` on it
#   runtime_grid      the rest of the grid: bs 8, 1, 32 x B 12, 8, 4 x overlap, sync, + floors (resumes step 2)
#
# Returned under $OUT (flat, at most 6 files): summary.md (steps, exit codes, seconds, every table), runtime.json/.md,
# vs_transformers.json/.md, logs.tar.gz (every step's log). `train-plain` returns instead
# tiny-target-plain/ and tiny-draft-plain/ (config.json + safetensors), TRAINING-plain.md and training-plain.json.
#
# Environment: OUT (default ./bench_out), BUDGET_S (510), PY (python3), RESUME_FROM (a runtime.json returned by an
# earlier call, e.g. `RESUME_FROM=bench_prev/runtime.json bash maintainer/gpu/bench_h200.sh runtime_grid` finishes the
# grid), PLAIN_TARGET / PLAIN_DRAFT (the pair,
# default fixtures/models/tiny-{target,draft}-plain), SMOKE=1 (a CPU smoke run on the tiny preset with toy sizes:
# tests/cli/test_bench_gpu_scripts.py).
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/bench_out}
BUDGET_S=${BUDGET_S:-510}
SMOKE=${SMOKE:-0}
RESERVE=12
source maintainer/gpu/_steps.sh  # steps_init, left, step
steps_init bench
RES=$WORK/results
mkdir -p "$RES"
# a runtime.json from an earlier call (copied into the working tree): its cells are kept, only the rest run
[[ -n ${RESUME_FROM:-} && -f ${RESUME_FROM:-} ]] && cp "$RESUME_FROM" "$RES/runtime.json"
PLAIN_TARGET=${PLAIN_TARGET:-fixtures/models/tiny-target-plain}
PLAIN_DRAFT=${PLAIN_DRAFT:-fixtures/models/tiny-draft-plain}

if [[ $SMOKE == 1 ]]; then
  RT=(--preset tiny --device cpu --warmup-rounds 2 --timed-rounds 3 --profiled-rounds 2 --out "$RES" --work "$WORK/traces")
  RT_FIRST=(--batch-sizes 2 --blocks 4)
  RT_GRID=(--batch-sizes 2,1 --blocks 4 --schedulers overlap --no-floor)
  CR=(--capture-report-rounds 2 --capture-report-cell overlap,2,4)
  VT=(--device cpu --max-prompts 2 --max-new-tokens 8 --runtime-batch-sizes 1,2 --hf-batch-size 2)
  TRAIN=(--device cpu --dry-run)
else
  RT=(--preset bench --device cuda --out "$RES" --work "$WORK/traces")
  RT_FIRST=(--batch-sizes 8 --blocks 12)
  RT_GRID=(--batch-sizes 8,1,32 --blocks 12,8,4)
  CR=(--capture-report-rounds 200 --capture-report-cell overlap,8,12)
  VT=(--device cuda)
  TRAIN=(--device cuda)
fi

if [[ ${1:-} == train-plain ]]; then  # its own call: full default budget, checkpoints back for committing
  step train_plain $(( BUDGET_S - 20 )) "$PY" scripts/train_pair.py --plain-attention --out-dir "$WORK/models" \
    "${TRAIN[@]}"
  cp -r "$WORK/models/tiny-target-plain" "$WORK/models/tiny-draft-plain" "$OUT/" 2>/dev/null
  cp "$WORK/models/TRAINING-plain.md" "$WORK/models/training-plain.json" "$OUT/" 2>/dev/null
  cat "$STEPS_MD" "$LOGS/train_plain.log"
  exit 0
fi

STEPS=${*:-env runtime_bs8_B12 train_plain vs_transformers capture_report runtime_grid}
for s in $STEPS; do
  case $s in
    env)
      step env 30 bash -c "nvidia-smi -L; \"$PY\" -c 'import torch, sys; print(sys.version); print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.is_available())'; \"$PY\" -c 'import transformers; print(\"transformers\", transformers.__version__)'; \"$PY\" -c 'import fla; print(\"fla\", fla.__version__)'; git log -1 --oneline" ;;
    runtime_bs8_B12)
      step runtime_bs8_B12 170 "$PY" benchmarks/bench_runtime.py "${RT[@]}" "${RT_FIRST[@]}" --resume \
        --time-budget-s @BUDGET@ ;;
    train_plain)
      if [[ -f $PLAIN_TARGET/config.json && -f $PLAIN_DRAFT/config.json ]]; then
        echo "| train_plain | not needed ($PLAIN_TARGET exists) | 0 | 0 |" >> "$STEPS_MD"
      elif [[ $SMOKE == 1 ]]; then
        echo "| train_plain | not run (smoke: give PLAIN_TARGET / PLAIN_DRAFT) | 0 | 0 |" >> "$STEPS_MD"
      else
        head -n 4 fixtures/prompts/heldout.jsonl > "$WORK/prompts4.jsonl"
        step train_plain 200 "$PY" scripts/train_pair.py --plain-attention --out-dir "$WORK/models" "${TRAIN[@]}" \
          --target-seconds 60 --draft-seconds 40 --prompts "$WORK/prompts4.jsonl"
        PLAIN_TARGET=$WORK/models/tiny-target-plain
        PLAIN_DRAFT=$WORK/models/tiny-draft-plain
        cp "$WORK/models/TRAINING-plain.md" "$LOGS/" 2>/dev/null
      fi ;;
    vs_transformers)
      if [[ -f $PLAIN_TARGET/config.json && -f $PLAIN_DRAFT/config.json ]]; then
        step vs_transformers 150 "$PY" benchmarks/bench_vs_transformers.py --target-dir "$PLAIN_TARGET" \
          --draft-dir "$PLAIN_DRAFT" "${VT[@]}" --method-budget-s 30 --out "$RES"
      else
        echo "| vs_transformers | not run (no plain pair at $PLAIN_TARGET) | 0 | 0 |" >> "$STEPS_MD"
      fi ;;
    capture_report)
      step capture_report 220 "$PY" benchmarks/bench_runtime.py "${RT[@]}" --no-grid "${CR[@]}" --resume ;;
    runtime_grid)
      step runtime_grid 600 "$PY" benchmarks/bench_runtime.py "${RT[@]}" "${RT_GRID[@]}" --resume \
        --time-budget-s @BUDGET@ ;;
    *)
      echo "| $s | unknown step | 0 | 0 |" >> "$STEPS_MD" ;;
  esac
done

# results: a handful of small flat files (the device tool returns at most 8)
{
  echo "# gaptrace H200 benchmarks ($(date '+%Y-%m-%d %H:%M'), $(( $(date +%s) - T0 )) s)"
  echo
  cat "$STEPS_MD"
  echo
  echo '```'
  cat "$LOGS/env.log" 2>/dev/null
  echo '```'
  for f in "$RES"/runtime.md "$RES"/vs_transformers.md; do
    [[ -f $f ]] && { echo; cat "$f"; }
  done
} > "$OUT/summary.md"
for f in runtime.json runtime.md vs_transformers.json vs_transformers.md; do
  [[ -f $RES/$f ]] && cp "$RES/$f" "$OUT/"
done
tar czf "$OUT/logs.tar.gz" -C "$WORK" logs steps.md 2>/dev/null
cat "$OUT/summary.md"
