#!/bin/bash
# mpirun -np 2 tedsim calibrate --backend cpu --quick (tiny-moe, local-cpu); then profile show.
set -euo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
mkdir -p "$DIR"
rm -f "$DIR/quick.json" "$DIR/quick.json.partial"
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick \
  --model tiny-moe --topology local-cpu --out "$DIR/quick.json"
test -s "$DIR/quick.json"
test ! -e "$DIR/quick.json.partial"
"$TEDSIM" profile show "$DIR/quick.json" > "$DIR/show.txt"
grep -q '"complete":true' "$DIR/show.txt" || grep -q 'calibration' "$DIR/show.txt"
grep -q '# collectives' "$DIR/show.txt"
grep -q 'all_to_all' "$DIR/show.txt"
# Quick measures every size the model sends, with fewer repetitions: its gradient buckets (the
# largest messages) are inside the measured collective sizes, and the sentinel GEMM timed before
# the first point and after the last is recorded.
python3 - "$DIR/quick.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
args, drift = d["calibration"]["arguments"], d["calibration"]["drift"]
assert args["quick"] and args["reps"] == 5 and args["step_factor"] == 2, args
assert args["max_bytes"] >= 2 * 646 * 1024, args  # twice tiny-moe's 646 KiB ZeRO gradient message at 2 ranks
assert drift["before_s"] > 0 and drift["after_s"] > 0 and len(drift["gemm"]) == 4, drift
assert len(d["gemm"]) > 12, len(d["gemm"])
PY
echo "calibrate_quick: OK"
