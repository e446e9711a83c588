#!/usr/bin/env bash
# Runs tedsim on an extreme input: passes when it ends within SECONDS, under a MIB memory bound,
# with exit 0 (an answer) or 2 (the limit named), never a crash or a hang.
# Usage: expect_bounded.sh SECONDS MIB TEDSIM ARGS...   (MIB 0: no memory bound, as under ASan,
# whose shadow memory reserves terabytes of address space)
seconds=$1; mib=$2; tedsim=$3; shift 3
( if [ "$mib" -gt 0 ]; then ulimit -v $((mib * 1024)); fi; exec timeout "$seconds" "$tedsim" "$@" ) >/dev/null 2>"${TMPDIR:-/tmp}/tedsim-limit-$$.err"
code=$?
echo "exit code: $code"; tail -2 "${TMPDIR:-/tmp}/tedsim-limit-$$.err"; rm -f "${TMPDIR:-/tmp}/tedsim-limit-$$.err"
case $code in
  0|2) echo ok ;;
  124) echo "FAIL: still running after $seconds s"; exit 1 ;;
  *) echo "FAIL: exit code $code (a crash, or out of the $mib MiB bound)"; exit 1 ;;
esac
