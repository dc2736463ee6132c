#!/usr/bin/env bash
# tests/distributed_cpu.sh FUSEGRAD: data-parallel training with two CPU ranks (scale/distributed.h)
# against one process, through the environment torchrun sets (RANK, WORLD_SIZE, MASTER_PORT):
#   1. the two ranks' losses are the single process's, to float rounding (same global batch),
#      and so are their evaluations (which the ranks share);
#   2. the ranks' weights are bitwise identical at the end (the trainer checks a hash of them);
#   3. rank 0 alone writes: the run directory holds one run's files, rank 1 prints nothing;
#   4. a killed rank stops the other within seconds, with a message, instead of a hang;
#   5. `fusegrad train --ranks 2` starts the same two ranks itself: the same metrics;
#   6. SIGTERM to it stops both ranks after the same step, rank 0 saving it;
#   7. a run saved by one process resumes on two ranks as it resumes on one;
#   8. ZeRO-1 (train.zero=1) with small buckets exchanged during the backward and two
#      micro-batches: one process's losses, identical weights, every bucket started before the
#      backward ended; the same buckets without ZeRO, too;
#   9. a ZeRO-1 checkpoint (AdamW's state gathered whole) resumes on one process and on two
#      ranks with ZeRO as one process's checkpoint resumes;
#  10. bf16 training exchanges bf16 sums, with and without ZeRO-1: one process's losses within
#      bf16's own distance from fp32;
#  11. a non-finite loss or gradient norm stops both ranks with the same message; ranks started with
#      different configs stop at once, the differing one naming the keys;
#  12. kill -9 of the --ranks launcher stops its ranks (rank 0 saving);
#  13. at the rendezvous, a silent connection, garbage and another job's rank (job token) are
#      dropped and reported, and the real rank still joins;
#  14. SIGTERM ends rank 0's wait at the rendezvous within a second;
#  15. a MASTER_ADDR that is not this host's address (or a host name resolving to loopback here)
#      makes rank 0 listen on every interface, saying so, and the other rank still joins.
set -euo pipefail
source "$(dirname "$0")/kill_rank.sh"  # kill_rank_1
bin=$1
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
sets=(--set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set data.digits=1
      --set model.dropout=0.1
      --set train.device=cpu --set train.batch_size=16 --set train.steps=30
      --set train.eval_interval=10 --set train.checkpoint_interval=10 --set train.eval_iters=2)
port=$((20000 + RANDOM % 30000))
# Waits (at most 10 s) until the run in directory $1 has logged a step.
wait_until_trained() {
    for _ in $(seq 100); do
        [ -s "$1/metrics.jsonl" ] && return
        sleep 0.1
    done
}
# Waits (at most 10 s) until something listens on port $1 of 127.0.0.1.
wait_until_listening() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.1
    done
}

"$bin" train configs/addition.yaml "${sets[@]}" --set train.out_dir="$work/one" > "$work/one.log"
WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train configs/addition.yaml "${sets[@]}" \
    --set train.out_dir="$work/two" > "$work/rank1.log" 2>&1 &
rank1=$!
WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml "${sets[@]}" \
    --set train.out_dir="$work/two" > "$work/rank0.log" 2>&1
wait $rank1

# 1. Losses: step by step, to float rounding (two half-batch means summed vs one mean).
paste <(grep '"ms"' "$work/one/metrics.jsonl") <(grep '"ms"' "$work/two/metrics.jsonl") |
    awk -F'\t' '{
        split($1, a, /"loss":/); split(a[2], x, ",");
        split($2, b, /"loss":/); split(b[2], y, ",");
        d = x[1] - y[1]; if (d < 0) d = -d;
        if (d > 2e-5) { print "step " NR ": one process " x[1] ", two ranks " y[1]; bad = 1 }
        n++
    } END { if (bad || n != 30) { print n " steps compared"; exit 1 } }'
