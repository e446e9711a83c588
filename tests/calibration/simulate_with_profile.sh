#!/usr/bin/env bash
# `tedsim simulate --profile` and `tedsim search --profile` on a profile calibrated by the quick
# test: both run, say which profile they used, and produce a prediction that differs from the
# analytic one (the measured timings are really used).
set -euo pipefail
tedsim=$1; profile=$2
measured=$("$tedsim" simulate --model tiny-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 \
  --profile "$profile" --json - 2>/dev/null)
analytic=$("$tedsim" simulate --model tiny-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 --json - 2>/dev/null)
python3 - "$measured" "$analytic" <<'PY'
import json, sys
m, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert "measured" in m["profile"], m["profile"]
assert m["iteration_time_s"] > 0
assert abs(m["iteration_time_s"] - a["iteration_time_s"]) > 1e-9, "measured profile gave the analytic answer"
# The prediction over the profile's spread brackets it; an analytic profile has no spread.
low, high = m["iteration_time_s_range"]
assert 0 < low <= m["iteration_time_s"] <= high and low < high, (low, m["iteration_time_s"], high)
assert "iteration_time_s_range" not in a, a.get("iteration_time_s_range")
print("measured", m["iteration_time_s"], "analytic", a["iteration_time_s"])
PY
"$tedsim" search --model tiny-moe --topology local-cpu --gpus 2 --global-batch 8 --top 3 --profile "$profile" | tail -4
# A profile of another model is named as such; the model it was calibrated for is not.
other=$("$tedsim" simulate --model cpu-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 --profile "$profile" 2>&1)
grep -q "profile mismatch: calibrated for model 'tiny-moe', this job is 'cpu-moe'" <<< "$other" ||
  { echo "no mismatch warning for a tiny-moe profile used on cpu-moe:"; tail -5 <<< "$other"; exit 1; }
same=$("$tedsim" simulate --model tiny-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 --profile "$profile" 2>&1)
if grep -q "profile mismatch" <<< "$same"; then echo "a mismatch warning for the calibrated model itself"; exit 1; fi
echo "mismatch warning: ok"
# The other model leans on lookups far outside what was measured: their share of the prediction
# is printed and in the JSON; the calibrated model's own prediction has next to none.
grep -q "% of the predicted iteration (.*) rests on lookups more than 4x outside the measured sizes" <<< "$other" ||
  { echo "no far-extrapolation share for cpu-moe on a tiny-moe profile"; tail -8 <<< "$other"; exit 1; }
if grep -q "rests on lookups more than" <<< "$same"; then echo "a far-extrapolation share for the calibrated model"; exit 1; fi
share=$("$tedsim" simulate --model cpu-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 --profile "$profile" \
  --json - 2>/dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['profile_far_share'])")
# (A quick profile measures every size tiny-moe sends, so cpu-moe's larger messages are what
# lies far outside it: about a tenth of its iteration.)
python3 -c "import sys; s = float(sys.argv[1]); assert 0.03 < s < 1, s" "$share" ||
  { echo "profile_far_share $share out of range"; exit 1; }
echo "far-extrapolation share: ok ($share of cpu-moe's iteration)"
