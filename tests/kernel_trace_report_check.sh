#!/usr/bin/env bash
# tests/kernel_trace_report_check.sh PYTHON SOURCE_DIR: bench/kernel_trace_report.py on a made-up
# trace of known figures: five steps of 2 ms, each a 1 ms product, a 0.2 ms norm that overlaps
# the product's last 0.1 ms, a 0.1 ms loss kernel (the marker) and a 0.2 ms memset after it,
# written out of order as CUPTI may hand them over, and in the window's last step a 0.3 ms kernel
# on another stream beside the marker, of which 0.1 ms lies in the window. Steps 2-3 (--skip 1
# --steps 2): 2 ms wall, 1.4 ms busy, 1.35 ms of kernels, gaps of 0.3, 0.2 and 0.1 ms a step;
# the tracer's closing "# memset" lines listed by calls. Asking for more steps than the trace
# holds is refused, and so is a record line or a memset line cut short.
set -euo pipefail
python=$1 src=$2
trace=$(mktemp /tmp/fg_kernel_trace.XXXXXX)
trap 'rm -f "$trace" "$trace.cut"' EXIT
for s in 4 3 2 1 0; do
    base=$((s * 2000000))
    echo "$((base + 1500000)) $((base + 1700000)) [memset 4096 bytes]"
    echo "$((base + 1200000)) $((base + 1300000)) _ZN2fg7kernels25cross_entropy_rows_kernelEv"
    echo "$((base + 900000)) $((base + 1100000)) norm_forward_kernel"
    echo "$base $((base + 1000000)) nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
done > "$trace"
# On another stream, beside the window's last marker and 0.2 ms past it: counted up to the end.
echo "7200000 7500000 embedding_backward_kernel" >> "$trace"
# The tracer's closing lines: memset calls by library, bytes and calls.
echo "# memset runtime:libcudnn_engines.so.9 4 24" >> "$trace"
echo "# memset driver:libcublasLt.so.13 4 97" >> "$trace"
out=$("$python" "$src/bench/kernel_trace_report.py" "$trace" --marker cross_entropy_rows_kernel \
      --skip 1 --steps 2 --label made-up)
echo "$out"
expect() {
    grep -qE "$1" <<< "$out" || { echo "missing: $1" >&2; exit 1; }
}
expect "^made-up: 2 steps; a step: 2.00 ms wall, GPU busy 1.40 ms, kernels summed 1.35 ms, "\
"4 kernels; copies and memsets: 1$"
expect "^  matrix products +1.000 ms +64.5%$"
expect "^  norms +0.200 ms +12.9%$"
expect "^  copies and memsets +0.200 ms +12.9%$"
expect "^  cross-entropy +0.100 ms +6.5%$"
expect "^  other +0.050 ms +3.2%$"
expect "^ +1.000 +1.0  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT$"
# The gaps: 0.2 ms from the marker to the memset, 0.3 ms from it to the next step's product, 0.1
# ms from the norm to the marker.
expect "^ +0.300 +1.0  \[memset 4096 bytes\]  /  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA"
expect "^ +0.200 +1.0  .*cross_entropy_rows_kernel.*  /  \[memset 4096 bytes\]"
expect "^ +0.100 +1.0  norm_forward_kernel  /  .*cross_entropy_rows_kernel"
expect "^ +97 +4  driver:libcublasLt.so.13$"
expect "^ +24 +4  runtime:libcudnn_engines.so.9$"
if "$python" "$src/bench/kernel_trace_report.py" "$trace" --marker cross_entropy_rows_kernel \
       --skip 3 --steps 2 > /dev/null 2>&1; then
    echo "a window past the trace's last step was not refused" >&2; exit 1
fi
# A line cut short (its process killed while writing) is refused, naming the file, the line and
# the form it should have had: a kernel's line, and a memset callers' line.
refuses_cut_line() {  # $1 the last line, $2 the form the message names, $3 what it is
    head -3 "$trace" > "$trace.cut" && echo "$1" >> "$trace.cut"
    if msg=$("$python" "$src/bench/kernel_trace_report.py" "$trace.cut" --skip 0 --steps 1 \
             --marker cross_entropy_rows_kernel 2>&1); then
        echo "$3 cut short was not refused" >&2; exit 1
    fi
    grep -qF "$trace.cut:4: not '$2'" <<< "$msg" || { echo "message: $msg" >&2; exit 1; }
}
refuses_cut_line "10400000 1040" "start_ns end_ns name" "a line"
refuses_cut_line "# memset driver:libcublasLt.so.13 4" "# memset API:LIBRARY BYTES CALLS" \
    "a memset line"
echo "kernel_trace_report.py: the expected figures"
