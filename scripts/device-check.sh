#!/bin/bash
# One-GPU device check: build for the GPU (sm_90), run ctest (GPU tests register themselves when
# nvidia-smi sees a GPU), then a quick CUDA calibration on one rank. Logs and the profile go to
# OUTDIR. Budget: under 8 minutes on a 16-core machine with an H200.
#   scripts/device-check.sh OUTDIR
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
# and without network: yaml-cpp, Eigen, CLI11, nlohmann-json, GTest, Google Benchmark and OpenMPI
# must already be there (or be carried in and unpacked, with CMAKE_PREFIX_PATH, PATH and
# LD_LIBRARY_PATH pointing at them). Say plainly what is missing instead of failing in CMake.
missing=()
for header in yaml-cpp/yaml.h eigen3/Eigen/Core CLI/CLI.hpp nlohmann/json.hpp gtest/gtest.h mpi.h; do
  found=0
  for dir in /usr/include /usr/local/include /usr/lib/x86_64-linux-gnu/openmpi/include ${CPATH:+${CPATH//:/ }}; do
    [ -e "$dir/$header" ] && found=1 && break
  done
  [ "$found" = 1 ] || missing+=("$header")
done
command -v mpirun >/dev/null || missing+=("mpirun")
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing on this machine: ${missing[*]} (install scripts/install-deps.sh's packages, or carry them)"
  exit 1
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
  --model ted-1.3b --topology h200 --out "$OUT/profile-cuda-quick.json" > "$OUT/calibrate.log" 2>&1 || cal_rc=$?
tail -25 "$OUT/calibrate.log"
if [ -s "$OUT/profile-cuda-quick.json" ]; then
  "$BUILD/tedsim" profile show "$OUT/profile-cuda-quick.json" > "$OUT/profile-show.txt" 2>&1 || true
  head -14 "$OUT/profile-show.txt"
fi

section "summary"
echo "ctest rc=$ctest_rc calibrate rc=$cal_rc total $(( $(date +%s) - START )) s; logs in $OUT"
test "$ctest_rc" -eq 0 && test "$cal_rc" -eq 0
