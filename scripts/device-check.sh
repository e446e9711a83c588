#!/bin/bash
# One-GPU device check: build for the GPU (sm_90), run ctest (GPU tests register themselves when
# nvidia-smi sees a GPU), a quick CUDA calibration on one rank, and a one-GPU validation of the
# gpu-moe model against the prediction from that profile. Logs, the profile and the validation JSON go to
# OUTDIR. Budget: under 8 minutes on a 16-core machine with an H200.
#   scripts/device-check.sh OUTDIR
# Before the session's first GPU call, run scripts/device-deps.sh here and carry .devdeps.
set -euo pipefail
OUT=${1:?usage: scripts/device-check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$ROOT/build-gpu"
JOBS=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
START=$(date +%s)
section() { echo; echo "=== [$(( $(date +%s) - START )) s] $* ==="; }

section "build dependencies"
# The lent GPU machines run an image with nvcc, CMake and NCCL but without Debian's -dev packages
# and without network. scripts/device-deps.sh (run beforehand, on the build machine) puts the
# packages in .devdeps/; they are unpacked into a prefix here and found through the environment.
# OpenMPI finds itself through OPAL_PREFIX. TEDSIM_FORCE_DEVDEPS=1 uses .devdeps even where the
# packages are installed (to check this path on the build machine).
have_deps() {
  local dirs="/usr/include /usr/local/include /usr/lib/x86_64-linux-gnu/openmpi/include ${DEPS_PREFIX:-/nonexistent}/usr/include"
  for header in yaml-cpp/yaml.h eigen3/Eigen/Core CLI/CLI.hpp nlohmann/json.hpp gtest/gtest.h benchmark/benchmark.h; do
    local found=0
    for dir in $dirs; do [ -e "$dir/$header" ] && found=1 && break; done
    [ "$found" = 1 ] || { echo "missing: $header"; return 1; }
  done
  command -v mpirun >/dev/null || { echo "missing: mpirun"; return 1; }
}
if [ -n "${TEDSIM_FORCE_DEVDEPS:-}" ] || ! have_deps; then
  if ! ls "$ROOT"/.devdeps/*.deb >/dev/null 2>&1; then
    echo "build dependencies missing and no .devdeps/: run scripts/device-deps.sh here and carry .devdeps"
    exit 1
  fi
  DEPS_PREFIX=${TEDSIM_DEPS_PREFIX:-/opt/tedsim-deps}
  mkdir -p "$DEPS_PREFIX"
  for deb in "$ROOT"/.devdeps/*.deb; do dpkg -x "$deb" "$DEPS_PREFIX"; done
  for tool in mpirun mpiexec mpicc mpicxx orterun ompi_info; do
    [ -e "$DEPS_PREFIX/usr/bin/$tool.openmpi" ] && ln -sf "$tool.openmpi" "$DEPS_PREFIX/usr/bin/$tool"
  done
  export OPAL_PREFIX="$DEPS_PREFIX/usr" PATH="$DEPS_PREFIX/usr/bin:$PATH" CMAKE_PREFIX_PATH="$DEPS_PREFIX/usr"
  export LD_LIBRARY_PATH="$DEPS_PREFIX/usr/lib/x86_64-linux-gnu:$DEPS_PREFIX/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  have_deps || { echo "still missing after unpacking .devdeps"; exit 1; }
  echo "unpacked $(ls "$ROOT"/.devdeps/*.deb | wc -l) packages into $DEPS_PREFIX"
fi

section "device"
nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.txt" || echo "nvidia-smi failed (no GPU?)"
nvcc --version | tail -2

section "configure (CUDA, sm_90)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTEDSIM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DTEDSIM_BENCHMARKS=OFF 2>&1 | tee "$OUT/configure.log" | grep -E "tedsim:|Error" || true

section "build (-j$JOBS)"
timeout 300 cmake --build "$BUILD" -j"$JOBS" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
tail -2 "$OUT/build.log"

section "ctest (GPU tests included when a GPU is found)"
ctest_rc=0
(cd "$BUILD" && timeout 180 ctest -j4 --output-on-failure --timeout 120) > "$OUT/ctest.log" 2>&1 || ctest_rc=$?
grep -E "tests passed|tests failed|\*\*\*Failed|Not Run" "$OUT/ctest.log" || true
grep -c "gpu" "$OUT/ctest.log" | sed 's/^/lines mentioning gpu tests: /' || true

section "quick CUDA calibration, 1 rank"
cal_rc=0
timeout 150 mpirun -np 1 --mca btl self,vader "$BUILD/tedsim" calibrate --backend cuda --quick \
  --model gpu-moe --topology h200 --out "$OUT/profile-cuda-quick.json" > "$OUT/calibrate.log" 2>&1 || cal_rc=$?
tail -25 "$OUT/calibrate.log"
if [ -s "$OUT/profile-cuda-quick.json" ]; then
  "$BUILD/tedsim" profile show "$OUT/profile-cuda-quick.json" > "$OUT/profile-show.txt" 2>&1 || true
  head -14 "$OUT/profile-show.txt"
fi

section "validate on one GPU: gpu-moe (~3.7B parameters, ~57 GiB), predicted from the quick profile"
val_rc=0
profile_arg=()
[ -s "$OUT/profile-cuda-quick.json" ] && profile_arg=(--profile "$OUT/profile-cuda-quick.json")
timeout 200 mpirun -np 1 --mca btl self,vader "$BUILD/tedsim" validate --backend cuda --model gpu-moe \
  --topology h200 --gpus 1 --tp 1 --ep 1 --micro-batch 1 --global-batch 8 --zero 1 --warmup 2 --iters 5 \
  "${profile_arg[@]}" --json "$OUT/validate-gpu-moe.json" > "$OUT/validate.log" 2>&1 || val_rc=$?
tail -30 "$OUT/validate.log"

section "validate on one GPU: cpu-qwen-moe (today's router, dropless, RMSNorm, RoPE, q/k norms), analytic h200"
# That the CUDA step runs this layer and its loss falls is the check; the analytic prediction of a
# model this small is no test of anything, so the verdict's tolerance is wide.
qwen_rc=0
timeout 90 mpirun -np 1 --mca btl self,vader "$BUILD/tedsim" validate --backend cuda --model cpu-qwen-moe \
  --topology h200 --gpus 1 --tp 1 --ep 1 --micro-batch 2 --global-batch 8 --zero 1 --warmup 2 --iters 5 \
  --tolerance 10 --json "$OUT/validate-cpu-qwen-moe.json" > "$OUT/validate-qwen.log" 2>&1 || qwen_rc=$?
tail -20 "$OUT/validate-qwen.log"

section "summary"
echo "ctest rc=$ctest_rc calibrate rc=$cal_rc validate rc=$val_rc validate-qwen rc=$qwen_rc total $(( $(date +%s) - START )) s; logs in $OUT"
test "$ctest_rc" -eq 0 && test "$cal_rc" -eq 0 && test "$val_rc" -eq 0 && test "$qwen_rc" -eq 0
