#!/bin/bash
# A dropless model's calibration counts how the step's own router spreads the step's tokens over
# the experts (expert_shares in the profile), and predictions with that profile take the busiest
# expert rank's load from it, unless the model or --imbalance states an imbalance, or the profile
# measured another model.
#   calibrate_routing.sh TEDSIM MPIRUN DIR
set -euo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
mkdir -p "$DIR"
P="$DIR/routing.json"
rm -f "$P" "$P.partial"
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --quick --model cpu-moe-fine --out "$P" \
  > "$DIR/routing-calibrate.log" 2>&1 || { cat "$DIR/routing-calibrate.log"; exit 1; }
grep -Eq "^calibrate: routing of the step's tokens \(24 MoE layer passes of [0-9]+ rows\): the busiest expert [0-9.]+x the mean, the busiest of 2 expert ranks [0-9.]+x" \
  "$DIR/routing-calibrate.log" || { cat "$DIR/routing-calibrate.log"; exit 1; }
# profile show lists the routing: the busiest rank's load for each expert degree.
"$TEDSIM" profile show "$P" > "$DIR/routing-show.txt"
grep -Eq "^# routing of the step's tokens by model 'cpu-moe-fine': 24 MoE layer passes of 1024 rows; busiest expert [0-9.]+x the mean" \
  "$DIR/routing-show.txt" || { cat "$DIR/routing-show.txt"; exit 1; }
sim() { "$TEDSIM" simulate --model "$1" --topology local-cpu --gpus 2 --tp 1 --ep 2 --micro-batch 2 --global-batch 8 \
          --no-checkpoint --profile "$P" --json "$DIR/routing-$2.json" "${@:3}" > "$DIR/routing-$2.txt" 2>&1; }
sim cpu-moe-fine measured
sim cpu-moe-fine stated --imbalance 1.2
sim cpu-qwen-moe other
grep -q "dropless (busiest expert [0-9.]*x the mean, as calibration routed the step's tokens)" "$DIR/routing-measured.txt"
grep -q "dropless (busiest expert 1.20x the mean)" "$DIR/routing-stated.txt"
python3 - "$P" "$DIR" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["expert_shares"]
# cpu-moe-fine: 3 MoE layers of 16 experts, 8 forward passes of one sequence (128 tokens) per rank,
# top-4: 2 x 128 x 4 rows a pass.
assert s["model"] == "cpu-moe-fine" and s["rows_per_pass"] == 1024, s
assert len(s["passes"]) == 24 and all(len(p) == 16 for p in s["passes"]), len(s["passes"])
assert all(abs(sum(p) - 1) < 1e-9 and min(p) >= 0 for p in s["passes"])
# Two expert ranks of 8 experts each: the busiest of the two, per pass, then the mean.
load = sum(2 * max(sum(p[:8]), sum(p[8:])) for p in s["passes"]) / len(s["passes"])
imbalance = sum(16 * max(p) for p in s["passes"]) / len(s["passes"])
def routing(name):
    return json.load(open(f"{sys.argv[2]}/routing-{name}.json"))["routing"]
m = routing("measured")
assert m["from"] == "calibration" and abs(m["busiest_rank_load"] - load) < 1e-9 and abs(m["imbalance"] - imbalance) < 1e-9, (m, load)
st = routing("stated")
assert st["from"] == "stated" and st["imbalance"] == 1.2 and st["busiest_rank_load"] < load, st
o = routing("other")  # another model's routing is not this one's
assert o["from"] == "default" and o["imbalance"] == 1.2, o
# The mean rank waits in the all-to-all for the busiest: a busier rank, a longer exchange.
a2a = lambda name: json.load(open(f"{sys.argv[2]}/routing-{name}.json"))["breakdown_s"]["ep_alltoall"]
assert load > 1.05 and a2a("measured") > a2a("stated"), (load, a2a("measured"), a2a("stated"))
PY
# validate --calibrate counts the routing into a profile that holds none, and the prediction of
# the same run takes it.
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d.pop('expert_shares'); json.dump(d, open(sys.argv[2], 'w'))" \
  "$P" "$DIR/routing-none.json"
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model cpu-moe-fine --tp 1 --ep 2 --micro-batch 2 \
  --global-batch 8 --no-checkpoint --warmup 0 --iters 1 --calibrate --profile "$DIR/routing-none.json" \
  --json "$DIR/routing-validate.json" > "$DIR/routing-validate.log" 2>&1 || { cat "$DIR/routing-validate.log"; exit 1; }
grep -q "^validate --calibrate: measured .* and the step's routing into " "$DIR/routing-validate.log" ||
  { cat "$DIR/routing-validate.log"; exit 1; }
python3 - "$DIR/routing-none.json" "$DIR/routing-validate.json" <<'PY'
import json, sys
p, v = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert p["expert_shares"]["model"] == "cpu-moe-fine" and len(p["expert_shares"]["passes"]) == 24, p.get("expert_shares")
assert v["imbalance"]["assumed_from"] == "calibration", v["imbalance"]
PY
# A model the training step refuses (dropout) keeps its timings: the routing is not counted, and
# the calibration says so and still writes its profile.
sed 's/^name: .*/name: cpu-moe-fine-dropout/' "$(dirname "$0")/../../models/cpu-moe-fine.yaml" > "$DIR/dropout.yaml"
echo "hidden_dropout: 0.1" >> "$DIR/dropout.yaml"
rm -f "$DIR/dropout.json" "$DIR/dropout.json.partial"
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --quick --model "$DIR/dropout.yaml" \
  --out "$DIR/dropout.json" > "$DIR/dropout-calibrate.log" 2>&1 || { cat "$DIR/dropout-calibrate.log"; exit 1; }
grep -q "^calibrate: routing not counted: the training step does not run model 'cpu-moe-fine-dropout': .*dropout" \
  "$DIR/dropout-calibrate.log" || { cat "$DIR/dropout-calibrate.log"; exit 1; }
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert 'expert_shares' not in d and d['gemm'], list(d)" \
  "$DIR/dropout.json"
echo "calibrate_routing: OK"
