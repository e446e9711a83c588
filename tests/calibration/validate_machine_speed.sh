#!/bin/bash
# validate times the profile's sentinel GEMM (calibration.drift) again before the step and says how
# this machine's speed compares with the minutes the profile was measured in: a line and the JSON
# key machine_speed always, a warning beyond 35%. A profile whose sentinel claims a machine 4x
# faster than this one gets the warning; a profile without a sentinel gets neither.
#   validate_machine_speed.sh TEDSIM MPIRUN DIR
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
LOG="$DIR/validate-speed.log"
fail() { echo "FAIL: $*"; cat "$LOG"; exit 1; }
run() {
  "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --tp 1 --ep 2 \
    --global-batch 8 --warmup 1 --iters 2 --profile "$1" --json "$DIR/validate-speed.json" > "$LOG" 2>&1 ||
    fail "validate exited $?"
}
edit() {  # edit IN OUT PYTHON: OUT is IN's JSON after PYTHON (on the dict d)
  python3 - "$1" "$2" "$3" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
}
change() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['machine_speed']['change'])" "$DIR/validate-speed.json"; }

run "$DIR/quick.json"
grep -Eq "^machine speed: the profile's sentinel GEMM [0-9]+x[0-9]+x[0-9]+.* took [0-9.]+ us when calibrated and [0-9.]+ us around this run \([+-][0-9]+%\)" \
  "$LOG" || fail "no machine speed line for a calibrated profile"
python3 -c "import sys; c = float(sys.argv[1]); assert -0.9 < c < 9, c" "$(change)" || fail "machine_speed.change out of range"

edit "$DIR/quick.json" "$DIR/fast-sentinel.json" \
  'c = d["calibration"]["drift"]; c["before_s"] /= 4; c["after_s"] /= 4'
run "$DIR/fast-sentinel.json"
grep -Eq "^WARNING: this machine runs [0-9]+% slower than when the profile was measured" "$LOG" ||
  fail "no warning for a sentinel 4x faster than this machine"
python3 -c "import sys; c = float(sys.argv[1]); assert c > 0.35, c" "$(change)" || fail "machine_speed.change not above 35%"

edit "$DIR/quick.json" "$DIR/no-sentinel.json" 'del d["calibration"]["drift"]'
run "$DIR/no-sentinel.json"
if grep -q "machine speed" "$LOG"; then fail "a machine speed line without a sentinel"; fi
python3 -c "import json, sys; assert 'machine_speed' not in json.load(open(sys.argv[1]))" "$DIR/validate-speed.json" ||
  fail "machine_speed in the JSON without a sentinel"
echo "machine speed: ok"
