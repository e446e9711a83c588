#!/bin/bash
# Across two hosts, for real: brings up the namespace test cluster (2 nodes x 1 rank, links shaped
# to 1 Gbit/s), calibrates on it under mpirun, checks the profile labels its groups as spanning 2
# nodes (from the hostnames, as on a cluster), completes the profile with the job's own points
# (validate --calibrate) and validates a TED configuration whose expert
# all-to-all and gradient sync cross the nodes, checks the prediction within 25%, and tears the
# cluster down, leaving no namespace, veth or bridge behind, also when a step fails.
#   cluster_validate.sh TEDSIM MPIRUN DIR
# Exit 77 (skipped) where network namespaces cannot be made (not root, no iproute2).
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER="$ROOT/scripts/test-cluster.sh"
export TEDSIM_CLUSTER_DIR="$DIR/cluster"
mkdir -p "$DIR"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! ip netns add tedsim-probe 2>/dev/null; then
  echo "skipped: network namespaces need root and iproute2"; exit 77
fi
ip netns del tedsim-probe
leftovers() {
  { ip netns list | grep -E '^tedsim-'; ip -o link show | grep -E ': tedsim-(br0|v[0-9]+)[:@]'; } 2>/dev/null
}
teardown() {
  "$CLUSTER" down > /dev/null
  if [ -n "$(leftovers)" ]; then echo "FAIL: the cluster left behind:"; leftovers; exit 1; fi
}
trap teardown EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$CLUSTER" up 2 1 --rate 1gbit || fail "cluster did not come up"
# shellcheck disable=SC1091
source "$TEDSIM_CLUSTER_DIR/env"
launch=("$MPIRUN" --hostfile "$TEDSIM_CLUSTER_DIR/hostfile" -np 2)
hosts=$(timeout 60 "${launch[@]}" hostname | sort | tr '\n' ' ')
[ "$hosts" = "node1 node2 " ] || fail "ranks did not land on node1 and node2: '$hosts'"

PROFILE="$DIR/cluster-profile.json"
rm -f "$PROFILE" "$PROFILE.partial"
timeout 240 "${launch[@]}" "$TEDSIM" calibrate --backend cpu --quick --max-bytes 16777216 --model cpu-moe --topology test-cluster \
  --out "$PROFILE" > "$DIR/cluster-calibrate.log" 2>&1 || { tail -20 "$DIR/cluster-calibrate.log"; fail "calibrate failed"; }
python3 - "$PROFILE" <<'PY' || fail "the profile does not label its groups as spanning 2 nodes"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["provenance"]["hosts"] == ["node1", "node2"], p["provenance"]["hosts"]
spans = {(c["op"], c["ranks"], c["nodes"]) for c in p["collectives"]}
assert ("all_to_all", 2, 2) in spans and ("all_reduce", 2, 2) in spans, spans
print("profile: hosts", p["provenance"]["hosts"], "collective groups", sorted(spans))
PY

# cpu-moe, not tiny-moe: tiny-moe's 20 ms step and its microsecond GEMMs vary by +-30% from run to
# run on this shared 2-core VM (seen: +34% once), cpu-moe's by far less. Collectives are calibrated
# up to 16 MiB so its gradient buckets are measured, and --calibrate adds whatever the job asks
# that the quick sweep lacks.
timeout 240 "${launch[@]}" "$TEDSIM" validate --model cpu-moe --topology test-cluster --tp 1 --ep 2 --global-batch 8 \
  --warmup 2 --iters 5 --profile "$PROFILE" --calibrate --json "$DIR/cluster-validate.json" > "$DIR/cluster-validate.log" 2>&1 ||
  { tail -30 "$DIR/cluster-validate.log"; fail "validate failed"; }
sed -n '/^phase/,/^iteration /p' "$DIR/cluster-validate.log"
python3 - "$DIR/cluster-validate.json" <<'PY' || fail "prediction outside 25%"
import json, sys
v = json.load(open(sys.argv[1]))
err = v["error"]["iteration"]
a2a = v["measured"]["breakdown_s"]["ep_alltoall"]
print("iteration error %+.1f%%, measured ep_alltoall %.3f ms" % (100 * err, 1e3 * a2a))
assert a2a > 0, "no all-to-all measured"
assert abs(err) <= 0.25, err
PY
echo "cluster_validate: OK"