# ... and the evaluations (the ranks share the batches and problems, then add their totals).
paste <(grep '"val_loss"' "$work/one/metrics.jsonl") <(grep '"val_loss"' "$work/two/metrics.jsonl") |
    awk -F'\t' '{
        split($1, a, /"val_loss":/); split(a[2], x, /[,}]/);
        split($2, b, /"val_loss":/); split(b[2], y, /[,}]/);
        d = x[1] - y[1]; if (d < 0) d = -d;
        if (d > 2e-5) { print "eval " NR ": one process " x[1] ", two ranks " y[1]; bad = 1 }
        n++
    } END { if (bad || n != 3) { print n " evaluations compared"; exit 1 } }'
# 2. The weights' check, and the ranks line, in rank 0's log.
grep -q "ranks: the 2 ranks' weights are identical after step 30" "$work/rank0.log" ||
    { cat "$work/rank0.log"; echo "no identical-weights line"; exit 1; }
grep -q "^ranks: 2, " "$work/rank0.log" || { echo "no ranks line"; exit 1; }
# 3. Rank 1 wrote nothing: its log is empty, and the directory is one run's.
[ ! -s "$work/rank1.log" ] || { echo "rank 1 printed:"; cat "$work/rank1.log"; exit 1; }
[ "$(grep -c '"ms"' "$work/two/metrics.jsonl")" = 30 ] || { echo "metrics.jsonl has other lines"; exit 1; }

# 4. A rank killed mid-run: the other stops within seconds, saying why.
long=("${sets[@]}" --set train.steps=1000000 --set train.eval_interval=1000000
      --set train.checkpoint_interval=1000000)
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train configs/addition.yaml "${long[@]}" \
    --set train.out_dir="$work/killed" > "$work/k1.log" 2>&1 &
rank1=$!
WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml "${long[@]}" \
    --set train.out_dir="$work/killed" > "$work/k0.log" 2>&1 &
rank0=$!
kill_rank_1 "$work/killed" "$work/k0.log" $rank0 $rank1 1 10 "did another rank stop\?"

# 5. The launcher: the same two ranks, the same metrics (timing aside).
"$bin" train configs/addition.yaml "${sets[@]}" --ranks 2 --set train.out_dir="$work/launched" \
    > "$work/launched.log" 2>&1 || { cat "$work/launched.log"; exit 1; }
cmp <(grep '"ms"' "$work/two/metrics.jsonl" | sed 's/,"ms".*//') \
    <(grep '"ms"' "$work/launched/metrics.jsonl" | sed 's/,"ms".*//') ||
    { echo "--ranks 2 trained differently from two ranks started by hand"; exit 1; }

# 6. SIGTERM to the launcher: both ranks stop after the same step, rank 0 saves, exit 130.
"$bin" train configs/addition.yaml "${long[@]}" --ranks 2 --set train.out_dir="$work/term" \
    > "$work/term.log" 2>&1 &
launcher=$!
wait_until_trained "$work/term"
kill -TERM $launcher
status=0
wait $launcher || status=$?
[ $status -eq 130 ] || { cat "$work/term.log"; echo "the launcher exited $status, not 130"; exit 1; }
grep -q "^stopped at step [0-9]*; checkpoint saved" "$work/term.log" || { cat "$work/term.log"; exit 1; }
grep -q "weights are identical" "$work/term.log" || { cat "$work/term.log"; exit 1; }
[ -f "$work/term/checkpoint.json" ] || { echo "no checkpoint after SIGTERM"; exit 1; }

# 7. Resume with another number of ranks: the one-process run, continued to step 40 by one
# process and (from a copy) by two ranks: the same losses.
cp -r "$work/one" "$work/one_copy"
"$bin" train --resume "$work/one" --set train.steps=40 > "$work/resume1.log" 2>&1 ||
    { cat "$work/resume1.log"; exit 1; }
out=$("$bin" train --resume "$work/one_copy" --set train.steps=40 --ranks 2 2>&1) &&
    { echo "a checkpoint of one process resumed on two ranks without train.ranks_may_change"; exit 1; }
grep -q "was saved by 1 rank(s); this resume runs on 2" <<< "$out" || { echo "$out"; exit 1; }
"$bin" train --resume "$work/one_copy" --set train.steps=40 --set train.ranks_may_change=true \
    --ranks 2 > "$work/resume2.log" 2>&1 || { cat "$work/resume2.log"; exit 1; }
