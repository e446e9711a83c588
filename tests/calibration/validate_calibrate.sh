#!/bin/bash
# validate --calibrate on a profile of another model (the quick tiny-moe fixture) measures what the
# cpu-moe job asks and the profile lacks, writes it into the profile, and then predicts without a
# mismatch or an unanswered lookup; a second run finds nothing left to measure. From no file at
# all it creates the profile.
#   validate_calibrate.sh TEDSIM MPIRUN DIR
set -uo pipefail
TEDSIM=$1 MPIRUN=$2 DIR=$3
PROFILE="$DIR/completed.json"
fail() { echo "FAIL: $*"; cat "$DIR/validate-calibrate.log"; exit 1; }
cp "$DIR/quick.json" "$PROFILE"
run() {
  "$MPIRUN" -np 2 --oversubscribe --mca btl self,vader "$TEDSIM" validate --model cpu-moe --tp 1 --ep 2 \
    --global-batch 8 --warmup 1 --iters 2 --profile "$1" --calibrate > "$DIR/validate-calibrate.log" 2>&1 ||
    fail "validate --calibrate exited $?"
}
run "$PROFILE"
grep -Eq "^validate --calibrate: measured [1-9][0-9]* GEMM, [1-9][0-9]* kernel and [1-9][0-9]* collective points" \
  "$DIR/validate-calibrate.log" || fail "nothing measured for a profile of another model"
if grep -q "profile mismatch: calibrated for model" "$DIR/validate-calibrate.log"; then fail "still a mismatch"; fi
if grep -q "lookups* not answered by a measured point" "$DIR/validate-calibrate.log"; then fail "lookups left unanswered"; fi
before=$(grep -c '"m":' "$DIR/quick.json"); after=$(grep -c '"m":' "$PROFILE")
[ "$after" -gt "$before" ] || fail "the profile did not gain GEMM points ($before -> $after)"
grep -q '"completed_for"' "$PROFILE" || fail "the profile does not say which job it was completed for"
run "$PROFILE"
grep -q "lacks 0 GEMM, 0 kernel and 0 collective points" "$DIR/validate-calibrate.log" || fail "the second run measured again"
rm -f "$DIR/fresh.json"
run "$DIR/fresh.json"
grep -q "(new profile)" "$DIR/validate-calibrate.log" || fail "no new profile announced"
[ -s "$DIR/fresh.json" ] || fail "no profile created"
echo "validate_calibrate: OK"
