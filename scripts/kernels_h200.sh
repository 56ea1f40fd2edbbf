#!/usr/bin/env bash
# Session 3's H200 call: the fused kernels (runtime/models/fused.py) and the long-context token-list-rebuild capture.
#
#   bash scripts/kernels_h200.sh [STEP ...]      # default: every step below, in order; OUT (default ./kernels_out)
#
#   env            GPU, torch, Triton, fla
#   kernels_check  tests/test_fused_kernels.py compiled on the GPU (fused vs eager, float32 and bfloat16)
#   exact          tiny preset, float32, held-out prompts, bs 8, B 8: speculative (fused) vs plain greedy (fused)
#   baseline       the same bs-8 B-12 overlap + sync fused cells from an earlier commit's tree, unpacked from
#                  .whl/baseline_<commit>.tar.gz (git archive COMMIT runtime gaptrace analyses benchmarks pyproject.toml
#                  README.md fixtures/prompts), in the same call: OUT/baseline/runtime.json for the before/after ratios
#   bench          benchmarks/bench_runtime.py: bs 8, B 12, overlap + sync, kernels fused and eager side by side
#                  (bench preset); the fused bs-8 B-12 traces come back (tar under OUT)
#   bubble         benchmarks/bench_bubble_trigger.py twice, each in a fresh process: its default order (graphs first,
#                  then cuBLAS GEMMs and a profiler session) and the GEMMs and the profiler first, then the graphs
#                  (which stage raises the graph-node bubble; issue 6); then the default order again under each of
#                  BUBBLE_ENVS (space-separated VAR=VALUE, each its own process: hardware queues, module loading)
#   law            bench_bubble_trigger.py in fresh processes: tiny graphs (one node) only, chains of 100 and of 1,000
#                  nodes, graphs freed between captures (does the step follow the graphs made, their nodes, or the
#                  graphs alive?); bench_graph_alone.py --chain-probe 300 as is and with two graphs
#                  (runtime_variant.py two_graphs): is a process that built the runtime in the slow state?
#                  Also (and alone in law2, with the two-graph probe): new streams, read-backs, GraphedCall captures
#   isolated       bs 8, B 12, fused: each scheduler (ISO_SCHEDULERS) in its own process, this tree and the baseline
#                  tree (.whl/baseline_*.tar.gz, as the baseline step) alternately, so no cell runs in a process that
#                  an earlier engine's graphs put past the step; this tree's overlap capture comes back (OUT/iso_*);
#                  then bench_graph_alone.py (this tree's graphs alone)
#   readme         the README table's other rows, each cell in its own process (bench_runtime --isolate): overlap
#                  at bs 8 B 8, bs 1 B 8 and bs 32 B 12, each with its batch size's plain floor (OUT/readme)
#   faststate      bench_graph_alone.py --fast-state --chain-probe 300: the runtime's draft and verify graphs as the
#                  process's only graphs, timed before and after the step (three new streams)
#   alone          benchmarks/bench_graph_alone.py (the runtime's own graphs replayed alone: their node gaps), plain
#                  and under each of ALONE_ENVS
#   grid           benchmarks/bench_runtime.py: the whole grid (bs 8, 1, 32 x B 12, 8, 4 x overlap, sync + floors),
#                  fused kernels (resumes the bench step's runtime.json)
#   tlrbench       benchmarks/bench_token_list_rebuild.py: one prefill with and without the fault, by prompt length
#                  (TLRB_TOKENS), chunk TLR_CHUNK, unprofiled; the rebuild's host steps timed alone
#   tlr            tiny preset, 16 prompts of ~16k tokens, bs 8, --queue, --max-new-tokens 24, prefill chunk 512,
#                  context 32768, 150 s a capture (TLR_TOKENS, TLR_COUNT, TLR_BS, TLR_CHUNK, TLR_MAX_LEN,
#                  TLR_LIMIT_S override these; TLR_WARMUP, TLR_ROUNDS, TLR_SHRINK: the capture window):
#                  capture with --fault token-list-rebuild and without, gaptrace analyze both and
#                  gaptrace diff clean -> fault (the traces come back when under 15 MB each)
#
# Returned under $OUT: summary.md (steps, exits, seconds, the logs' tails), runtime.json/.md, traces*.tar.gz(.part*).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/kernels_out}
BUDGET_S=${BUDGET_S:-560}
RESERVE=15
# the tlr step's long-context capture: prompts (count x tokens), batch size, prefill chunk, context capacity
TLR_TOKENS=${TLR_TOKENS:-16000} TLR_COUNT=${TLR_COUNT:-16} TLR_BS=${TLR_BS:-8} TLR_CHUNK=${TLR_CHUNK:-512}
TLR_MAX_LEN=${TLR_MAX_LEN:-32768} TLR_LIMIT_S=${TLR_LIMIT_S:-150}  # TLR_LIMIT_S: each of its two captures
TLR_WARMUP=${TLR_WARMUP:-4} TLR_ROUNDS=${TLR_ROUNDS:-14} TLR_SHRINK=${TLR_SHRINK:-}  # its capture window
TLRB_TOKENS=${TLRB_TOKENS:-16000,32000,48000,60000}  # the tlrbench step's prompt lengths
BENCH_KERNELS=${BENCH_KERNELS:-fused,eager}          # the bench step's kernel variants
BUBBLE_ENVS=${BUBBLE_ENVS:-CUDA_DEVICE_MAX_CONNECTIONS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER}
ALONE_ENVS=${ALONE_ENVS:-CUDA_DEVICE_MAX_CONNECTIONS=1}
source scripts/_steps.sh  # steps_init, left, step
steps_init kernels
TR=$WORK/traces
mkdir -p "$TR"
G=("$PY" -m gaptrace.cli)

