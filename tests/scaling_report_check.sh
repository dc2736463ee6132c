#!/usr/bin/env bash
# tests/scaling_report_check.sh PYTHON SOURCE_DIR: bench/scaling_report.py on made-up runs of
# known figures: fusegrad on 1 and 2 GPUs (1000 tokens a GPU a step, 100 and 125 ms), nanoGPT's
# model.py logs on 1 and 2 GPUs (5000 and 8000 tokens/s), a failed one on 4 (no summary) and
# one on 8 whose summary was cut short: both left out.
set -euo pipefail
python=$1 src=$2
runs=$(mktemp -d /tmp/fg_scaling_report.XXXXXX)
trap 'rm -rf "$runs"' EXIT
for n in 1 2; do
    mkdir -p "$runs/fusegrad-zero0_gpt2_$n"
    ms=$([ $n = 1 ] && echo 100 || echo 125)
    for step in $(seq 1 20); do
        echo "{\"step\": $step, \"ms\": $ms, \"tokens_per_s\": $((1000 * n * 1000 / ms)), \"peak_mem_mib\": 8000}"
    done > "$runs/fusegrad-zero0_gpt2_$n/metrics.jsonl"
done
echo 'using fused AdamW: True' > "$runs/nanogpt_gpt2_1.log"
echo '{"median_ms_per_step": 200.0, "tokens_per_s": 5000, "peak_mem_mib": 12000}' \
    >> "$runs/nanogpt_gpt2_1.log"
echo '{"median_ms_per_step": 250.0, "tokens_per_s": 8000, "peak_mem_mib": 12500}' \
    > "$runs/nanogpt_gpt2_2.log"
echo 'Traceback (most recent call last):' > "$runs/nanogpt_gpt2_4.log"
echo '{"median_ms_per_step": 3' > "$runs/nanogpt_gpt2_8.log"  # a summary cut short
out=$("$python" "$src/bench/scaling_report.py" "$runs")
echo "$out"
expect() {
    grep -qxF "$1" <<< "$out" || { echo "missing row: $1" >&2; exit 1; }
}
expect "| gpt2 | fusegrad-zero0 | 1 | 100.00 | 10000 | 100.0% | 8000 | 2.00x |"
expect "| gpt2 | fusegrad-zero0 | 2 | 125.00 | 16000 | 80.0% | 8000 | 2.00x |"
expect "| gpt2 | nanogpt-ddp-compile | 1 | 200.00 | 5000 | 100.0% | 12000 |  |"
expect "| gpt2 | nanogpt-ddp-compile | 2 | 250.00 | 8000 | 80.0% | 12500 |  |"
[ "$(grep -c '^| gpt2' <<< "$out")" = 4 ] || { echo "a row too many (a failed run?)" >&2; exit 1; }
echo "scaling_report.py: the expected rows"