grep -q "note: resuming a checkpoint of 1 rank(s) on 2 (train.ranks_may_change)" "$work/resume2.log" ||
    { cat "$work/resume2.log"; exit 1; }
paste <(grep '"ms"' "$work/one/metrics.jsonl" | tail -10) \
      <(grep '"ms"' "$work/one_copy/metrics.jsonl" | tail -10) |
    awk -F'\t' '{
        split($1, a, /"loss":/); split(a[2], x, ",");
        split($2, b, /"loss":/); split(b[2], y, ",");
        d = x[1] - y[1]; if (d < 0) d = -d;
        if (d > 2e-5) { print "resumed step " NR ": one process " x[1] ", two ranks " y[1]; bad = 1 }
        n++
    } END { if (bad || n != 10) { print n " resumed steps compared"; exit 1 } }'

# The losses of the last $3 steps of two metrics files must agree within 2e-5.
same_losses() {
    paste <(grep '"ms"' "$1" | tail -n "$3") <(grep '"ms"' "$2" | tail -n "$3") |
        awk -F'\t' -v want="$3" '{
            split($1, a, /"loss":/); split(a[2], x, ",");
            split($2, b, /"loss":/); split(b[2], y, ",");
            d = x[1] - y[1]; if (d < 0) d = -d;
            if (d > 2e-5) { print "step " NR ": " x[1] " against " y[1]; bad = 1 }
            k++
        } END { if (bad || k != want) { print k " steps compared"; exit 1 } }'
}

# Every bucket's exchange started while the last step's backward ran (their hooks fired), and
# there were several.
all_started_in_backward() {
    local line started of buckets
    line=$(grep "^ranks: the last step started" "$1") || { cat "$1"; exit 1; }
    read -r started of buckets <<< "$(sed 's/.*started \([0-9]*\) of \([0-9]*\) .*/\1 of \2/' <<< "$line")"
    [ "$started" = "$buckets" ] && [ "$buckets" -gt 3 ] || { echo "$1: $line"; exit 1; }
}

# 8. ZeRO-1 and small buckets (train.bucket_mb: a few KiB, so the tiny model has many), two
# micro-batches a step: the losses of one process with the same global batch.
accum=(--set train.batch_size=8 --set train.grad_accum=2)
"$bin" train configs/addition.yaml "${sets[@]}" "${accum[@]}" --set train.out_dir="$work/one_accum" \
    > "$work/one_accum.log"
for zero in 1 0; do
    "$bin" train configs/addition.yaml "${sets[@]}" "${accum[@]}" --ranks 2 --set train.zero=$zero \
        --set train.bucket_mb=0.002 --set train.out_dir="$work/zero$zero" > "$work/zero$zero.log" 2>&1 ||
        { cat "$work/zero$zero.log"; exit 1; }
    same_losses "$work/one_accum/metrics.jsonl" "$work/zero$zero/metrics.jsonl" 30 ||
        { echo "train.zero=$zero on two ranks trained differently from one process"; exit 1; }
    grep -q "ranks: the 2 ranks' weights are identical after step 30" "$work/zero$zero.log" ||
        { cat "$work/zero$zero.log"; exit 1; }
    all_started_in_backward "$work/zero$zero.log"
done
grep -q "^ranks: 2, .*(ZeRO-1: reduce-scattered" "$work/zero1.log" || { cat "$work/zero1.log"; exit 1; }
# What a rank keeps, as each logs it: ZeRO-1 halves AdamW's state on two ranks.
state_kib() { sed -n 's/^ranks: each keeps \([0-9.]*\) KiB of optimizer state.*/\1/p' "$1"; }
s0=$(state_kib "$work/zero0.log") s1=$(state_kib "$work/zero1.log")
awk -v a="$s0" -v b="$s1" 'BEGIN { exit !(a > 0 && b > 0.49 * a && b < 0.51 * a) }' ||
    { echo "optimizer state: $s0 KiB without ZeRO, $s1 KiB with"; exit 1; }

