#!/usr/bin/env bash
# A small real cluster on this machine, to rehearse a multi-node plan: N "nodes", each a network
# namespace with its own hostname (a UTS namespace per launched process), joined by veth pairs to a
# bridge, every node's link shaped with tbf at --rate both ways. OpenMPI reaches the nodes through
# scripts/test-cluster-agent.sh (its plm_rsh_agent), which starts orted inside the namespace of the
# host it is asked for, so ranks on one node share memory and ranks on two talk TCP over the
# shaped links, as on a cluster.
#
# usage: scripts/test-cluster.sh up N RANKS_PER_NODE [--rate 1gbit]
#        scripts/test-cluster.sh down
#        scripts/test-cluster.sh status
# Root only. Addresses: 198.18.0.0/24 (RFC 2544's benchmarking range), the bridge at .1 and node i
# at .(10+i); nothing is routed off the bridge. `up` writes $TEDSIM_CLUSTER_DIR (default
# /run/tedsim-cluster): `hostfile` for mpirun and `env`, the MCA settings, to source:
#   source /run/tedsim-cluster/env
#   mpirun --hostfile /run/tedsim-cluster/hostfile -np 4 ./build/tedsim calibrate ...
# `down` removes every namespace, veth and the bridge it made (also half-made ones), and is safe
# to run twice.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${TEDSIM_CLUSTER_DIR:-/run/tedsim-cluster}"
bridge=tedsim-br0
prefix=198.18.0

down() {
  for ns in $(ip netns list 2>/dev/null | awk '/^tedsim-node[0-9]+/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true  # takes its end of the veth pair, and so the pair
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^tedsim-v[0-9]+$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge"
  rm -rf "$dir"
}

up() {
  local n=$1 per_node=$2 rate=$3
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 32 ]] || { echo "test-cluster: N: expected 1..32 nodes, got '$n'" >&2; exit 2; }
  [[ "$per_node" =~ ^[0-9]+$ && "$per_node" -ge 1 ]] || { echo "test-cluster: RANKS_PER_NODE: expected a count >= 1, got '$per_node'" >&2; exit 2; }
  [[ "$rate" =~ ^[0-9]+(k|m|g)?bit$ ]] || { echo "test-cluster: --rate: expected e.g. 1gbit or 100mbit, got '$rate'" >&2; exit 2; }
  [ "$(id -u)" -eq 0 ] || { echo "test-cluster: needs root (network namespaces)" >&2; exit 2; }
  down
  trap 'echo "test-cluster: up failed; removing what it made" >&2; down' ERR
  ip link add "$bridge" type bridge
  ip addr add "$prefix.1/24" dev "$bridge"
  ip link set "$bridge" up
  mkdir -p "$dir"
  : > "$dir/hostfile"
  for i in $(seq 1 "$n"); do
    local ns=tedsim-node$i veth=tedsim-v$i
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$bridge" up
    ip -n "$ns" addr add "$prefix.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # Both directions of the node's link: into the node (the bridge side) and out of it.
    tc qdisc add dev "$veth" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    echo "$prefix.$((10 + i)) slots=$per_node" >> "$dir/hostfile"
  done
  cat > "$dir/env" <<ENV
# MCA settings for mpirun on the tedsim test cluster (scripts/test-cluster.sh).
export OMPI_MCA_plm_rsh_agent=$root/scripts/test-cluster-agent.sh
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=$prefix.0/24
export OMPI_MCA_btl_tcp_if_include=$prefix.0/24
export OMPI_MCA_btl=self,vader,tcp
# Each node's orted thinks it has the whole machine and would bind its first rank to core 0, so
# two nodes' ranks would share one core (seen: every small message then took one 4 ms tick).
export OMPI_MCA_hwloc_base_binding_policy=none
ENV
  echo "$n $per_node $rate" > "$dir/shape"
  trap - ERR
  echo "test-cluster: $n nodes x $per_node ranks, links shaped to $rate; hosts in $dir/hostfile"
  echo "  source $dir/env && mpirun --hostfile $dir/hostfile -np $((n * per_node)) ..."
}

cmd="${1:-}"
case "$cmd" in
  up)
    shift
    [ $# -ge 2 ] || { sed -n 9,12p "$0" >&2; exit 2; }
    n=$1 per_node=$2 rate=1gbit
    shift 2
    while [ $# -gt 0 ]; do
      case "$1" in
        --rate) rate="${2:-}"; shift 2 ;;
        *) echo "test-cluster: unknown argument $1" >&2; exit 2 ;;
      esac
    done
    up "$n" "$per_node" "$rate" ;;
  down) down; echo "test-cluster: down" ;;
  status)
    ip netns list | grep '^tedsim-node' || echo "no test-cluster nodes"
    [ -f "$dir/shape" ] && echo "shape (nodes, ranks per node, rate): $(cat "$dir/shape")" || true ;;
  *) sed -n 9,12p "$0" >&2; exit 2 ;;
esac
