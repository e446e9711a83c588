#!/bin/bash
# calibrate and validate started by Slurm's srun, under a real single-host Slurm that this test
# starts (slurmctld and slurmd with a private configuration, ports and state directory) and stops:
# srun --mpi=pmix -n 2 calibrates, validates, and ends a hung rank through the watchdog within its
# deadline + 10 s (a hung rank exits nothing, so no launcher ends the step by itself).
#   slurm_srun.sh TEDSIM DIR
# Exit 77 (skipped) without Slurm's daemons (Debian: slurmctld slurmd slurm-client) or as non-root.
set -uo pipefail
TEDSIM=$1 DIR=$2
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null ||
  { echo "skipped: needs slurmctld, slurmd and srun (Debian: slurmctld slurmd slurm-client)"; exit 77; }
[ "$(id -u)" -eq 0 ] || { echo "skipped: the test's slurmd runs as root"; exit 77; }
ls /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix*.so >/dev/null 2>&1 || ls /usr/lib*/slurm*/mpi_pmix*.so >/dev/null 2>&1 ||
  { echo "skipped: Slurm has no PMIx plugin"; exit 77; }
mkdir -p "$DIR"
SL="$DIR/slurm"
rm -rf "$SL"
mkdir -p "$SL/state" "$SL/spool"
host=$(hostname -s)
# Ports of our own, away from a site Slurm's defaults (6817/6818).
ctl_port=$((20000 + RANDOM % 20000)); d_port=$((ctl_port + 1))
cat > "$SL/slurm.conf" <<CONF
ClusterName=tedsimtest
SlurmctldHost=$host
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=tedsim Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$SL/slurm.conf"
stop() {
  for f in "$SL/slurmd.pid" "$SL/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 1
  pkill -f "slurmscriptd" 2>/dev/null || true
  for f in "$SL/slurmd.pid" "$SL/slurmctld.pid"; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
  true
}
trap stop EXIT
fail() { echo "FAIL: $*"; for l in "$SL"/*.log; do echo "== $l"; tail -5 "$l"; done; exit 1; }
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 1 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.5; done
sinfo -h -o %T | grep -q idle || fail "the node never became idle"

run() { timeout 120 srun --mpi=pmix -n 2 "$TEDSIM" "$@"; }
PROFILE="$DIR/srun-profile.json"
rm -f "$PROFILE" "$PROFILE.partial"
run calibrate --backend cpu --quick --model tiny-moe --topology local-cpu --out "$PROFILE" > "$DIR/srun-calibrate.log" 2>&1 ||
  fail "srun calibrate failed: $(tail -3 "$DIR/srun-calibrate.log")"
python3 -c "import json, sys; p = json.load(open(sys.argv[1])); assert p['provenance']['ranks'] == 2, p['provenance']" "$PROFILE" ||
  fail "the profile was not measured by 2 ranks"
run validate --model tiny-moe --topology local-cpu --tp 1 --ep 2 --global-batch 8 --profile "$PROFILE" \
  > "$DIR/srun-validate.log" 2>&1 || fail "srun validate failed: $(tail -3 "$DIR/srun-validate.log")"
grep -q "(2 MPI ranks, backend cpu)" "$DIR/srun-validate.log" || fail "validate did not run 2 ranks"
grep -q "^verdict:" "$DIR/srun-validate.log" || fail "validate gave no verdict"
grep "^iteration " "$DIR/srun-validate.log"
start=$(date +%s)
run validate --model tiny-moe --tp 1 --ep 2 --global-batch 8 --timeout 3 --inject-fault hang:1:2 > "$DIR/srun-hang.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "a hung rank under srun ended with exit code 0"
[ $elapsed -le 13 ] || fail "a hung rank under srun took $elapsed s to end (deadline 3 s + 10 s)"
grep -q "world rank 1 on host .* did not arrive: it is alive but outside any collective" "$DIR/srun-hang.log" ||
  fail "no watchdog message naming the hung rank: $(tail -5 "$DIR/srun-hang.log")"
echo "slurm_srun: OK (hung rank ended in $elapsed s)"
