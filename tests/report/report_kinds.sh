#!/bin/bash
# Writes every kind of HTML report (simulate, search, scale, validate under mpirun, profile show,
# and tedsim report from saved JSON) and loads each in headless Chromium (check_html_report.py):
# no console message, nothing fetched, every plot drew marks, not blank. Screenshots go to OUT.
#   report_kinds.sh TEDSIM MPIRUN OUT
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 OUT=$3
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
status=0
fail() { echo "FAIL: $*"; status=1; }
check() {  # check NAME MIN_PLOTS: the report OUT/NAME.html in a browser
  python3 "$HERE/check_html_report.py" "$OUT/$1.html" --plots "$2" --screenshot "$OUT/$1.png" || fail "$1 report"
}
run() {  # run LOG COMMAND...: a tedsim command that must succeed
  local log=$1; shift
  "$@" > "$OUT/$log.log" 2>&1 || { fail "$* exited $?"; tail -20 "$OUT/$log.log"; }
}

run simulate "$TEDSIM" simulate --model ted-6.7b --pp 2 --vpp 2 --tp 2 --ep 16 --gpus 128 --json "$OUT/simulate.json" \
  --html "$OUT/simulate.html"
check simulate 4
grep -q '"lane":"stage 1 compute"' "$OUT/simulate.html" || fail "the simulate report has no timeline of stage 1"
grep -q '>expert_fc1</td>' "$OUT/simulate.html" || fail "the simulate report has no op table"

run search "$TEDSIM" search --model ted-1.3b --gpus 32 --global-batch 256 --threads 1 --json "$OUT/search.json" \
  --html "$OUT/search.html"
check search 3
python3 - "$OUT/search.json" <<'PY' || fail "search JSON points"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["points"]) == d["feasible"], (len(d["points"]), d["feasible"])
assert d["why"][0].startswith("why this plan"), d["why"][:1]
for r in d["results"]:  # a folded plan predicts what the row it folds into does
    if "folded_into_rank" in r:
        row = d["results"][r["folded_into_rank"] - 1]
        assert abs(r["iteration_time_s"] - row["iteration_time_s"]) <= 1e-9 * row["iteration_time_s"], (r, row)
PY

run scale "$TEDSIM" scale --model ted-1.3b --gpus 16,32,64 --global-batch 256 --threads 1 --json "$OUT/scale.json" \
  --html "$OUT/scale.html"
check scale 2

run calibrate "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --quick --model tiny-moe \
  --out "$OUT/profile.json"
run profile "$TEDSIM" profile show "$OUT/profile.json" --html "$OUT/profile.html"
check profile 3

run validate "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --tp 1 --ep 2 \
  --global-batch 8 --warmup 1 --iters 3 --profile "$OUT/profile.json" --json "$OUT/validate.json" --html "$OUT/validate.html"
check validate 3
grep -q "over the measured profile's spread" "$OUT/validate.html" || fail "the validate report does not give the prediction's range"

# One page from saved results of every kind (a saved simulate result has no timeline but its ops:
# 3 + 3 + 2 + 3 + 3 plots).
run report "$TEDSIM" report "$OUT/simulate.json" "$OUT/search.json" "$OUT/scale.json" "$OUT/validate.json" \
  "$OUT/profile.json" --html "$OUT/combined.html"
check combined 14
grep -q "saved --json results leave it out" "$OUT/combined.html" || fail "the combined report does not say where the timeline went"
exit $status
