#!/usr/bin/env bash
# OpenMPI's launch agent for the test cluster (scripts/test-cluster.sh sets it as plm_rsh_agent):
# called as `AGENT HOST COMMAND...` in place of ssh, it runs COMMAND (orted, given as ssh would
# pass it, words for a shell) inside the network namespace of HOST (198.18.0.(10+i) is node i),
# in a UTS namespace of its own whose hostname is node i, so every rank sees the host it is on.
set -euo pipefail
host=$1
shift
octet=${host##*.}
[[ "$host" == 198.18.0.* && "$octet" =~ ^[0-9]+$ && "$octet" -gt 10 ]] ||
  { echo "test-cluster-agent: $host is not a test-cluster node (198.18.0.11 and up)" >&2; exit 2; }
node=node$((octet - 10))
ip netns list | grep -q "^tedsim-$node\b" || { echo "test-cluster-agent: no namespace tedsim-$node (scripts/test-cluster.sh up)" >&2; exit 2; }
# The command is a shell line, as ssh would hand it to a remote shell (mpirun may prefix it with
# "PATH=... ; export PATH ; ..."), so it runs through sh, not exec.
exec ip netns exec "tedsim-$node" unshare --uts /bin/sh -c "hostname $node; $*"
