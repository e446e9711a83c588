#!/usr/bin/env bash
# Fuzzes every loader and the CLI's parsing with libFuzzer (clang), under ASan and UBSan.
#
# usage: scripts/fuzz.sh [SECONDS] [--runs N] [--build DIR] [--report FILE]
#   SECONDS   time per target (default 60); --runs N stops each target after N executions instead
#   --merge-corpus  minimize this run's corpus into tests/fuzz/corpus/ afterwards
#   --targets A,B   run only these targets
#   --report  write the run's table (executions, coverage, crashes) as markdown to FILE
# Seeds: models/ (YAML and Hugging Face configs), topologies/, configs/, tests/bad_inputs/, the
# profiles under tests/ and reports/, a few layout strings and command lines, and the minimized
# corpus committed under tests/fuzz/corpus/TARGET (--merge-corpus refreshes it from this run's).
# Crashes are written to BUILD/fuzz/TARGET/crashes/ and the script exits 1 when there is one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=60
runs=""
build="$root/build-fuzz"
report=""
merge=0
only=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --report) report="$2"; shift 2 ;;
    --merge-corpus) merge=1; shift ;;
    --targets) IFS=, read -r -a only <<< "$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    [0-9]*) seconds="$1"; shift ;;
    *) echo "fuzz.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
command -v clang++ >/dev/null || { echo "fuzz.sh: needs clang++ (Debian: clang)" >&2; exit 2; }
targets=(fuzz_model_yaml fuzz_topology_yaml fuzz_hf_config fuzz_profile_json fuzz_pipeline_layout fuzz_cli fuzz_validation_config)
all_targets=("${targets[@]}")
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DTEDSIM_FUZZ=ON -DTEDSIM_CUDA=OFF -DTEDSIM_TESTS=OFF \
    -DTEDSIM_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build.configure.log" 2>&1 ||
  { tail -20 "$build.configure.log" >&2; exit 1; }
