#!/usr/bin/env bash
# The whole CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer, MPI tests
# included (CI runs it after the plain suite).
#
# usage: scripts/sanitized-tests.sh [BUILD_DIR]   (default build-asan; about 12 minutes on 2 cores)
#
# Every test runs with memory errors and undefined behaviour fatal. Leak detection is off for the
# suite because OpenMPI's dynamically loaded components leak at exit in frames LeakSanitizer cannot
# name (so no suppression can target them); the cost-model, CLI and kernel tests, which run without
# MPI, are then run again with leak detection on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-asan}"
# -O1 with line tables, as the sanitizers' own documentation suggests: half the compile time of
# -O2 -g, stack traces still name file and line.
cmake -S "$root" -B "$build" -DTEDSIM_SANITIZE=address,undefined -DTEDSIM_CUDA=OFF -DTEDSIM_BENCHMARKS=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
      > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j2
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Two labels stay with the plain suite: `browser` (Chromium loading the HTML reports: the reports'
# own code runs sanitized in the report unit tests) and `cluster` (the namespace cluster reruns
# the 2-rank validate path the MPI tests here already cover, serially, for a minute).
# The two exhaustive search tests simulate the whole space one configuration at a time (over two
# minutes under ASan, the longest of the suite): they run in the plain suite, and every other
# search test takes the same paths sanitized, below with leaks checked too.
exhaustive='Search\.SameBestAsSimulatingEveryConfiguration|Search\.ExplainsEachChoiceWithTheBestPlanWithoutIt'
# Two more stay with the plain suite, to keep CI well under 20 minutes: validate_calibrate_np2
# (90 s under ASan, both slots: calibration's and validate's code run sanitized in
# calibrate_resume_np2, calibrate_quick_np2 and the validate tests) and runtime_kernel_list_np2
# (the same step code as runtime_kernel_list_np1 on two ranks). calibrate_routing_np2 too (95 s
# under ASan, both slots: seven calibrations and validations of one model; its routing count is
# the step's forward with load tracking, which runtime_load_tracking_np2 runs sanitized, and the
# shares' reading and use run sanitized in the unit tests' ExpertShares and MeasuredProfileFile).
slow_twins='validate_calibrate_np2|runtime_kernel_list_np2|calibrate_routing_np2'
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ctest --test-dir "$build" -j2 --timeout 600 --output-on-failure \
  --label-exclude 'browser|cluster' --exclude-regex "$exhaustive|$slow_twins"
for t in "$build/tests/unit/tedsim_unit_tests" "$build/tests/kernels/test_kernels" "$build/tests/report/tedsim_report_tests"; do
  echo "+ $t (leak detection on)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$t" --gtest_brief=1 \
    --gtest_filter=-Search.SameBestAsSimulatingEveryConfiguration:Search.ExplainsEachChoiceWithTheBestPlanWithoutIt
done