for s in ${*:-env exact baseline bench tlr grid kernels_check}; do
  case $s in
    env)
      step env 30 bash -c "nvidia-smi -L; \"$PY\" -c 'import torch, triton, fla; print(torch.__version__, torch.version.cuda, triton.__version__, fla.__version__)'; git log -1 --oneline" ;;
    baseline)
      tgz=$(ls .whl/baseline_*.tar.gz 2>/dev/null | head -n 1)
      if [[ -z $tgz ]]; then echo "| baseline | no .whl/baseline_*.tar.gz | 0 | 0 |" >> "$STEPS_MD"; continue; fi
      mkdir -p "$WORK/old" && tar -xzf "$tgz" -C "$WORK/old" && \
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$WORK/oldsite" "$WORK/old" \
        > "$LOGS/baseline_install.log" 2>&1
      step baseline 200 env PYTHONPATH="$WORK/oldsite:${PYTHONPATH:-}" "$PY" "$WORK/old/benchmarks/bench_runtime.py" \
        --preset bench --device cuda --batch-sizes 8 --blocks 12 --kernels fused --no-floor --out "$OUT/baseline" \
        --work "$WORK/baseline" --time-budget-s @BUDGET@
      echo "baseline $(basename "$tgz"): gaptrace from $(cd "$WORK" && PYTHONPATH="$WORK/oldsite:${PYTHONPATH:-}" \
        "$PY" -c 'import gaptrace.runtime.models.fused as f; print(f.__file__)')" >> "$LOGS/baseline.log" 2>&1 ;;
    kernels_check)
      step kernels_check 330 "$PY" -m pytest -q -p no:cacheprovider tests/test_fused_kernels.py -k gpu -rs ;;
    exact)
      step exact 120 "${G[@]}" decode --preset tiny --device cuda --dtype float32 --batch-size 8 -B 8 \
        --prompts fixtures/prompts/heldout.jsonl --max-new-tokens 64 --check-exact ;;
    bench)
      step bench 240 "$PY" benchmarks/bench_runtime.py --preset bench --device cuda --batch-sizes 8 --blocks 12 \
        --kernels "$BENCH_KERNELS" --no-floor --out "$OUT" --work "$TR/bench" --keep-traces --time-budget-s @BUDGET@ ;;
    tlrbench)
      step tlrbench "$TLR_LIMIT_S" "$PY" benchmarks/bench_token_list_rebuild.py --device cuda --tokens "$TLRB_TOKENS" \
        --chunk "$TLR_CHUNK" --out "$OUT" --time-budget-s @BUDGET@ ;;
    bubble)
      step bubble_graphs_first 90 "$PY" benchmarks/bench_bubble_trigger.py --out "$OUT/bubble_graphs_first"
      step bubble_gemm_first 90 "$PY" benchmarks/bench_bubble_trigger.py --out "$OUT/bubble_gemm_first" \
        --stages none,none,gemm,none,gemm-big,none,profiler,none,fresh,graph,graph,graph,none,fresh,replays,events,none
      for e in $BUBBLE_ENVS; do
        step "bubble_${e//[^A-Za-z0-9]/_}" 90 env "$e" "$PY" benchmarks/bench_bubble_trigger.py \
          --out "$OUT/bubble_${e//[^A-Za-z0-9]/_}"
      done ;;
    law)
      T="$PY benchmarks/bench_bubble_trigger.py"
      step law_tiny 90 $T --out "$OUT/law_tiny" \
        --stages none,tiny-graph,none,tiny-graph,none,tiny-graph,none,tiny-graph,none,tiny-graph,none,graph,none,graph,none
      step law_n100 90 $T --out "$OUT/law_n100" --nodes 100 \
        --stages none,graph,none,graph,none,graph,none,graph,none,graph,none,graph,none,graph,none,graph,none
      step law_n1000 90 $T --out "$OUT/law_n1000" --nodes 1000 --stages none,graph,none,graph,none,graph,none,graph,none
      step law_free 90 $T --out "$OUT/law_free" \
        --stages none,graph,free,none,graph,free,none,graph,free,none,graph,free,none,graph,none
      ;;&
    law|law2)
      T="$PY benchmarks/bench_bubble_trigger.py"
      step law_stream 60 $T --out "$OUT/law_stream" \
        --stages none,stream,none,stream,none,stream,none,stream,none,stream,none,graph,none
      step law_memcpy 60 $T --out "$OUT/law_memcpy" --stages none,memcpy,none,memcpy,none,memcpy,none,memcpy,none,graph,none
      step law_graphedcall 60 $T --out "$OUT/law_graphedcall" --stages none,graphedcall,none,graphedcall,none,graphedcall,none
      ;;&
    law)
      step law_alone 150 "$PY" benchmarks/bench_graph_alone.py --chain-probe 300 --out "$OUT/law_alone"
      ;;&
    law|law2)
      step law_alone_two 150 "$PY" scripts/runtime_variant.py two_graphs benchmarks/bench_graph_alone.py \
        --chain-probe 300 --out "$OUT/law_alone_two" ;;
    isolated)
      tgz=$(ls .whl/baseline_*.tar.gz 2>/dev/null | head -n 1)
      mkdir -p "$WORK/old" && tar -xzf "$tgz" -C "$WORK/old" && \
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$WORK/oldsite" "$WORK/old" \
        > "$LOGS/iso_install.log" 2>&1
      cell=(--preset bench --device cuda --batch-sizes 8 --blocks 12 --kernels fused --no-floor)
      for sched in ${ISO_SCHEDULERS:-overlap sync}; do
        step "iso_new_$sched" 150 "$PY" benchmarks/bench_runtime.py "${cell[@]}" --schedulers "$sched" \
          --out "$OUT/iso_new_$sched" --work "$OUT/iso_new_$sched/traces" --keep-traces
        step "iso_base_$sched" 150 env PYTHONPATH="$WORK/oldsite:${PYTHONPATH:-}" "$PY" \
          "$WORK/old/benchmarks/bench_runtime.py" "${cell[@]}" --schedulers "$sched" --out "$OUT/iso_base_$sched" \
          --work "$WORK/iso_base_$sched"
      done
      step iso_alone 120 "$PY" benchmarks/bench_graph_alone.py --out "$OUT/iso_alone" ;;
    readme)
      for c in "8 8" "1 8" "32 12"; do
        set -- $c
        step "readme_bs$1_B$2" 200 "$PY" benchmarks/bench_runtime.py --preset bench --device cuda --batch-sizes "$1" \
          --blocks "$2" --schedulers overlap --kernels fused --out "$OUT/readme" --resume --time-budget-s @BUDGET@
      done ;;
    faststate)
      step faststate 200 "$PY" benchmarks/bench_graph_alone.py --fast-state --chain-probe 300 --out "$OUT/faststate" ;;
    alone)
      step alone_plain 150 "$PY" benchmarks/bench_graph_alone.py --out "$OUT/alone_plain"
      for e in $ALONE_ENVS; do
        step "alone_${e//[^A-Za-z0-9]/_}" 150 env "$e" "$PY" benchmarks/bench_graph_alone.py \
          --out "$OUT/alone_${e//[^A-Za-z0-9]/_}"
      done ;;
    grid)
      step grid "${GRID_LIMIT_S:-240}" "$PY" benchmarks/bench_runtime.py --preset bench --device cuda --batch-sizes 8,1,32 \
        --blocks 12,8,4 --kernels fused --out "$OUT" --work "$WORK/grid" --resume --time-budget-s @BUDGET@ ;;
    tlr)
      "$PY" scripts/long_prompts.py --tokens "$TLR_TOKENS" --count "$TLR_COUNT" -o "$WORK/long.jsonl" \
        2> "$LOGS/long_prompts.log"
      common=(--preset tiny --device cuda --batch-size "$TLR_BS" --prompts "$WORK/long.jsonl" --queue
              --max-new-tokens 24 --prefill-chunk "$TLR_CHUNK" --max-seq-len "$TLR_MAX_LEN"
              --warmup-rounds "$TLR_WARMUP" --rounds "$TLR_ROUNDS")
      [[ -n $TLR_SHRINK ]] && common+=(--shrink-at-round "$TLR_SHRINK")
      name=h200_tiny_overlap_bs${TLR_BS}_B8_long$(( TLR_TOKENS / 1000 ))k
      step tlr_fault "$TLR_LIMIT_S" "${G[@]}" capture "${common[@]}" --fault token-list-rebuild \
        -o "$TR/${name}_token-list-rebuild.json.gz"
      step tlr_clean "$TLR_LIMIT_S" "${G[@]}" capture "${common[@]}" -o "$TR/$name.json.gz"
      for f in "$TR/$name"*.json.gz; do
        [[ -f $f ]] && step "analyze_$(basename "$f" .json.gz)" 90 "${G[@]}" analyze "$f"
      done
      step tlr_diff 90 "${G[@]}" diff "$TR/$name.json.gz" "$TR/${name}_token-list-rebuild.json.gz"
      # traces back when small enough to travel (a file under 15 MB), else only the text above
      for f in "$TR/$name"*; do
        (( $(stat -c %s "$f") < 15000000 )) && cp "$f" "$OUT/"
      done
      rm -f "$TR/$name"* ;;
    *) echo "| $s | unknown step | 0 | 0 |" >> "$STEPS_MD" ;;
  esac
done

{
  echo "# kernels_h200 ($(date '+%Y-%m-%d %H:%M'), $(( $(date +%s) - T0 )) s)"; echo; cat "$STEPS_MD"; echo
  grep -h "exact [0-9]" "$LOGS"/exact.log 2>/dev/null | tr '\r' '\n' | tail -n 2
  for l in "$LOGS"/*.log; do echo "## $(basename "$l")"; echo '```'; tr '\r' '\n' < "$l" | grep -v '^\s*$' | tail -n 60; echo '```'; done
} > "$OUT/summary.md"
# traces back (the fused bs-8 B-12 bench cells): gzip, one tar, split under the tool's 16 MiB per file
find "$TR" -name '*.json' ! -name '*.gaptrace.json' -exec gzip -f {} \;
(cd "$TR/bench" 2>/dev/null && tar -czf "$WORK/traces.tar.gz" ./*bs8_B12_fused* ) && \
  split -b 15M -d "$WORK/traces.tar.gz" "$OUT/traces.tar.gz.part"
ls -la "$OUT"
cat "$OUT/summary.md" | head -150