cmake --build "$build" -j2 --target "${targets[@]}" > "$build.build.log" 2>&1 || { tail -30 "$build.build.log" >&2; exit 1; }
[[ ${#only[@]} -gt 0 ]] && targets=("${only[@]}")

seed() {  # seed TARGET FILES...: copy files into the target's seed corpus
  local dir="$build/fuzz/$1/seeds"; shift
  mkdir -p "$dir"
  for f in "$@"; do [[ -f "$f" ]] && cp "$f" "$dir/$(echo "$f" | tr '/' '_')"; done
}
seed fuzz_model_yaml "$root"/models/*.yaml "$root"/tests/bad_inputs/*.yaml
seed fuzz_topology_yaml "$root"/topologies/*.yaml "$root"/tests/bad_inputs/topology_*.yaml
seed fuzz_hf_config "$root"/models/hf/*/config.json "$root"/tests/bad_inputs/hf/*.json
seed fuzz_validation_config "$root"/configs/*/*.yaml
seed fuzz_profile_json $(find "$root/tests" "$root/reports" -name '*.json' -size -2M 2>/dev/null | head -20)
mkdir -p "$build/fuzz/fuzz_pipeline_layout/seeds" "$build/fuzz/fuzz_cli/seeds"
i=0
for layout in 'Et|(tt|)*30tL' 'Ettt|tttL' 'E|t*4|t*4|L' '(t|)*8' 'Et*3|t*4|(t*2|)*2tL'; do
  printf '\x1f\x03\x01%s' "$layout" > "$build/fuzz/fuzz_pipeline_layout/seeds/layout$((i++))"
done
# 4 layers on 2 stages with one multi-token-prediction module before the loss.
printf '\x03\x01\x04%s' 'Ett|ttmL' > "$build/fuzz/fuzz_pipeline_layout/seeds/layout_mtp"
i=0
while IFS= read -r line; do
  args="${line##*| }"
  printf '%s' "$args" | tr ' ' '\n' > "$build/fuzz/fuzz_cli/seeds/case$((i++))"
done < <(grep -v '^#' "$root/tests/bad_inputs/cases.txt" | grep -E '\| *(simulate|search|model) ' | sed 's/@DIR@/tests\/bad_inputs/g; s/@BAR@/|/g')
printf 'simulate\n--pp\n4\n--vpp\n2\n--tp\n2\n--ep\n8\n--model\nmixtral-8x7b' > "$build/fuzz/fuzz_cli/seeds/pipeline"
printf 'search\n--model\nhf/deepseek-v3\n--topology\nh200\n--gpus\n1024\n--threads\n1' > "$build/fuzz/fuzz_cli/seeds/hf"
printf 'scale\n--gpus\n32,64,128\n--global-batch\n256\n--html\nscale.html' > "$build/fuzz/fuzz_cli/seeds/scale"
printf 'report\na.json\nb.json\n--html\nboth.html' > "$build/fuzz/fuzz_cli/seeds/report"

status=0
rows=()
for t in "${targets[@]}"; do
  dir="$build/fuzz/$t"
  # Crashes of an earlier run are kept aside, so only this run's findings count.
  if [[ -d "$dir/crashes" ]] && [[ -n "$(ls -A "$dir/crashes")" ]]; then
    mkdir -p "$dir/crashes-earlier" && mv "$dir/crashes"/* "$dir/crashes-earlier/"
  fi
  mkdir -p "$dir/corpus" "$dir/crashes"
  limit=(-max_total_time="$seconds")
  [[ -n "$runs" ]] && limit=(-runs="$runs")
  echo "== $t" >&2
  start=$(date +%s)
  set +e
  committed="$root/tests/fuzz/corpus/$t"
  mkdir -p "$committed"
  (cd "$root" && TEDSIM_DATA_DIR="$root" "$build/tests/fuzz/$t" "$dir/corpus" "$committed" "$dir/seeds" "${limit[@]}" -rss_limit_mb=2048 \
      -timeout=10 -max_len=16384 -artifact_prefix="$dir/crashes/" -print_final_stats=1) > "$dir/log.txt" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$dir/log.txt" | grep -oE '[0-9]+$' || echo 0)
  cov=$(grep -oE 'cov: [0-9]+' "$dir/log.txt" | tail -1 | grep -oE '[0-9]+' || echo 0)
  ft=$(grep -oE 'ft: [0-9]+' "$dir/log.txt" | tail -1 | grep -oE '[0-9]+' || echo 0)
  crashes=$(find "$dir/crashes" -type f | wc -l)
  [[ $rc -ne 0 || $crashes -gt 0 ]] && { status=1; echo "fuzz.sh: $t found a problem:" >&2; grep -E 'ERROR|SUMMARY|terminate' "$dir/log.txt" | head -5 >&2; }
  corpus=$(find "$dir/corpus" -type f | wc -l)
  rows+=("| $t | $execs | $elapsed | $cov | $ft | $corpus | $crashes |")
  echo "$t: $execs executions in ${elapsed}s, coverage $cov edges, $ft features, corpus $corpus, crashes $crashes" >&2
done
if [[ $merge -eq 1 ]]; then  # keep the inputs that add coverage, for the next runs and CI
  for t in "${targets[@]}"; do
    fresh="$build/fuzz/$t/merged"
    rm -rf "$fresh" && mkdir -p "$fresh"
    (cd "$root" && TEDSIM_DATA_DIR="$root" "$build/tests/fuzz/$t" -merge=1 "$fresh" "$root/tests/fuzz/corpus/$t" \
        "$build/fuzz/$t/corpus" -max_len=16384) > "$build/fuzz/$t/merge.txt" 2>&1
    rm -rf "$root/tests/fuzz/corpus/$t" && mv "$fresh" "$root/tests/fuzz/corpus/$t"
  done
fi
if [[ -n "$report" ]]; then
  {
    echo "| target | executions | seconds | edges covered | features | corpus | crashes |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } > "$report"
fi
exit $status
