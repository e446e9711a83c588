#!/bin/bash
# Errors only rank 0 meets (it alone reads the partial profile and writes the profiles) must end
# every rank with rank 0's message, not leave the others waiting in a collective forever; and
# bad flags are refused with exit code 2.
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3 MODELS=$4
mkdir -p "$DIR"
run_with() { timeout 60 "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick \
               --topology local-cpu "$@" 2> "$DIR/errors.txt" > /dev/null; }
run() { run_with --model tiny-moe "$@"; }
expect() {  # expect CODE TEXT: the last run exited CODE (not 124: timeout) with TEXT on stderr
  if [ "$rc" -eq 124 ]; then echo "FAIL: timed out (a rank waited forever)"; exit 1; fi
  if [ "$rc" -ne "$1" ]; then echo "FAIL: exit code $rc, expected $1"; cat "$DIR/errors.txt"; exit 1; fi
  grep -qF -- "$2" "$DIR/errors.txt" || { echo "FAIL: stderr lacks: $2"; cat "$DIR/errors.txt"; exit 1; }
}

# The output directory does not exist: rank 0 cannot write the partial profile.
run --out "$DIR/no-such-dir/profile.json"; rc=$?
expect 1 "cannot write"

# A corrupt partial profile from an earlier run: rank 0 cannot read it.
OUT="$DIR/corrupt.json"
rm -f "$OUT"
printf '{"broken": ' > "$OUT.partial"
run --out "$OUT"; rc=$?
expect 2 "$OUT.partial"
rm -f "$OUT.partial"

# A model file edited between an interrupted run and its resume (same name, other shapes): the
# points differ, so the resume is refused and the partial profile is left alone.
OUT="$DIR/edited.json"
rm -f "$OUT" "$OUT.partial"
cp "$MODELS/tiny-moe.yaml" "$DIR/edited-moe.yaml"
run_with --model "$DIR/edited-moe.yaml" --out "$OUT" --stop-after 3; rc=$?
[ "$rc" -eq 0 ] && [ -e "$OUT.partial" ] || { echo "FAIL: the first, stopped run (rc $rc)"; cat "$DIR/errors.txt"; exit 1; }
sed -i 's/^hidden: 64/hidden: 128/' "$DIR/edited-moe.yaml"
grep -q '^hidden: 128' "$DIR/edited-moe.yaml" || { echo "FAIL: could not edit the model copy"; exit 1; }
run_with --model "$DIR/edited-moe.yaml" --out "$OUT"; rc=$?
expect 2 "different arguments"
[ -e "$OUT.partial" ] || { echo "FAIL: the partial profile was removed"; exit 1; }

# A negative warm-up count is an error, not the default.
run --warmup -5 --out "$DIR/warmup.json"; rc=$?
expect 2 "--warmup: expected a count >= 0, got -5"
echo "calibrate_errors: OK"
