#!/usr/bin/env bash
# tests/distributed_gpu.sh FUSEGRAD: data-parallel training on two GPUs (NCCL, train/grad_exchange.h)
# against one GPU at the same global batch, over the first 50 steps of the addition task:
#   1. fp32 and bf16, each with and without ZeRO-1 (train.zero), in buckets small enough that
#      several are exchanged during the backward: every step's loss within the precision's noise
#      of the one-GPU run's (fp32: 1e-3; bf16: the largest step-loss difference between the
#      one-GPU bf16 and fp32 runs, bf16's own distance from fp32), the two ranks' weights
#      bitwise identical after step 50 (the trainer's hash), every bucket's exchange started
#      during the backward;
#   2. the ZeRO-1 run's checkpoint resumes on one GPU.
# Skipped (exit 77) on a machine with fewer than two GPUs or a build without NCCL.
set -euo pipefail
bin=$1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then echo "skipped: ${gpus:-0} GPU(s), this test needs 2"; exit 77; fi
if "$bin" info | grep -q "NCCL (several GPUs): this fusegrad was built without NCCL"; then
    echo "skipped: built without NCCL (FG_NCCL)"; exit 77
fi
export NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sets=(--set train.device=cuda --set model.n_layer=2 --set model.n_embd=128 --set model.n_head=4
      --set model.dropout=0 --set train.batch_size=64 --set train.steps=50
      --set train.eval_interval=25 --set train.checkpoint_interval=25 --set train.eval_iters=2
      --set train.bucket_mb=0.05)

# The largest difference between two runs' step losses (50 steps each).
max_diff() {
    paste <(grep '"ms"' "$1") <(grep '"ms"' "$2") | awk -F'\t' '{
        split($1, a, /"loss":/); split(a[2], x, ",");
        split($2, b, /"loss":/); split(b[2], y, ",");
        d = x[1] - y[1]; if (d < 0) d = -d; if (d > m) m = d; n++
    } END { if (n != 50) { print "steps: " n; exit 1 } printf "%.3g\n", m }'
}

for precision in fp32 bf16; do
    "$bin" train configs/addition.yaml "${sets[@]}" --set train.precision=$precision \
        --set train.out_dir="$work/one_$precision" > "$work/one_$precision.log" 2>&1 ||
        { cat "$work/one_$precision.log"; exit 1; }
done
bf16_noise=$(max_diff "$work/one_fp32/metrics.jsonl" "$work/one_bf16/metrics.jsonl")
summary=" bf16 against fp32 on one GPU: $bf16_noise;"
for precision in fp32 bf16; do
    tol=1e-3
    [ "$precision" = bf16 ] && tol=$bf16_noise
    for zero in 0 1; do
        run=two_${precision}_zero$zero
        "$bin" train configs/addition.yaml "${sets[@]}" --set train.precision=$precision \
            --set train.zero=$zero --ranks 2 --set train.out_dir="$work/$run" > "$work/$run.log" 2>&1 ||
            { cat "$work/$run.log"; exit 1; }
        grep -q "ranks: the 2 ranks' weights are identical after step 50" "$work/$run.log" ||
            { cat "$work/$run.log"; exit 1; }
        line=$(grep "^ranks: the last step started" "$work/$run.log")
        read -r started of buckets <<< "$(sed 's/.*started \([0-9]*\) of \([0-9]*\) .*/\1 of \2/' <<< "$line")"
        [ "$started" = "$buckets" ] && [ "$buckets" -gt 3 ] || { echo "$run: $line"; exit 1; }
        d=$(max_diff "$work/one_$precision/metrics.jsonl" "$work/$run/metrics.jsonl")
        awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d <= t) }' ||
            { echo "$run: step losses differ from one GPU's by up to $d (> $tol)"; exit 1; }
        summary="$summary $run: max loss difference $d (tolerance $tol);"
    done
done

# 2. ZeRO-1's checkpoint (AdamW's state gathered whole) resumes on one GPU.
"$bin" train --resume "$work/two_fp32_zero1" --set train.steps=60 > "$work/resume.log" 2>&1 ||
    { cat "$work/resume.log"; exit 1; }
[ "$(grep -c '"ms"' "$work/two_fp32_zero1/metrics.jsonl")" = 60 ] || { cat "$work/resume.log"; exit 1; }

echo "two GPUs against one:$summary identical weights, every bucket exchanged during the" \
     "backward; the ZeRO-1 checkpoint resumes on one GPU"
