#!/usr/bin/env bash
# Validates every CPU configuration of configs/validation-cpu/ with its own rank count under mpirun
# and writes reports/validation-cpu.md (config, predicted, measured and error per phase).
#
# usage: scripts/validate-cpu-matrix.sh [PROFILE] [--tedsim PATH] [--iters N] [--warmup N] [--out FILE]
#   PROFILE   profile file from `tedsim calibrate --backend cpu` (default: none, i.e. the analytic
#             profile of each config's topology)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile=""
tedsim="${TEDSIM:-$root/build-cpu/tedsim}"
iters=10
warmup=3
out="$root/reports/validation-cpu.md"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tedsim) tedsim="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    -*) echo "validate-cpu-matrix: unknown option $1" >&2; exit 2 ;;
    *) profile="$1"; shift ;;
  esac
done
[[ -x "$tedsim" ]] || { echo "validate-cpu-matrix: no tedsim binary at $tedsim (build it or pass --tedsim)" >&2; exit 2; }
if [[ -n "$profile" && ! -f "$profile" ]]; then echo "validate-cpu-matrix: no profile file $profile" >&2; exit 2; fi
command -v python3 >/dev/null || { echo "validate-cpu-matrix: python3 is needed to tabulate the JSON" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
profile_args=()
[[ -n "$profile" ]] && profile_args=(--profile "$profile")
status=0
for cfg in "$root"/configs/validation-cpu/*.yaml; do
  name="$(basename "$cfg" .yaml)"
  np="$(awk '/^gpus:/ {print $2}' "$cfg")"
  echo "== $name ($np ranks)" >&2
  if ! mpirun -np "$np" --oversubscribe --mca btl self,vader "$tedsim" validate --config "$cfg" \
       --iters "$iters" --warmup "$warmup" --json "$tmp/$name.json" "${profile_args[@]}" > "$tmp/$name.log" 2>&1; then
    echo "validate-cpu-matrix: $name failed:" >&2
    tail -5 "$tmp/$name.log" >&2
    status=1
  fi
done
mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$profile" "$iters" "$warmup" "$0 $*" <<'PY'
import glob, json, os, sys, datetime, platform
tmp, out, profile, iters, warmup, cmd = sys.argv[1:7]
phases = ["compute", "tp_allreduce", "tp_allgather", "ep_alltoall", "dp_grad_sync", "optimizer", "other"]
def ms(x): return f"{1e3 * x:.2f}"
def err(p, m):
    if m < 1e-7 and p < 1e-7: return "-"
    return "n/a" if m <= 0 else f"{100 * (p - m) / m:+.0f}%"
lines = ["# CPU validation: predicted vs measured", "",
         f"Made by `scripts/validate-cpu-matrix.sh {profile}` on {platform.node()} "
         f"({datetime.date.today()}), {warmup} warm-up + {iters} measured iterations per config; "
         f"profile: {profile or 'analytic (topology)'}.",
         "Times in ms: predicted / measured (error = (predicted - measured) / measured). "
         "Measured iteration = median of the slowest rank; phases = mean over ranks, median over iterations.", ""]
head = "| config | ranks | iteration | " + " | ".join(phases) + " | memory MiB |"
lines += [head, "|" + "---|" * (len(phases) + 4)]
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    d = json.load(open(path))
    p, m = d["predicted"], d["measured"]
    cells = [os.path.basename(path)[:-5], str(d["ranks"]),
             f"{ms(p['iteration_time_s'])} / {ms(m['iteration_time_s'])} ({err(p['iteration_time_s'], m['iteration_time_s'])})"]
    for ph in phases:
        a, b = p["breakdown_s"][ph], m["breakdown_s"][ph]
        cells.append(f"{ms(a)} / {ms(b)} ({err(a, b)})")
    cells.append(f"{p['memory_peak_bytes'] / 2**20:.1f} / {m['memory_peak_bytes'] / 2**20:.1f}")
    lines.append("| " + " | ".join(cells) + " |")
open(out, "w").write("\n".join(lines) + "\n")
print(f"wrote {out}")
PY
exit $status
