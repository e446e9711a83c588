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
echo "calibrate_quick: OK"
