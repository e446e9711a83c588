#!/usr/bin/env bash
# Run here, before a GPU session: downloads the Debian packages tedsim builds against (and the
# shared libraries OpenMPI needs) into .devdeps/, which git ignores. The lent GPU machines have
# nvcc, CMake and NCCL but no network and no Debian -dev packages; scripts/device-check.sh unpacks
# .devdeps/ there into a prefix (dpkg -x, never into /). Carry it: run(carry=[".devdeps"], ...).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.devdeps"
packages=(libyaml-cpp-dev libyaml-cpp0.7 libeigen3-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
          libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
          libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libpmix2 libmunge2
          libpsm2-2 libpsm-infinipath1 librdmacm1 libibverbs1 libnl-3-200 libnl-route-3-200 libnuma1
          libxnvctrl0 libpciaccess0 libltdl7)
mkdir -p "$dir"
cd "$dir"
apt-get download "${packages[@]}"
echo "device-deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
