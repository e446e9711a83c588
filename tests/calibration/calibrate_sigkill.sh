#!/bin/bash
# Calibration killed with SIGKILL at three moments (early, rank 0; half-way, rank 1; near the end,
# rank 1 while computing), each time resumed with the same command, ends with exactly the points
# of an uninterrupted run (compared with `profile diff` against the fixture's quick.json).
#   calibrate_sigkill.sh TEDSIM MPIRUN DIR
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
OUT="$DIR/killed.json"
mkdir -p "$DIR"
rm -f "$OUT" "$OUT.partial"
fail() { echo "FAIL: $*"; exit 1; }
done_points() { grep -o '"done": [0-9]*' "$OUT.partial" 2>/dev/null | grep -o '[0-9]*$' || echo 0; }
total_points() { grep -o '"points": [0-9]*' "$OUT.partial" 2>/dev/null | grep -o '[0-9]*$' || echo 0; }

# The PID of world rank R among the processes mpirun started.
rank_pid() {
  local launcher=$1 rank=$2 pid
  for pid in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
      echo "$pid"; return 0
    fi
  done
  return 1
}

# Runs the calibration until it reaches absolute point $1, then SIGKILLs world rank $3. A quick
# sweep takes under a second, too fast to aim a kill at by watching the file; so world rank $2 is
# made to stop at that point (--inject-fault hang, no watchdog), the moment is known, and the kill
# comes from outside. Killing the stopped rank is a death while computing; killing the other one,
# a death inside a collective.
run_and_kill() {
  local at=$1 stopped=$2 rank=$3
  local before step log="$DIR/killed-$rank-$at.log"
  before=$(done_points)
  step=$((at - before))
  [ $step -ge 1 ] || fail "point $at is already measured ($before done)"
  "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick \
    --model tiny-moe --topology local-cpu --out "$OUT" --timeout 0 --inject-fault "hang:$stopped:$step" \
    > "$log" 2>&1 &
  local launcher=$! waited=0
  until grep -q "hangs, outside any collective, at step $step" "$log"; do
    kill -0 $launcher 2>/dev/null || fail "the calibration ended before point $at (see $log)"
    sleep 0.05
    waited=$((waited + 1))
    [ $waited -lt 2400 ] || fail "point $at never came"
  done
  sleep 0.2  # the other rank is inside its next collective by now
  local pid
  pid=$(rank_pid $launcher "$rank") || fail "no process of rank $rank"
  kill -KILL "$pid"
  wait $launcher
  local rc=$?
  [ $rc -ne 0 ] || fail "mpirun exited 0 after its rank $rank was killed"
  [ -s "$OUT.partial" ] && [ ! -e "$OUT" ] || fail "after the kill at point $at: no partial profile, or a final one"
  [ "$(done_points)" -eq $((at - 1)) ] || fail "the partial profile holds $(done_points) points, not $((at - 1))"
  echo "SIGKILL to rank $rank at point $at of $(total_points) (rank $stopped stopped there); mpirun exit $rc"
}

# Early, among the GEMMs: rank 0 dies inside a collective while rank 1 is stopped.
run_and_kill 3 1 0
total=$(total_points)
[ "$total" -gt 10 ] || fail "the sweep has only $total points"
# Half-way: rank 1 dies inside a collective. Near the end, among the collectives: the stopped rank
# itself dies.
run_and_kill $((total / 2)) 0 1
run_and_kill $((total - 4)) 1 1
"$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" calibrate --backend cpu --quick \
  --model tiny-moe --topology local-cpu --out "$OUT" > "$DIR/killed-final.log" 2>&1 || fail "the last resume failed"
grep -q "resuming" "$DIR/killed-final.log" || fail "the last run did not resume"
[ -s "$OUT" ] && [ ! -e "$OUT.partial" ] || fail "no final profile, or a partial one left behind"
"$TEDSIM" profile diff "$DIR/quick.json" "$OUT" > "$DIR/killed-diff.txt" || fail "profile diff failed"
grep -q "^0 points only in A, 0 only in B" "$DIR/killed-diff.txt" || { cat "$DIR/killed-diff.txt"; fail "point sets differ"; }
echo "calibrate_sigkill: OK"
