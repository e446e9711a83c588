#!/bin/bash
# --backend cuda without a device: exit 1 with a clear "no CUDA device" message, no crash.
set -uo pipefail
TEDSIM=$1 DIR=$2
if command -v nvidia-smi > /dev/null && nvidia-smi -L 2>/dev/null | grep -q "GPU [0-9]"; then
  echo "a GPU is present: nothing to test"; exit 77
fi
mkdir -p "$DIR"
"$TEDSIM" calibrate --backend cuda --quick --out "$DIR/cuda.json" 2> "$DIR/no_cuda.txt"
rc=$?
cat "$DIR/no_cuda.txt"
test $rc -eq 1 || { echo "expected exit 1, got $rc"; exit 1; }
grep -q "no CUDA device" "$DIR/no_cuda.txt" || exit 1
echo "calibrate_no_cuda: OK"
