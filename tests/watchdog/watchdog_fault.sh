#!/bin/bash
# One rank misbehaves (--inject-fault) under real mpirun; every rank must end within the watchdog's
# deadline plus 10 s, with exit code 1 and a message naming the rank and host that did not arrive.
#   watchdog_fault.sh TEDSIM MPIRUN WORKDIR NP calibrate|validate hang|exit|exit-kept RANK
# hang:      the rank stops outside any collective; the watchdog's census names it alive and stuck.
# exit:      the rank dies; mpirun ends the job itself, and the rank's last words name it.
# exit-kept: the rank dies under a launcher that keeps the others running (here
#            mpirun --mca orte_abort_on_non_zero_status 0); the watchdog names it as not answering.
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3 NP=$4 CMD=$5 FAULT=$6 RANK=$7
TIMEOUT=3
mkdir -p "$DIR"
LOG="$DIR/$CMD-$FAULT-np$NP-rank$RANK.log"
HOST=$(hostname)
launcher=("$MPIRUN" -np "$NP" --oversubscribe --mca btl self,vader)
kind=$FAULT
if [ "$FAULT" = exit-kept ]; then
  launcher+=(--mca orte_abort_on_non_zero_status 0)
  kind=exit
fi
case $CMD in
  calibrate) step=3
             args=(calibrate --backend cpu --quick --model tiny-moe --topology local-cpu --out "$DIR/$CMD-$FAULT-np$NP.json") ;;
  validate)  step=2
             args=(validate --model tiny-moe --ep 2 --global-batch 8 --warmup 1 --iters 3) ;;
  *) echo "unknown command $CMD"; exit 2 ;;
esac
rm -f "$DIR/$CMD-$FAULT-np$NP.json" "$DIR/$CMD-$FAULT-np$NP.json.partial"
start=$(date +%s.%N)
# The test's own bound: far above the deadline, so a hang fails the test instead of holding CI.
timeout -s KILL 120 "${launcher[@]}" "$TEDSIM" "${args[@]}" --timeout $TIMEOUT --inject-fault "$kind:$RANK:$step" \
  > "$LOG" 2>&1
rc=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
fail() { echo "FAIL ($CMD $FAULT np$NP rank $RANK, rc $rc, ${elapsed} s): $*"; cat "$LOG"; exit 1; }
[ $rc -eq 1 ] || fail "expected exit code 1"
awk -v e="$elapsed" -v t=$TIMEOUT 'BEGIN { exit !(e <= t + 10) }' || fail "took longer than the deadline plus 10 s"
grep -qF -- "--inject-fault $kind:$RANK:$step: world rank $RANK on host $HOST" "$LOG" || fail "no word from the faulty rank"
case $FAULT in
  hang)
    grep -q "^tedsim: watchdog: .* has not completed after .* (--timeout 3.0 s" "$LOG" || fail "no watchdog message"
    grep -qF "world rank $RANK on host $HOST did not arrive: it is alive but outside any collective" "$LOG" ||
      fail "the watchdog did not name the hung rank"
    [ "$(grep -c '^tedsim: watchdog:' "$LOG")" -eq 1 ] || fail "more than one watchdog message" ;;
  exit-kept)
    grep -q "^tedsim: watchdog: .* has not completed" "$LOG" || fail "no watchdog message"
    grep -qF "world rank $RANK on host $HOST did not arrive: its watchdog did not answer" "$LOG" ||
      fail "the watchdog did not name the dead rank" ;;
  exit)
    grep -Eq "(mpirun|mpiexec) detected that one or more processes exited with non-zero status" "$LOG" ||
      fail "mpirun did not end the job for the dead rank" ;;
esac
echo "watchdog $CMD $FAULT np$NP rank $RANK: OK in ${elapsed} s"
