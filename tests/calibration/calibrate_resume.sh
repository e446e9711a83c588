#!/bin/bash
# A calibration stopped part-way (--stop-after N, twice) resumes and ends
# with the same set of points as an uninterrupted run (compared with `profile diff`).
set -euo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
OUT="$DIR/resumed.json"
rm -f "$OUT" "$OUT.partial"
run() { "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick \
          --model tiny-moe --topology local-cpu --out "$OUT" "$@"; }
run --stop-after 7
test -e "$OUT.partial" && test ! -e "$OUT"
run --stop-after 9
test -e "$OUT.partial" && test ! -e "$OUT"
# Different arguments must be refused (exit 2), leaving the partial file alone.
set +e
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick --reps 3 \
  --model tiny-moe --topology local-cpu --out "$OUT" 2> "$DIR/refused.txt"
rc=$?
set -e
test $rc -ne 0 || { echo "mismatched arguments were not refused"; exit 1; }
grep -q "different arguments" "$DIR/refused.txt"
test -e "$OUT.partial"
run
test -s "$OUT" && test ! -e "$OUT.partial"
"$TEDSIM" profile diff "$DIR/quick.json" "$OUT" > "$DIR/diff.txt"
grep -q "^0 points only in A, 0 only in B" "$DIR/diff.txt" || { cat "$DIR/diff.txt"; echo "point sets differ"; exit 1; }
echo "calibrate_resume: OK"
