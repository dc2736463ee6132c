# tests/kill_rank.sh: sourced by tests/distributed_cpu.sh and tests/distributed_gpu.sh, which each
# start two ranks of a long run by hand (no launcher to stop the survivor) and then call
#   kill_rank_1 RUN_DIR RANK0_LOG RANK0_PID RANK1_PID MIN_STEPS LIMIT_S PATTERN
# Once rank 0 has logged MIN_STEPS steps in RUN_DIR/metrics.jsonl (a minute at most), rank 1 gets
# SIGKILL (no goodbye); rank 0 must then stop with a failure within LIMIT_S seconds, its log
# matching the extended regex PATTERN (why it stopped). Sets stopped_in (seconds); exits 1 on a
# failure, printing rank 0's log.
kill_rank_1() {
    local run=$1 log0=$2 rank0=$3 rank1=$4 min_steps=$5 limit=$6 pattern=$7
    local logged status=0 start
    for _ in $(seq 600); do
        logged=$(grep -c '"ms"' "$run/metrics.jsonl" 2>/dev/null || true)
        [ "${logged:-0}" -ge "$min_steps" ] && break
        sleep 0.1
    done
    kill -9 "$rank1"
    start=$SECONDS
    wait "$rank0" || status=$?
    stopped_in=$((SECONDS - start))
    [ "$status" -ne 0 ] || { cat "$log0"; echo "rank 0 went on after rank 1 was killed"; exit 1; }
    [ "$stopped_in" -le "$limit" ] ||
        { cat "$log0"; echo "rank 0 took $stopped_in s to stop"; exit 1; }
    grep -Eq "$pattern" "$log0" || { cat "$log0"; echo "rank 0 did not say why it stopped"; exit 1; }
}
