#!/bin/bash
# validate's loss on a held-out batch: on one rank, on two data and expert parallel ranks (the loss
# summed over replicas) and on two pipeline stages (summed over stages: the last holds the loss).
# The JSON field is there with the batch after the last step, the numbers are finite, the model
# learns (tiny-moe at validate's default lr: after < before), and the two-rank values are the
# one-rank value within the parallel equivalence tests' tolerance; the text line says the same.
# At --lr 0.5 the held-out loss rises and validate advises a lower --lr. --kernel-times leaves the
# held-out loss out (its counts must be the steps' alone).
#   validate_held_out_loss.sh TEDSIM MPIRUN DIR
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
mkdir -p "$DIR"
for run in np1:1:1:1 np2:2:2:1 pp2:2:1:2; do
  IFS=: read -r name np ep pp <<< "$run"
  "$MPIRUN" -np "$np" --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --tp 1 --ep "$ep" \
    --pp "$pp" --global-batch 16 --warmup 1 --iters 4 --json "$DIR/$name.json" > "$DIR/$name.log" 2>&1 ||
    { echo "FAIL: validate $name exited $?"; cat "$DIR/$name.log"; exit 1; }
done
# A learning rate far too high: the held-out loss rises, and validate says what to do about it.
"$MPIRUN" -np 1 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --global-batch 8 \
  --warmup 1 --iters 2 --lr 0.5 > "$DIR/high-lr.log" 2>&1 ||
  { echo "FAIL: validate --lr 0.5 exited $?"; cat "$DIR/high-lr.log"; exit 1; }
"$MPIRUN" -np 1 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --global-batch 16 \
  --warmup 1 --iters 2 --kernel-times --json "$DIR/census.json" > "$DIR/census.log" 2>&1 ||
  { echo "FAIL: validate --kernel-times exited $?"; cat "$DIR/census.log"; exit 1; }
python3 - "$DIR" <<'PY'
import json, math, re, sys
d = sys.argv[1]
held = {}
for np in ("np1", "np2", "pp2"):
    doc = json.load(open(f"{d}/{np}.json"))
    h = doc["held_out_loss"]
    assert h["batch"] == 6, h  # 1 warm-up + 4 steps: the samples of step 6
    assert math.isfinite(h["before"]) and math.isfinite(h["after"]), h
    assert h["after"] < h["before"] - 0.05, f"{np} ranks: tiny-moe did not learn: {h}"
    text = open(f"{d}/{np}.log").read()
    m = re.search(r"loss on a held-out batch \(step 6's samples, never trained on\): ([\d.]+) before the first step -> ([\d.]+) after the last", text)
    assert m, f"{np} ranks: no held-out line"
    assert abs(float(m.group(1)) - h["before"]) < 1e-4 and abs(float(m.group(2)) - h["after"]) < 1e-4, (m.groups(), h)
    held[np] = h
for key in ("before", "after"):
    for two in ("np2", "pp2"):
        a, b = held["np1"][key], held[two][key]
        assert abs(a - b) <= 1e-4 * abs(a), f"{key}: one rank {a}, {two} {b}"
lost = "note: the model lost ground on the held-out batch"
assert lost in open(f"{d}/high-lr.log").read(), "no advice when the held-out loss rises"
assert lost not in open(f"{d}/np1.log").read(), "advice although the model learned"
census = json.load(open(f"{d}/census.json"))
assert "held_out_loss" not in census, "--kernel-times must not evaluate the held-out batch"
assert "held-out" not in open(f"{d}/census.log").read()
print("held-out loss:", held)
PY
