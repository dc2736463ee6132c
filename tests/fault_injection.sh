#!/usr/bin/env bash
# tests/fault_injection.sh: the run directory against faults, through the fusegrad command.
#   1. kill -9 at random moments (KILLS times, default 30) while a tiny model trains with a
#      checkpoint every step; after each kill the run is resumed (or, killed before its first
#      checkpoint, started again); the final weights must equal an uninterrupted run's, bit for bit.
#   2. a full disk, simulated with a file-size limit (ulimit -f; SIGXFSZ ignored, so writes fail
#      with EFBIG as they would with ENOSPC): the save fails with a message, the last good
#      checkpoint survives, and resuming without the limit finishes with the same weights.
#   3. SIGTERM (what a scheduler sends before it kills) saves a checkpoint, then exits, as Ctrl-C.
#   4. `eval` of a text run whose data file changed since is refused, naming vocab.txt.
# usage: fault_injection.sh FUSEGRAD [KILLS]
set -uo pipefail
bin=$1
kills=${2:-30}
work=$(mktemp -d /tmp/fg_faults.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/tiny.yaml" <<'YAML'
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, dropout: 0.1}
data: {kind: addition, digits: 1}
optim: {lr: 1.0e-2, warmup_steps: 2}
train: {steps: 3000, batch_size: 32, eval_interval: 100, eval_iters: 2, checkpoint_interval: 1,
        device: cpu}
YAML
die() { echo "FAIL: $*"; exit 1; }

"$bin" train "$work/tiny.yaml" --set train.out_dir="$work/ref" > "$work/ref.log" 2>&1 \
    || die "the uninterrupted run failed: $(tail -3 "$work/ref.log")"

# 1. kill -9
run=$work/run
done_ok=0
for ((i = 0; i < kills; ++i)); do
    # Before its first checkpoint a run is started again in the same directory, which it takes
    # over from the killed start; after it, resumed.
    if [ -f "$run/checkpoint.json" ]; then
        "$bin" train --resume "$run" > "$work/last.log" 2>&1 &
    else
        "$bin" train "$work/tiny.yaml" --set train.out_dir="$run" > "$work/last.log" 2>&1 &
    fi
    pid=$!
    sleep "0.$(printf "%03d" $((RANDOM % 250)))"
    if ! kill -9 "$pid" 2>/dev/null; then  # it had already finished
        wait "$pid" || die "kill $i: the run failed on its own: $(tail -3 "$work/last.log")"
        done_ok=1
        break
    fi
    wait "$pid" 2>/dev/null
done
if [ $done_ok = 0 ]; then  # finish after the last kill
    if [ -f "$run/checkpoint.json" ]; then
        "$bin" train --resume "$run" > "$work/last.log" 2>&1
    else
        "$bin" train "$work/tiny.yaml" --set train.out_dir="$run" > "$work/last.log" 2>&1
    fi || die "resuming after the kills failed: $(tail -3 "$work/last.log")"
fi
cmp -s "$work/ref/model.safetensors" "$run/model.safetensors" \
    || die "after $i kills the final weights differ from the uninterrupted run's"
# metrics.jsonl: each step once, in order (the lines of steps lost to a kill were dropped).
grep -v val_loss "$run/metrics.jsonl" | sed 's/^{"step": *\([0-9]*\),.*/\1/' \
    | awk 'NR != $1 { print "line " NR " is step " $1; bad = 1; exit } END { exit bad }' \
    || die "metrics.jsonl repeats or skips steps after the kills"
echo "kill -9: $i kills, then the same final weights as the uninterrupted run"

# 2. a full disk at a save
disk=$work/disk
"$bin" train "$work/tiny.yaml" --set train.out_dir="$disk" --set train.checkpoint_interval=20 \
    --max-steps 20 > "$work/disk1.log" 2>&1 || die "the run before the full disk failed"
good=$(cat "$disk/checkpoint.json")
(
    trap '' XFSZ
    ulimit -f 8  # KiB: config.yaml fits, the weights (about 14 KiB) do not
    exec "$bin" train --resume "$disk" > "$work/disk2.log" 2>&1
) && die "the save on a full disk did not fail"
grep -q "the last good checkpoint in '$disk' is kept" "$work/disk2.log" \
    || die "the failed save did not say so: $(tail -3 "$work/disk2.log")"
[ "$(cat "$disk/checkpoint.json")" = "$good" ] || die "the full disk changed checkpoint.json"
"$bin" train --resume "$disk" > "$work/disk3.log" 2>&1 \
    || die "resuming after the full disk failed: $(tail -3 "$work/disk3.log")"
cmp -s "$work/ref/model.safetensors" "$disk/model.safetensors" \
    || die "after the full disk the final weights differ from the uninterrupted run's"
echo "full disk: the save failed with a message, the last checkpoint survived, resume finished"

# 3. SIGTERM
term=$work/term
"$bin" train "$work/tiny.yaml" --set train.out_dir="$term" --set train.checkpoint_interval=100000 \
    > "$work/term.log" 2>&1 &
pid=$!
sleep 0.3
kill -TERM "$pid"
wait "$pid"
rc=$?
[ $rc = 130 ] || die "SIGTERM: exit status $rc, expected 130 (stopped, saved)"
[ -f "$term/checkpoint.json" ] || die "SIGTERM: no checkpoint was saved"
grep -q "stopped at step" "$work/term.log" || die "SIGTERM: the run did not say where it stopped"
"$bin" train --resume "$term" --max-steps 3000 > "$work/term2.log" 2>&1 \
    || die "resuming after SIGTERM failed: $(tail -3 "$work/term2.log")"
cmp -s "$work/ref/model.safetensors" "$term/model.safetensors" \
    || die "after SIGTERM and resume the final weights differ from the uninterrupted run's"
echo "SIGTERM: saved, exited 130, resumed to the same weights"

# 4. eval after the data file changed
printf 'abcabcabc abc\nbca cab\n%.0s' $(seq 50) > "$work/text.txt"
"$bin" train "$work/tiny.yaml" --set train.out_dir="$work/text" --set data.kind=text \
    --set data.path="$work/text.txt" --set train.steps=2 > "$work/text.log" 2>&1 \
    || die "the text run failed: $(tail -3 "$work/text.log")"
echo "xyz" >> "$work/text.txt"
out=$("$bin" eval "$work/text" 2>&1) && die "eval accepted a data file with another vocabulary"
grep -q "\[eval\] the data's vocabulary (8 tokens) is not the one in '$work/text/vocab.txt' (5 tokens)" \
    <<< "$out" || die "eval's message: $out"
echo "eval: a changed data file is refused"
