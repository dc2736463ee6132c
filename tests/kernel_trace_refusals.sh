#!/usr/bin/env bash
# tests/kernel_trace_refusals.sh PYTHON LIBRARY: libfg_kernel_trace.so (bench/kernel_trace.cpp)
# declines to trace, naming why, when FG_KERNEL_TRACE_OUT is unset or names a file it cannot
# write. The CUDA driver calls InitializeInjection; here Python's ctypes calls it, so no GPU is
# needed (the refusals come before CUPTI is asked to record anything).
set -euo pipefail
python=$1 lib=$2
init='import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).InitializeInjection())'  # its return
check() {  # check WHAT OUTPUT MESSAGE: returned 0 and said MESSAGE
    grep -qx 0 <<< "$2" || { echo "$1: traced anyway: $2" >&2; exit 1; }
    grep -qF "$3" <<< "$2" || { echo "$1: no '$3' in: $2" >&2; exit 1; }
}
out=$(env -u FG_KERNEL_TRACE_OUT "$python" -c "$init" "$lib" 2>&1)
check "FG_KERNEL_TRACE_OUT unset" "$out" "kernel_trace: set FG_KERNEL_TRACE_OUT to the file to write"
missing=$(mktemp -d /tmp/fg_kernel_trace.XXXXXX)
rmdir "$missing"
out=$(FG_KERNEL_TRACE_OUT=$missing/trace.txt "$python" -c "$init" "$lib" 2>&1)
check "an unwritable FG_KERNEL_TRACE_OUT" "$out" "kernel_trace: cannot write $missing/trace.txt"
echo "kernel_trace: both refusals named"
