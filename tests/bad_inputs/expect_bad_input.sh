#!/usr/bin/env bash
# Runs tedsim on a bad input: passes when it exits 2 (not a crash, not 1) and stderr contains the
# expected text. Usage: expect_bad_input.sh TEDSIM "EXPECTED" ARGS...
tedsim=$1; expected=$2; shift 2
stderr=$(mktemp); trap 'rm -f "$stderr"' EXIT
"$tedsim" "$@" >/dev/null 2>"$stderr"
code=$?
echo "exit code: $code"; echo "stderr: $(cat "$stderr")"
if [ "$code" -ne 2 ]; then echo "FAIL: expected exit code 2"; exit 1; fi
if ! grep -qF -- "$expected" "$stderr"; then echo "FAIL: stderr lacks: $expected"; exit 1; fi
echo "ok"
