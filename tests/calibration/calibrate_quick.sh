#!/bin/bash
# mpirun -np 2 tedsim calibrate --backend cpu --quick (tiny-moe, local-cpu); then profile show.
set -euo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
mkdir -p "$DIR"
rm -f "$DIR/quick.json" "$DIR/quick.json.partial"
# On calibrate's defaults (tiny-moe, local-cpu, cpu), so the help's defaults can be checked below.
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --quick --out "$DIR/quick.json"
test -s "$DIR/quick.json"
test ! -e "$DIR/quick.json.partial"
"$TEDSIM" profile show "$DIR/quick.json" > "$DIR/show.txt"
grep -q '"complete":true' "$DIR/show.txt" || grep -q 'calibration' "$DIR/show.txt"
grep -q '# collectives' "$DIR/show.txt"
grep -q 'all_to_all' "$DIR/show.txt"
# Quick measures every size the model sends, with fewer repetitions: its gradient buckets (the
# largest messages) are inside the measured collective sizes, and the sentinel GEMM timed before
# the first point and after the last is recorded.
"$TEDSIM" calibrate --help > "$DIR/help.txt"
python3 - "$DIR/quick.json" "$DIR/help.txt" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
# calibrate --help states the defaults this run resolved to.
help_text = open(sys.argv[2]).read()
def stated(flag):
    m = re.search(r"^  " + re.escape(flag) + r" \S+?=(\S+)", help_text, re.M)
    return m.group(1) if m else None
def in_words(flag, pattern):
    line = next(l for l in help_text.splitlines() if l.startswith("  " + flag + " "))
    return re.search(pattern, line).group(1)
a = d["calibration"]["arguments"]
assert stated("--backend") == a["backend"] == "cpu", (stated("--backend"), a["backend"])
assert stated("--model") == a["model"], (stated("--model"), a["model"])
assert stated("--topology") == a["topology"], (stated("--topology"), a["topology"])
assert int(in_words("--reps", r"quick (\d+)")) == a["reps"], a["reps"]
assert int(in_words("--warmup", r"quick (\d+)")) == a["warmup"], a["warmup"]
assert int(in_words("--min-bytes", r"default (\d+)")) == a["min_bytes"], a["min_bytes"]
assert float(in_words("--step-factor", r"default (\d+)")) == a["step_factor"], a["step_factor"]
assert a["world"] == a["gpus"] == 2, a  # --gpus: "default: MPI world size"
args, drift = d["calibration"]["arguments"], d["calibration"]["drift"]
assert args["quick"] and args["reps"] == 5 and args["step_factor"] == 2, args
assert args["max_bytes"] >= 2 * 646 * 1024, args  # twice tiny-moe's 646 KiB ZeRO gradient message at 2 ranks
assert drift["before_s"] > 0 and drift["after_s"] > 0 and len(drift["gemm"]) == 4, drift
assert len(d["gemm"]) > 12, len(d["gemm"])
# The arrival-skew loop on the 2-rank group: quick's three segments, each measured on both ranks,
# in increasing compute (the shortest is three GEMMs of about 100 us each).
skew = d["arrival_skew"]
assert [(p["ranks"], p["nodes"]) for p in skew] == [(2, 1)] * 3, skew
computes = [p["compute_s"] for p in skew]
assert computes == sorted(computes) and computes[0] < 5e-3 and computes[-1] > 40e-3, computes
for p in skew:
    w = p["wait_s"]
    assert 0 <= w["min"] <= w["mean"] <= w["max"] and w["p90"] >= 0 and p["samples"] >= 10, p
PY
echo "calibrate_quick: OK"
