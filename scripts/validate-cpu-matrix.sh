#!/usr/bin/env bash
# The CPU validation matrix: calibrates this machine with each rank count the configurations use
# (`tedsim calibrate --backend cpu`, same model, same rank count), validates every configuration
# with its own rank count under mpirun against the profile of that rank count, and writes
# reports/validation-cpu.md (config, predicted, measured and error per phase, memory).
#
# usage: scripts/validate-cpu-matrix.sh [--configs DIR] [--profile FILE] [--quick-calibration]
#                                       [--drift-limit F] [--tedsim PATH] [--iters N] [--warmup N] [--out FILE]
#   --configs DIR   validation configs (default configs/validation-cpu)
#   --profile FILE  use this profile for every configuration instead of calibrating
#   --quick-calibration   calibrate with --quick (seconds instead of about a minute per rank count)
#   --drift-limit F       when validate finds the machine's speed (the profile's sentinel GEMM) moved
#                         by more than F since calibration, calibrate that group again and validate
#                         the configuration once more, at most twice per group (default 0.10; 0: never)
# Run it on an otherwise idle machine: the measurement is of this machine, not of a shared one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
configs="$root/configs/validation-cpu"
profile=""
quick=()
tedsim="${TEDSIM:-$root/build/tedsim}"
iters=10
warmup=3
out="$root/reports/validation-cpu.md"
drift_limit=0.10
while [[ $# -gt 0 ]]; do
  case "$1" in
    --configs) configs="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --quick-calibration) quick=(--quick); shift ;;
    --tedsim) tedsim="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --drift-limit) drift_limit="$2"; shift 2 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "validate-cpu-matrix: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$tedsim" ]] || { echo "validate-cpu-matrix: no tedsim binary at $tedsim (build it or pass --tedsim)" >&2; exit 2; }
