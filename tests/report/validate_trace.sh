#!/bin/bash
# validate --trace and --trace-predicted on 2 ranks (expert all-to-all, ZeRO-1 gradient sync):
# both files parse as Chrome trace events; the measured one has a process per rank, each with
# slices that tile its iteration; every measured name but the "compute" filler is one the
# prediction uses, and every collective the prediction names is measured. --kernel-times: the
# table names each kind of kernel the step runs, with a predicted and a measured time for the ones
# the cost model prices, and its totals are the sums of its rows; its predicted total is the phase
# table's predicted compute, optimizer and other (every micro-batch, not only those the predicted
# trace draws op by op: 16 sequences make 4 micro-batches per replica).
#   validate_trace.sh TEDSIM MPIRUN DIR
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
mkdir -p "$DIR"
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model tiny-moe --tp 1 --ep 2 --global-batch 16 \
  --warmup 1 --iters 3 --kernel-times --trace "$DIR/measured.json" --trace-predicted "$DIR/predicted.json" > "$DIR/validate.log" 2>&1 ||
  { echo "FAIL: validate exited $?"; cat "$DIR/validate.log"; exit 1; }
python3 - "$DIR/measured.json" "$DIR/predicted.json" "$DIR/validate.log" <<'PY'
import json, sys
def slices(path):
    doc = json.load(open(path))
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0, e
    return events, [e for e in events if e["ph"] == "X"]
m_all, measured = slices(sys.argv[1])
p_all, predicted = slices(sys.argv[2])
ranks = sorted({e["pid"] for e in measured})
assert ranks == [0, 1], f"processes {ranks}, expected one per rank"
names = {e["pid"]: e["args"]["name"] for e in m_all if e["name"] == "process_name"}
assert sorted(names) == ranks and all("rank" in n for n in names.values()), names
for r in ranks:  # slices tile the iteration: each starts where the last ended
    mine = sorted((e for e in measured if e["pid"] == r), key=lambda e: e["ts"])
    for a, b in zip(mine, mine[1:]):
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, (a, b)
measured_names = {e["name"] for e in measured}
predicted_names = {e["name"] for e in predicted}
extra = measured_names - predicted_names - {"compute"}
assert not extra, f"measured slices the prediction does not name: {sorted(extra)}"
collectives = {e["name"] for e in predicted if e["cat"] in ("ep_alltoall", "tp_allreduce", "tp_allgather")}
collectives |= {e["name"] for e in predicted if e["cat"] == "dp_grad_sync" and not e["name"].startswith("wait")}
missing = collectives - measured_names
assert not missing, f"collectives the prediction names but the measured trace lacks: {sorted(missing)}"
assert {"ep_alltoall_dispatch", "ep_alltoall_combine", "grad_sync_nonexpert"} <= measured_names, sorted(measured_names)
rows = {}
lines = open(sys.argv[3]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("kernels (rank 0)"))
for line in lines[start + 2:]:
    if not line.strip() or line.startswith(("trace:", "verdict")):
        break
    cells = line.split()
    numbers = [c for c in cells if c.replace(".", "", 1).isdigit() or c == "-"]
    kind = line[:line.index(numbers[0])].strip() if numbers else line.strip()
    rows[kind] = [c for c in cells[len(kind.split()):]]
for kind in ("GEMMs", "attention core", "optimizer", "norms", "dispatch and combine", "router"):
    assert kind in rows, f"--kernel-times lacks {kind}: {sorted(rows)}"
    calls, predicted_ms, measured_ms, error = rows[kind]
    assert float(calls) > 0 and float(predicted_ms) > 0 and float(measured_ms) > 0, (kind, rows[kind])
total = rows["all kernels"]
priced = [k for k in rows if k != "all kernels"]
assert abs(sum(float(rows[k][2]) for k in priced) - float(total[1])) < 0.01 * len(priced), rows
assert abs(sum(float(rows[k][1]) for k in priced if rows[k][1] != "-") - float(total[0])) < 0.01 * len(priced), rows
top = next(i for i, l in enumerate(lines) if l.startswith("phase "))
bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("iteration "))
phase = {l.split()[0]: float(l.split()[1]) for l in lines[top:bottom] if l.split()[:1] in (["compute"], ["optimizer"], ["other"])}
assert len(phase) == 3, phase
expected = phase["compute"] + phase["optimizer"] + phase["other"]
assert abs(float(total[0]) - expected) <= 0.02 * expected, (total, phase)
print(f"ok: {len(measured)} measured slices on {len(ranks)} ranks, {len(predicted)} predicted; "
      f"shared names {sorted(measured_names & predicted_names)}")
PY
