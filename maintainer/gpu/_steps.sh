# Shared by the H200 driver scripts (sourced): run steps under `timeout` within one time budget, logs kept.
#   source maintainer/gpu/_steps.sh   # then:
#   steps_init NAME            # T0 (now), WORK (a new temporary directory), LOGS, STEPS_MD (the table header); makes
#                              # $OUT and $LOGS; the caller sets OUT, BUDGET_S and RESERVE first
#   step NAME MAX_S CMD...     # runs CMD for min(MAX_S, time left - RESERVE) s, output to $LOGS/NAME.log, a row
#                              # in $STEPS_MD; @BUDGET@ in CMD becomes that limit minus 15 s (for scripts that stop
#                              # starting work in time); a failing step does not stop the others

steps_init() {
  T0=$(date +%s)
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/gaptrace_$1.XXXXXX")
  LOGS=$WORK/logs
  STEPS_MD=$WORK/steps.md
  mkdir -p "$OUT" "$LOGS"
  export PYTHONUNBUFFERED=1
  printf '| step | exit | seconds | limit s |\n| --- | --- | --- | --- |\n' > "$STEPS_MD"
}

left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

step() {
  local name=$1 max=$2; shift 2
  local lim=$(( $(left) - RESERVE ))
  (( lim > max )) && lim=$max
  if (( lim < 20 )); then
    echo "| $name | not run (no time left) | 0 | $lim |" >> "$STEPS_MD"
    echo "[$(date +%T)] $name: not run (no time left)" >&2
    return 0
  fi
  local args=() x
  for x in "$@"; do args+=("${x//@BUDGET@/$(( lim - 15 ))}"); done
  local s=$(date +%s) rc
  echo "[$(date +%T)] $name (limit $lim s): ${args[*]}" >&2
  timeout -k 5 "$lim" "${args[@]}" > "$LOGS/$name.log" 2>&1
  rc=$?
  local why=""
  (( rc == 124 || rc == 137 )) && why=" (timeout)"
  echo "| $name | $rc$why | $(( $(date +%s) - s )) | $lim |" >> "$STEPS_MD"
  echo "[$(date +%T)] $name: exit $rc$why after $(( $(date +%s) - s )) s" >&2
  return 0
}