# 9. The ZeRO-1 run's checkpoint resumed to step 40 on one process, and on two ranks with ZeRO:
# the losses of the one-process run resumed the same way.
cp -r "$work/zero1" "$work/zero1_copy"
"$bin" train --resume "$work/one_accum" --set train.steps=40 > "$work/resume_one.log" 2>&1 ||
    { cat "$work/resume_one.log"; exit 1; }
"$bin" train --resume "$work/zero1" --set train.steps=40 --set train.ranks_may_change=true \
    > "$work/resume_zero_one.log" 2>&1 ||
    { cat "$work/resume_zero_one.log"; exit 1; }
"$bin" train --resume "$work/zero1_copy" --set train.steps=40 --ranks 2 \
    > "$work/resume_zero_two.log" 2>&1 || { cat "$work/resume_zero_two.log"; exit 1; }
same_losses "$work/one_accum/metrics.jsonl" "$work/zero1/metrics.jsonl" 10 ||
    { echo "a ZeRO-1 checkpoint resumed on one process trained differently"; exit 1; }
same_losses "$work/one_accum/metrics.jsonl" "$work/zero1_copy/metrics.jsonl" 10 ||
    { echo "a ZeRO-1 checkpoint resumed on two ranks trained differently"; exit 1; }
all_started_in_backward "$work/resume_zero_two.log"  # the loaded weights are hooked too

# 10. bf16 (train.precision): the sums travel as bf16 (train.exchange_dtype auto), with and
# without ZeRO-1: the losses of one process within bf16's own distance from fp32.
max_diff() {
    paste <(grep '"ms"' "$1") <(grep '"ms"' "$2") | awk -F'\t' '{
        split($1, a, /"loss":/); split(a[2], x, ",");
        split($2, b, /"loss":/); split(b[2], y, ",");
        d = x[1] - y[1]; if (d < 0) d = -d; if (d > m) m = d
    } END { printf "%.6g\n", m }'
}
bf16=(--set train.precision=bf16 --set model.dropout=0)
"$bin" train configs/addition.yaml "${sets[@]}" "${bf16[@]}" --set train.out_dir="$work/one_bf16" \
    > "$work/one_bf16.log" 2>&1
"$bin" train configs/addition.yaml "${sets[@]}" --set model.dropout=0 \
    --set train.out_dir="$work/one_fp32" > "$work/one_fp32.log" 2>&1
noise=$(max_diff "$work/one_fp32/metrics.jsonl" "$work/one_bf16/metrics.jsonl")
for zero in 0 1; do
    "$bin" train configs/addition.yaml "${sets[@]}" "${bf16[@]}" --ranks 2 --set train.zero=$zero \
        --set train.bucket_mb=0.002 --set train.out_dir="$work/bf16_zero$zero" \
        > "$work/bf16_zero$zero.log" 2>&1 || { cat "$work/bf16_zero$zero.log"; exit 1; }
    grep -q "exchanged in bf16 during the backward" "$work/bf16_zero$zero.log" ||
        { cat "$work/bf16_zero$zero.log"; exit 1; }
    grep -q "weights are identical after step 30" "$work/bf16_zero$zero.log" ||
        { cat "$work/bf16_zero$zero.log"; exit 1; }
    d=$(max_diff "$work/one_bf16/metrics.jsonl" "$work/bf16_zero$zero/metrics.jsonl")
    awk -v d="$d" -v t="$noise" 'BEGIN { exit !(d <= t) }' ||
        { echo "bf16 on two ranks (zero $zero): losses differ from one process's by up to $d" \
               "(bf16 against fp32: $noise)"; exit 1; }
done

# 11. Failures on every rank at once: a non-finite loss or norm stops both ranks before the
# update with the same message; ranks started with different configs stop at once, the one that
# differs naming the keys (instead of exchanging buckets of different sizes until the timeout).
"$bin" train configs/addition.yaml "${sets[@]}" --set optim.lr=1e9 --set optim.warmup_steps=0 \
    --set optim.grad_clip=0 --ranks 2 --set train.out_dir="$work/nan" > "$work/nan.log" 2>&1 &&
    { echo "a non-finite norm did not stop the ranks"; exit 1; }
