#!/usr/bin/env bash
# Re-simulates published training measurements (configs/published/results.json) with the shipped
# models and topologies, one topology per machine for all of its rows and no per-row knobs, and
# tabulates predicted against published with the error of every row, per source and overall.
#
# usage: scripts/published-results.sh [--tedsim PATH] [--out FILE] [--check]
#   --out FILE   the report to write (default reports/published-results.md)
#   --check      write nothing; fail (exit 1) when the overall mean absolute error is more than 2
#                points above the one committed in reports/published-results.md, so a change
#                cannot quietly make predictions worse
# Every row runs `tedsim simulate` on the analytic profile: full activation recomputation (as the
# sources trained), micro-batch 1 unless the row says otherwise, no ZeRO (the sources predate it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tedsim="$root/build/tedsim"
out="$root/reports/published-results.md"
check=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tedsim) tedsim="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "published-results: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$tedsim" ]] || { echo "published-results: no tedsim binary at $tedsim (build it or pass --tedsim)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "published-results: python3 is needed to read the rows" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$root" "$tedsim" "$tmp" "$out" "$check" <<'PY'
import json, os, subprocess, sys, datetime
root, tedsim, tmp, out, check = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
spec = json.load(open(os.path.join(root, "configs", "published", "results.json")))
rows = []
for i, r in enumerate(spec["rows"]):
    result = os.path.join(tmp, f"{i}.json")
    mb = r.get("micro_batch", 1)
    cmd = [tedsim, "simulate", "--model", "published/" + r["model"],
           "--topology", r["topology"], "--gpus", str(r["gpus"]), "--global-batch", str(r["global_batch"]),
           "--tp", str(r["tp"]), "--pp", str(r["pp"]), "--vpp", str(r.get("vpp", 1)), "--micro-batch", str(mb),
           "--zero", "0", "--recompute", r.get("recompute", "full"), "--json", result]
    run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        sys.exit(f"published-results: row {i} ({r['model']}) failed: {' '.join(cmd)}\n{run.stderr}")
    d = json.load(open(result))
    if r["unit"] != "tflops_per_gpu":
        sys.exit(f"published-results: row {i}: unknown unit {r['unit']}")
    predicted = d["tflops_per_gpu"]
    rows.append(dict(r, predicted=predicted, error=(predicted - r["value"]) / r["value"], fits=d["fits"],
                     command="tedsim " + " ".join(c if not c.startswith(root) else os.path.relpath(c, root) for c in cmd[1:-2])))
def mean_abs(rs): return 100 * sum(abs(x["error"]) for x in rs) / len(rs)
def max_abs(rs): return 100 * max(abs(x["error"]) for x in rs)
overall = mean_abs(rows)
if check:
    committed = None
    for line in open(out):
        if line.startswith("Overall mean absolute error:"):
            committed = float(line.split(":")[1].split("%")[0])
    if committed is None:
        sys.exit(f"published-results: {out} has no 'Overall mean absolute error:' line to check against")
    print(f"published-results: overall mean absolute error {overall:.1f}% (committed {committed:.1f}%, limit {committed + 2:.1f}%)")
    sys.exit(0 if overall <= committed + 2.0 else 1)
lines = ["# Published measurements, re-simulated", "",
         f"Made by `scripts/published-results.sh` on {datetime.date.today()}: every row of "
         "`configs/published/results.json` predicted by `tedsim simulate` on the analytic profile of the shipped topology "
         "of its machine (one topology per machine for all its rows, no per-row knobs), full activation recomputation as "
         "the sources trained, micro-batch 1, no ZeRO. TFLOP/s per GPU use the sources' own FLOP count "
         "(96 B s l h^2 (1 + s/6h + V/16lh), recomputation included), which is what `tedsim` reports as `tflops_per_gpu`. "
         "Error = (predicted - published) / published.", ""]
for key, text in spec["sources"].items():
    rs = [x for x in rows if x["source"] == key]
    if not rs:
        continue
    lines += [f"## {key}", "", text, "",
              "| model | machine | GPUs | batch | t | p | published | predicted | error | fits | command |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rs:
        lines.append(f"| {x['model']} | {x['topology']} | {x['gpus']} | {x['global_batch']} | {x['tp']} | {x['pp']} | "
                     f"{x['value']:g} | {x['predicted']:.1f} | {100 * x['error']:+.1f}% | {'yes' if x['fits'] else '**no**'} | "
                     f"`{x['command']}` |")
    lines += ["", f"Mean absolute error {mean_abs(rs):.1f}%, largest {max_abs(rs):.1f}% ({len(rs)} rows).", ""]
lines += ["## Overall", "", f"Overall mean absolute error: {overall:.1f}% over {len(rows)} rows; largest {max_abs(rows):.1f}%.", ""]
notes = os.path.join(root, "reports", "published-results-notes.md")
if os.path.exists(notes):
    lines += [open(notes).read().rstrip(), ""]
open(out + ".tmp", "w").write("\n".join(lines))
os.replace(out + ".tmp", out)
print("\n".join(lines))
PY
