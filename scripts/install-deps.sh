#!/usr/bin/env bash
# Installs the Debian 12 packages tedsim builds against. The CUDA 13 toolkit (nvcc, cuBLAS, NCCL)
# is expected in its standard prefix already; it is optional: without it the CPU build is made.
set -euo pipefail
packages=(cmake g++ make pkg-config
          libyaml-cpp-dev libeigen3-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin
          clang     # scripts/fuzz.sh: libFuzzer with ASan and UBSan
          procps    # pgrep: the SIGKILL-resume test finds the rank to kill
          iproute2  # ip netns and tc: the namespace test cluster (scripts/test-cluster.sh)
          slurmctld slurmd slurm-client  # a single-host Slurm the srun test starts and stops
          libjs-vega  # Vega, inlined into the HTML reports (--html)
          chromium-headless-shell  # the report tests load every kind of report in a real browser
          python3)  # the validation script and one calibration test read JSON with it
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