[ "$(grep -cE "the (training loss|gradient norm) at step [0-9]+ is .*nan.*stopped before updating" \
       "$work/nan.log")" = 2 ] ||
    { cat "$work/nan.log"; exit 1; }
port=$((port + 2))
WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train configs/addition.yaml "${sets[@]}" \
    --set model.n_embd=64 --set train.out_dir="$work/mixed" > "$work/mixed1.log" 2>&1 &
rank1=$!
start=$SECONDS
WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml "${sets[@]}" \
    --set train.out_dir="$work/mixed" > "$work/mixed0.log" 2>&1 && { echo "rank 0 ran"; exit 1; }
wait $rank1 && { echo "rank 1 ran with another config"; exit 1; }
[ $((SECONDS - start)) -le 10 ] || { echo "mismatched configs took $((SECONDS - start)) s to stop"; exit 1; }
grep -q "rank 1's config differs from rank 0's: model.n_embd (32 -> 64)" "$work/mixed1.log" ||
    { cat "$work/mixed1.log"; exit 1; }
grep -q "1 rank(s) run another config than rank 0" "$work/mixed0.log" || { cat "$work/mixed0.log"; exit 1; }

# 12. kill -9 of the --ranks launcher: its ranks stop too (SIGTERM from PR_SET_PDEATHSIG; rank 0
# saves), instead of training on as orphans that race a later resume.
"$bin" train configs/addition.yaml "${long[@]}" --ranks 2 --set train.out_dir="$work/orphans" \
    > "$work/orphans.log" 2>&1 &
launcher=$!
wait_until_trained "$work/orphans"
kill -KILL $launcher
wait $launcher 2>/dev/null || true
for _ in $(seq 200); do
    pgrep -f "train.out_dir=$work/orphans" > /dev/null || break
    sleep 0.1
done
! pgrep -f "train.out_dir=$work/orphans" > /dev/null ||
    { echo "the ranks of a killed launcher still run after 20 s"; pkill -KILL -f "train.out_dir=$work/orphans"; exit 1; }
[ -f "$work/orphans/checkpoint.json" ] || { echo "no checkpoint after the launcher was killed"; exit 1; }

# 13. The rendezvous: a stray connection that sends nothing, a client sending garbage, and a
# rank of another job (another FUSEGRAD_JOB_TOKEN) are dropped and reported by rank 0, which goes
# on waiting; the real rank 1 then joins and the run trains. The other job's rank is told that
# what answered is not its rank 0.
port=$((port + 1))
FUSEGRAD_JOB_TOKEN=job-a WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml \
    "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/rdv" > "$work/rdv0.log" 2>&1 &
rank0=$!
wait_until_listening $port
exec 4<>/dev/tcp/127.0.0.1/$port   # connects and stays silent
printf 'GET / HTTP/1.0\r\n\r\n' > /dev/tcp/127.0.0.1/$port || true  # short, then closed
printf '%0100d' 0 > /dev/tcp/127.0.0.1/$port || true  # a hello's length of garbage
out=$(FUSEGRAD_JOB_TOKEN=job-a WORLD_SIZE=4 RANK=2 MASTER_PORT=$port "$bin" train \
      configs/addition.yaml "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/rdv" 2>&1) &&
    { echo "a rank of another world size joined"; exit 1; }
grep -q "is not a fusegrad rank 0 of this job" <<< "$out" || { echo "$out"; exit 1; }
out=$(FUSEGRAD_JOB_TOKEN=job-b WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train \
      configs/addition.yaml "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/rdv" 2>&1) &&
    { echo "a rank of another job joined"; exit 1; }
grep -q "is not a fusegrad rank 0 of this job" <<< "$out" || { echo "$out"; exit 1; }
FUSEGRAD_JOB_TOKEN=job-a WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train configs/addition.yaml \
    "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/rdv" > "$work/rdv1.log" 2>&1 ||
    { cat "$work/rdv1.log"; exit 1; }
