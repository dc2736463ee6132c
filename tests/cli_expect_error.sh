#!/usr/bin/env bash
# tests/cli_expect_error.sh EXPECTED COMMAND [ARGS...]: passes when COMMAND exits non-zero, its
# output contains EXPECTED (a fixed string), and, for the fusegrad command, says "error:" once.
# Used by the `cli:` tests of the fusegrad command and by the benchmarks' and tools' usage tests.
expected=$1
shift
output=$("$@" 2>&1)
status=$?
if [ $status -eq 0 ]; then
    echo "expected a failure, got exit 0; output:"; echo "$output"; exit 1
fi
if ! grep -qF -- "$expected" <<<"$output"; then
    echo "exit $status, but the output lacks: $expected"; echo "$output"; exit 1
fi
if [ "$(basename "$1")" = fusegrad ] && [ "$(grep -o "error:" <<<"$output" | wc -l)" -ne 1 ]; then
    echo "exit $status, but \"error:\" is not said once:"; echo "$output"; exit 1
fi
echo "ok: exit $status with: $expected"