[[ -d "$configs" ]] || { echo "validate-cpu-matrix: no config directory $configs" >&2; exit 2; }
if [[ -n "$profile" && ! -f "$profile" ]]; then echo "validate-cpu-matrix: no profile file $profile" >&2; exit 2; fi
command -v python3 >/dev/null || { echo "validate-cpu-matrix: python3 is needed to tabulate the JSON" >&2; exit 2; }
python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if v >= 0 else 1)' "$drift_limit" 2>/dev/null ||
  { echo "validate-cpu-matrix: --drift-limit expects a fraction >= 0, got '$drift_limit'" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun=(mpirun --oversubscribe --mca btl self,vader)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
key() { awk -v k="$1:" '$1 == k {print $2}' "$2"; }

# One calibration per (model, topology, rank count), reused by every config that shares it, each
# run right before those configs are validated: the profile describes the machine as it is in the
# minutes of their runs, not as it was before every other group ran (a shared host's speed drifts).
calibration_log="$tmp/calibrations.txt"
: > "$calibration_log"
declare -A group_configs
groups=()
for cfg in "$configs"/*.yaml; do
  id="$(key model "$cfg")-$(key topology "$cfg")-np$(key gpus "$cfg")"
  [[ -n "${group_configs[$id]:-}" ]] || groups+=("$id")
  group_configs[$id]+="$cfg "
done
# A shared host's speed drifts over minutes: a profile measured while it ran 20% slower predicts
# every row of its group 20% high. validate times the profile's sentinel GEMM again around the step
# (machine_speed); past --drift-limit the profile no longer describes the machine, so the group is
# calibrated again and the row validated once more (the report lists each such calibration).
calibrate_group() {  # id np model topo profile why
  echo "== calibrate $1${6:+ ($6)}" >&2
  local start ms
  start=$(date +%s%N)
  "${mpirun[@]}" -np "$2" "$tedsim" calibrate --backend cpu "${quick[@]}" --model "$3" --topology "$4" \
      --gpus "$2" --out "$5" > "$tmp/calibrate-$1.log" 2>&1 || { tail -5 "$tmp/calibrate-$1.log" >&2; exit 1; }
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s|mpirun -np %s tedsim calibrate --backend cpu %s--model %s --topology %s --gpus %s --out profile.json|%d.%03d|%s\n' \
      "$1" "$2" "${quick[*]:+${quick[*]} }" "$3" "$4" "$2" $((ms / 1000)) $((ms % 1000)) "${6:-before the group}" >> "$calibration_log"
}
drift_of() {  # validate's JSON -> the machine's speed change since calibration (fraction), or 0
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1])).get("machine_speed"); print(s["change"] if s else 0)' "$1"
}
status=0
mkdir -p "$tmp/results"
for id in "${groups[@]}"; do
  read -r -a members <<< "${group_configs[$id]}"
  first="${members[0]}"
  np="$(key gpus "$first")"; model="$(key model "$first")"; topo="$(key topology "$first")"
  use="$profile"
  recalibrations=0
  if [[ -z "$profile" ]]; then
    use="$tmp/profile-$id.json"
    calibrate_group "$id" "$np" "$model" "$topo" "$use" ""
  fi
  for cfg in "${members[@]}"; do
    name="$(basename "$cfg" .yaml)"
    while true; do
      echo "== validate $name ($np ranks)" >&2
      if ! "${mpirun[@]}" -np "$np" "$tedsim" validate --config "$cfg" --iters "$iters" --warmup "$warmup" \
           --profile "$use" --json "$tmp/results/$name.json" > "$tmp/$name.log" 2>&1; then
        echo "validate-cpu-matrix: $name failed:" >&2
        tail -5 "$tmp/$name.log" >&2
        status=1
        break
      fi
      [[ -z "$profile" && $recalibrations -lt 2 ]] || break
      drift="$(drift_of "$tmp/results/$name.json")"
      python3 -c 'import sys; sys.exit(0 if abs(float(sys.argv[1])) > float(sys.argv[2]) > 0 else 1)' "$drift" "$drift_limit" || break
      recalibrations=$((recalibrations + 1))
      why="$(python3 -c 'import sys; print(f"again at {sys.argv[2]}: the machine ran {100 * float(sys.argv[1]):+.0f}% against the profile")' "$drift" "$name")"
      calibrate_group "$id" "$np" "$model" "$topo" "$use" "$why"
    done
  done
done
mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$profile" "$iters" "$warmup" "$configs" "$root" "${#quick[@]}" "$drift_limit" <<'PY'
import glob, json, os, sys, datetime, platform
tmp, out, profile, iters, warmup, configs, root, quick, drift_limit = sys.argv[1:10]
quick = quick != "0"
phases = ["compute", "tp_allreduce", "tp_allgather", "ep_alltoall", "dp_grad_sync", "optimizer", "other", "pp_bubble", "pp_p2p"]
tolerance = 0.15
def ms(x): return f"{1e3 * x:.2f}"
def err(p, m):
    if m < 1e-7 and p < 1e-7: return "-"
    return "n/a" if m <= 0 else f"{100 * (p - m) / m:+.0f}%"
rel = os.path.relpath(configs, root)
lines = ["# CPU validation: predicted vs measured" + (", quick-calibrated profiles" if quick else ""), "",
         f"Made by `scripts/validate-cpu-matrix.sh --configs {rel}" + (f" --profile {profile}" if profile else "") +
         (" --quick-calibration" if quick else "") + (f" --drift-limit {drift_limit}" if float(drift_limit) != 0.10 else "") +
         f" --iters {iters} --warmup {warmup}` on {platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), "
         f"{datetime.date.today()}; {warmup} warm-up + {iters} measured iterations per configuration.", ""]
calibrations = [l.split("|") for l in open(os.path.join(tmp, "calibrations.txt")).read().splitlines() if l]
if calibrations:
    lines += ["Profiles: one calibration per model and rank count, on this machine, each right before the validations that use it; "
              "calibrated again (at most twice per group) where validate found the machine's speed moved by more than "
              f"{100 * float(drift_limit):g}% since (the profile's sentinel GEMM, `--drift-limit`), that configuration then validated once more:", "",
              "| profile | command | seconds | when |", "|---|---|---|---|"]
    lines += [f"| {i} | `{c}` | {t} | {w} |" for i, c, t, w in calibrations]
    lines.append("")
lines += ["Times in ms: predicted / measured (error = (predicted - measured) / measured). Measured iteration = "
          "median over iterations of the slowest rank; phases = mean over ranks, median over iterations. Machine vs "
          "profile: the profile's sentinel GEMM timed again right before the step, against its time at calibration "
          "(+: this machine ran slower than when the profile was measured).", ""]
head = ("| config | ranks | iteration | within 15% | phases over 5%, beyond 15% | " + " | ".join(phases) +
        " | memory MiB | machine vs profile |")
lines += [head, "|" + "---|" * (len(phases) + 7)]
phase_misses = 0
largest = []
worst = 0.0
for path in sorted(glob.glob(os.path.join(tmp, "results", "*.json"))):
    d = json.load(open(path))
    name = os.path.basename(path)[:-5]
    p, m = d["predicted"], d["measured"]
    pi, mi = p["iteration_time_s"], m["iteration_time_s"]
    e = abs(pi - mi) / mi
    worst = max(worst, e)
    # The phases that matter (above 5% of the measured iteration, predicted or measured) and miss.
    misses = [ph for ph in phases
              if max(p["breakdown_s"][ph], m["breakdown_s"][ph]) > 0.05 * mi and
              (m["breakdown_s"][ph] <= 0 or abs(p["breakdown_s"][ph] - m["breakdown_s"][ph]) > tolerance * m["breakdown_s"][ph])]
    phase_misses += len(misses)
    cells = [name, str(d["ranks"]), f"{ms(pi)} / {ms(mi)} ({err(pi, mi)})", "yes" if e <= tolerance else "**no**",
             ", ".join(f"**{ph}**" for ph in misses) or "none"]
    diffs = []
    for ph in phases:
        a, b = p["breakdown_s"][ph], m["breakdown_s"][ph]
        cells.append(f"{ms(a)} / {ms(b)} ({err(a, b)})")
        diffs.append((abs(a - b), ph, a, b))
    cells.append(f"{p['memory_peak_bytes'] / 2**20:.1f} / {m['memory_peak_bytes'] / 2**20:.1f}")
    # The profile's sentinel GEMM timed again right before the step (validate's machine_speed):
    # how much slower (+) or faster this machine ran than in the minutes the profile was measured.
    speed = d.get("machine_speed")
    cells.append(f"{100 * speed['change']:+.0f}%" if speed else "-")
    lines.append("| " + " | ".join(cells) + " |")
    diff, ph, a, b = max(diffs)
    largest.append(f"- {name}: {ph}, {ms(a)} predicted vs {ms(b)} measured ms ({err(a, b)}; "
                   f"{100 * diff / mi:.1f}% of the iteration)")
imbalance = []
for path in sorted(glob.glob(os.path.join(tmp, "results", "*.json"))):
    d = json.load(open(path))
    if "imbalance" in d:
        i = d["imbalance"]
        rank = (f"{i['rank_load_assumed']:.2f} | {i['rank_load_measured_median']:.2f} / {i.get('rank_load_measured_mean', 0):.2f}"
                if d["config"]["ep"] > 1 else "- | -")
        source = {"calibration": "calibration", "model": "model"}.get(i.get("assumed_from", "model"), "model")
        imbalance.append(f"| {os.path.basename(path)[:-5]} | {i['assumed']:.2f} ({source}) | {i['measured_median']:.2f} ({i['samples']} passes) | {rank} | "
                         f"{ms(d['predicted']['iteration_time_s'])} ({err(d['predicted']['iteration_time_s'], d['measured']['iteration_time_s'])}) | "
                         f"{ms(i['iteration_time_s_with_measured'])} ({err(i['iteration_time_s_with_measured'], d['measured']['iteration_time_s'])}) |")
if imbalance:
    lines += ["", "Dropless configurations: the load imbalance (busiest expert's tokens over the mean) the prediction "
              "assumed and the one the step measured (median over MoE layer passes on rank 0's expert group); the "
              "busiest expert rank's rows over the mean rank's, as the prediction took it and as measured (median / "
              "mean over the passes; with one expert rank there is none); and the iteration predicted with each "
              "load (the measured median fed back as the imbalance that gives it; error against the measured "
              "iteration). Assumed from calibration: the mean over the profile's passes of the step's own router on "
              "the step's own tokens (calibrate's routing count, the profile's expert_shares); from the model: its "
              "imbalance, else tedsim's default 1.2.", "",
              "| config | imbalance assumed | imbalance measured | rank load assumed | rank load measured (median / mean) | "
              "predicted ms, assumed | predicted ms, measured |", "|---|---|---|---|---|---|---|"] + imbalance
lines += ["", f"Largest iteration error: {100 * worst:.1f}%. Phases above 5% of the iteration that miss by more than 15%: "
          f"{phase_misses}.", "",
          "## Largest phase error of each configuration (in ms, as a share of the measured iteration)", ""] + largest
notes = os.path.join(root, "reports", "validation-cpu-notes.md")
if os.path.exists(notes) and not quick:  # the notes discuss the full calibration's run
    lines += ["", open(notes).read().rstrip()]
open(out, "w").write("\n".join(lines) + "\n")
print(f"wrote {out}")
PY
exit $status