wait $rank0 || { cat "$work/rdv0.log"; exit 1; }
exec 4>&-
for why in "no whole hello: it closed" "not a fusegrad rank's hello" "another job token" \
           "it says it is rank 2 of 4, which this job (2 ranks, waiting for 1) has no place for"; do
    grep -q "rank 0 dropped a connection from 127.0.0.1:[0-9]* to 127.0.0.1:$port: .*$why" \
        "$work/rdv0.log" || { cat "$work/rdv0.log"; echo "no drop for: $why"; exit 1; }
done

# 14. SIGTERM while rank 0 waits at the rendezvous: it stops within a second, saying so.
port=$((port + 1))
WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml "${sets[@]}" \
    --set train.out_dir="$work/waiting" > "$work/waiting.log" 2>&1 &
rank0=$!
wait_until_listening $port
kill -TERM $rank0
start=$SECONDS
wait $rank0 && { echo "rank 0 went on after SIGTERM"; exit 1; }
[ $((SECONDS - start)) -le 2 ] || { echo "SIGTERM at the rendezvous took $((SECONDS - start)) s"; exit 1; }
grep -q "stopped (SIGTERM or Ctrl-C) while waiting for the other ranks" "$work/waiting.log" ||
    { cat "$work/waiting.log"; exit 1; }

# 15. A MASTER_ADDR rank 0 cannot bind (192.0.2.1, a documentation address on no host: behind
# NAT, say) makes it listen on every interface, saying so, and a rank reaching it at another
# address joins. A host name resolving to loopback here (Debian's 127.0.1.1) does the same.
port=$((port + 1))
MASTER_ADDR=192.0.2.1 WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml \
    "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/nat" > "$work/nat0.log" 2>&1 &
rank0=$!
wait_until_listening $port
MASTER_ADDR=127.0.0.1 WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train configs/addition.yaml \
    "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/nat" > "$work/nat1.log" 2>&1 ||
    { cat "$work/nat1.log"; exit 1; }
wait $rank0 || { cat "$work/nat0.log"; exit 1; }
grep -q "rank 0 listens on every interface, port $port: MASTER_ADDR's address is not one of this" \
    "$work/nat0.log" || { cat "$work/nat0.log"; exit 1; }
host=$(hostname)
if getent ahostsv4 "$host" 2>/dev/null | head -1 | grep -q "^127\."; then
    port=$((port + 1))
    MASTER_ADDR=$host WORLD_SIZE=2 RANK=0 MASTER_PORT=$port "$bin" train configs/addition.yaml \
        "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/named" > "$work/named0.log" 2>&1 &
    rank0=$!
    wait_until_listening $port
    MASTER_ADDR=127.0.0.1 WORLD_SIZE=2 RANK=1 MASTER_PORT=$port "$bin" train \
        configs/addition.yaml "${sets[@]}" --set train.steps=3 --set train.out_dir="$work/named" \
        > "$work/named1.log" 2>&1 || { cat "$work/named1.log"; exit 1; }
    wait $rank0 || { cat "$work/named0.log"; exit 1; }
    grep -q "MASTER_ADDR names this host, which resolves to a loopback address" "$work/named0.log" ||
        { cat "$work/named0.log"; exit 1; }
fi

# A launch inside a launch is refused.
out=$(WORLD_SIZE=2 "$bin" train configs/addition.yaml --ranks 2 2>&1) && exit 1
grep -q "\[cli\] --ranks starts its own ranks, but WORLD_SIZE is already set" <<< "$out" ||
    { echo "$out"; exit 1; }

echo "two CPU ranks: the same losses as one process, identical weights, rank 0 alone writes;" \
     "a killed rank stops the other in $stopped_in s; --ranks 2 the same; SIGTERM stops both;" \
     "a one-process checkpoint resumes on two ranks; ZeRO-1 and overlapped buckets the same;" \
     "a ZeRO-1 checkpoint resumes on one process and on two ranks; bf16 sums within bf16 noise;" \
     "a NaN stops both ranks; different configs are refused by name; a killed launcher's" \
     "ranks stop; strays and other jobs' ranks are dropped at the rendezvous; SIGTERM ends a wait;" \
     "an address rank 0 cannot bind falls back to every interface"
