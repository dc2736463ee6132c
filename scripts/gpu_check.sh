#!/usr/bin/env bash
# Run on the GPU machine from the repository root (after `source .gpu/env.sh`): builds the CUDA
# configuration for sm_90, runs the steps asked for (by default `all`: the CPU and GPU tests, the
# core and norm benchmarks beside PyTorch, the parity tests and compute-sanitizer), and writes
# logs under $OUT (or ./gpu-out). Usage:
#   scripts/gpu_check.sh [tests|bench|gemm|attention|norm|ladder|sanitize|parity|shakespeare|seeds|
#                         gpt2|gpt2text|breakdown|trace|norm-profile|nanogpt|ddp|phases|python|
#                         models|overhead|all|build-only]...
#   build-only: the build alone. An unknown step name is refused before the build.
#   GPU_DEADLINE=S: steps that would start more than S seconds after the build are skipped (and
#   the call exits 1); more than 8 files under $OUT are packed into $OUT/logs.tgz (the device
#   tool returns 8 at most).
#   tests: the whole ctest suite, or with GPU_TEST_FILTER (a Catch2 filter, e.g. "[attention]")
#   only those cases of fg_gpu_tests (the whole GPU suite takes over 5 minutes);
#   gpt2: GPT-2 small on random tokens, fusegrad (captured and eager step) and torch.compile;
#   breakdown: per-kernel times of a GPT-2 small step (Nsight Compute, each kernel alone).
#   trace: per-kernel times of GPT-2 small's step as it runs (bench/kernel_trace.cpp), beside
#   nanoGPT's with NANOGPT_DIR; TRACE_BATCHES more batches than 16.
#   norm-profile: Nsight Compute on the tuned norm kernels at 16384 x 384 and 768 (see the step).
#   ladder: bench_norm --kernel ladder (LADDER_FLAGS: more of its flags, e.g. --dtype bf16).
#   python: the PyTorch package's tests (scripts/test_python.sh), GPU tests required;
#   models: bench/norm_torch_models.py (NANOGPT_DIR; LIGER_SRC for Liger's column): nanoGPT's
#   baby GPT, transformers' Llama and GPT-2 small, as written / fusegrad.patch / Liger's norms
#   (MODELS_FLAGS, e.g. "--models baby --modes compile"; the default, 16 runs with 9
#   compilations, 22 and 12 with LIGER_SRC, takes long).
#   overhead: bench/norm_torch_overhead.py with a host profile (LIGER_SRC: Liger-Kernel's src/
#   folder, carried, to time its modules beside).
#   nanogpt: nanoGPT's own train.py on the baby GPT (bf16, torch.compile) beside fusegrad's bf16
#   run, NANOGPT_STEPS (default 300) steps each, then GPT-2 small at 16 x 1024 (random tokens,
#   40 steps) beside nanoGPT's model.py (bench/nanogpt_gpt2.py), in one call. NANOGPT_DIR is a nanoGPT checkout
#   carried to the machine (not part of this repository; e.g. `git --git-dir=MIRROR archive HEAD
#   | tar -x -C .nanogpt` of a fetched copy, then carry .nanogpt, which .gitignore ignores).
#   ddp: several GPUs: the two-GPU test (tests/distributed_gpu.sh; DDP_TEST=0 skips it), then
#   tokens/s on DDP_GPUS (default 1 2 4 8, those the machine has) for DDP_MODELS (default
#   "baby gpt2"; GPT-2 small at DDP_GPT2_BATCH x 1024 a GPU, default 16), fusegrad (bf16;
#   DDP_VARIANTS, default ZeRO-1 off and on with bf16 sums, off with f32 sums) and PyTorch DDP
#   (bench/train_torch.py: bf16 autocast, f32 sums, torch.compile), each GPU with the one-GPU
#   batch; the table by bench/scaling_report.py. With NANOGPT_DIR, GPT-2 small is compared with
#   nanoGPT's own model.py under DDP + torch.compile (bench/nanogpt_gpt2.py under torchrun)
#   instead of bench/train_torch.py; each card's temperature and SM clock through the runs, a
#   card in thermal slowdown named.
#   phases: train.phase_times' GPU time of each phase of a GPT-2 small step, one GPU and several
#   ranks, with PHASE_VARIANTS of the ranks' settings (see the step).
#   gpt2text: GPT-2 small's architecture from scratch on the Shakespeare text's GPT-2 tokens
#   (`fusegrad prepare`), fusegrad and nanoGPT's own train.py (NANOGPT_DIR), the same tokens, batch,
#   schedule and steps, seeds PROOF_SEEDS (default "1 2 3"): validation curves as one SVG, the
#   seed spread, a sample from each (bench/gpt2_text_proof.py); PROOF_WORK: a folder of an earlier
#   call on the same machine, whose finished runs are kept (more seeds in a second call).
#   shakespeare: configs/shakespeare_char.yaml with fusegrad in each of FG_PRECISIONS (default
#   "bf16"; e.g. "bf16 tf32"), then the PyTorch baseline (bench/train_torch.py, bf16 eager unless
#   TORCH_MODES says e.g. "bf16 bf16:compile fp32"; "none": no PyTorch run), for SHAKESPEARE_STEPS
#   steps (default: the config's 5000), evaluating SHAKESPEARE_EVAL_ITERS batches (default 200),
#   FG_SET more --set arguments for fusegrad's runs, and a comparison table.
#   norm: TORCH_FLAGS are more flags for bench/norm_torch.py (e.g. --quick).
set -uo pipefail
out=${OUT:-gpu-out}
# The cuDNN frontend's headers that scripts/prepare_gpu.sh put in .gpu/ (cuDNN itself is in
# python3's site-packages there).
frontend=$PWD/.gpu/cudnn_frontend/include
if [ -z "${FG_CUDNN_FRONTEND_INCLUDE:-}" ] && [ -f "$frontend/cudnn_frontend.h" ]; then
    export FG_CUDNN_FRONTEND_INCLUDE=$frontend
fi
mkdir -p "$out"
what=${*:-all}
known="tests bench gemm attention norm ladder sanitize parity shakespeare seeds gpt2 gpt2text
       breakdown trace norm-profile nanogpt ddp phases python models overhead all build-only"
for step in $what; do
    case " $(echo $known) " in
        *" $step "*) ;;
        *) echo "gpu_check.sh: unknown step '$step' (steps: $(echo $known))" >&2; exit 2 ;;
    esac
done
status=0
# GPT-2 small timed on random ids (the gpt2, breakdown, trace, nanogpt and phases steps): one
# micro-batch a step, no evaluation and no checkpoint inside the run.
gpt2_timing="--set data.kind=random_tokens --set train.grad_accum=1
             --set train.eval_interval=100000 --set train.checkpoint_interval=100000"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DFG_PYTHON="$(command -v python3)" -DFG_TORCH_PYTHON="$(command -v python3)" \
    > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
# A warm machine keeps build-gpu/ from an earlier call, and ninja rebuilds what is older than
# its sources. The tree arrives with the build machine's modification times, which need not be
# later than that earlier build's (the clocks differ): every source whose content changed since
# the last build here is touched first, so nothing stale is linked with what was rebuilt.
hashes=build-gpu/source-hashes.txt
now=$(mktemp)
find CMakeLists.txt cmake core kernels layers models scale train cli text tests bench capi -type f \
    \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.def' \
       -o -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.in' \) -print0 2>/dev/null |
    sort -z | xargs -0 sha1sum > "$now"
if [ -f "$hashes" ]; then
    comm -13 <(sort "$hashes") <(sort "$now") | cut -c43- | while IFS= read -r f; do
        touch "$f"
    done
elif [ -f build-gpu/.ninja_log ]; then  # built before this check existed: trust nothing
    cut -c43- "$now" | while IFS= read -r f; do touch "$f"; done
fi
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 ||
    { tail -50 "$out/build.log"; exit 1; }
mv "$now" "$hashes"
started=$SECONDS
for step in $what; do
    # GPU_DEADLINE (seconds after the build): steps that would begin after it are skipped, so
    # that a call ends inside the device's per-command limit with its logs written.
    if [ -n "${GPU_DEADLINE:-}" ] && [ $((SECONDS - started)) -ge "$GPU_DEADLINE" ]; then
        echo "$step: skipped (GPU_DEADLINE ${GPU_DEADLINE} s reached)"; status=1; continue
    fi
    echo "$step: starting at $((SECONDS - started)) s" >> "$out/steps.log"
    case $step in
        tests|all)
            if [ -n "${GPU_TEST_FILTER:-}" ]; then  # a Catch2 filter: those GPU cases alone
                build-gpu/tests/fg_gpu_tests "$GPU_TEST_FILTER" --durations yes \
                    > "$out/tests.log" 2>&1 || status=1
                tail -3 "$out/tests.log"
            else
                ctest --test-dir build-gpu --output-on-failure -j8 > "$out/tests.log" 2>&1 ||
                    status=1
                grep -E "tests passed|Failed|Label|gpu  |cpu  " "$out/tests.log"
            fi
            ;;&
        bench|all)
            build-gpu/bench/bench_core --json "$out/bench_core.json" > "$out/bench_core.log" 2>&1 || status=1
            ;;&
        gemm)
            # GPT-2 small's linear layers alone through cuBLASLt: the step's GEMM-only ceiling
            # (GEMM_FLAGS, e.g. "--step-ms 32.3 --step-ms 120.6" to compare with measured steps;
            # "--algorithms 8 --calls": the fastest of 8 algorithms, and the step's own calls
            # with the heuristic's algorithm and autotuned).
            build-gpu/bench/bench_gemm ${GEMM_FLAGS:-} 2>&1 | tee "$out/bench_gemm.log" || status=1
            ;;&
        attention)
            build-gpu/bench/bench_attention --json "$out/bench_attention.json" 2>&1 \
                | tee "$out/bench_attention.log" | sed -n '/^group/,$p' || status=1
            ;;&
        norm|all)
            build-gpu/bench/bench_norm --json "$out/bench_norm.json" > "$out/bench_norm.log" 2>&1 || status=1
            PYTHONUNBUFFERED=1 python3 bench/norm_torch.py --json "$out/norm_torch.json" ${TORCH_FLAGS:-} \
                > "$out/norm_torch.log" 2>&1 || status=1
            python3 bench/norm_report.py "$out/bench_norm.json" "$out/norm_torch.json" > "$out/norm_table.md"
            cat "$out/norm_table.md"
            # bf16 rows again with bf16 weights, as PyTorch's run keeps them (like with like).
            build-gpu/bench/bench_norm --dtype bf16 --weights input --json "$out/bench_norm_bf16_weights.json" \
                > "$out/bench_norm_bf16_weights.log" 2>&1 || status=1
            python3 bench/norm_report.py "$out/bench_norm_bf16_weights.json" "$out/norm_torch.json" \
                > "$out/norm_table_bf16_weights.md"
            echo; echo "bf16 rows with bf16 weights:"; cat "$out/norm_table_bf16_weights.md"
            ;;&
        parity|all)
            ctest --test-dir build-gpu -L parity -V > "$out/parity.log" 2>&1 || status=1
            grep -E "^PyTorch|^parity:|FAIL" "$out/parity.log"
            ;;&
        shakespeare)
            # Run directories go to /tmp; $OUT gets the table, the picture and one tarball.
            steps=${SHAKESPEARE_STEPS:-5000} eval_iters=${SHAKESPEARE_EVAL_ITERS:-200}
            runs=/tmp/fg-shakespeare
            rm -rf "$runs" && mkdir -p "$runs"
            plots=()
            for precision in ${FG_PRECISIONS:-bf16}; do
                build-gpu/bin/fusegrad train configs/shakespeare_char.yaml \
                    --set data.path="$GPU_DATA/tinyshakespeare.txt" \
                    --set train.out_dir="$runs/fusegrad_$precision" --set train.precision="$precision" \
                    --set train.steps="$steps" --set train.eval_iters="$eval_iters" ${FG_SET:-} \
                    > "$runs/fusegrad_$precision.log" 2>&1 || status=1
                plots+=("fusegrad $precision=$runs/fusegrad_$precision/metrics.jsonl")
            done
            for mode in ${TORCH_MODES:-bf16}; do
                [ "$mode" = none ] && continue
                name=torch_${mode/:/_}
                flags="--mode ${mode%%:*}"
                [[ $mode == *:compile ]] && flags="$flags --compile"
                python3 bench/train_torch.py configs/shakespeare_char.yaml "$runs/$name" $flags \
                    --data "$GPU_DATA/tinyshakespeare.txt" --steps "$steps" --eval-iters "$eval_iters" \
                    > "$runs/$name.log" 2>&1 || status=1
                plots+=("PyTorch $mode=$runs/$name/metrics.jsonl")
            done
            build-gpu/bin/fusegrad plot "$out/loss_curves.svg" "${plots[@]}" \
                --title "shakespeare_char: fusegrad and PyTorch" || status=1
            python3 bench/train_report.py "$runs" | tee "$out/train_table.md"
            (cd "$runs" && tar czf "$out/shakespeare_runs.tar.gz" --exclude='*.safetensors' .)
            ;;&
        seeds)
            # Seed-to-seed spread: fusegrad (the config's precision, bf16) and PyTorch (bf16
            # autocast, eager; SEED_TORCH_MODE=fp32 for the fp32 baseline) with SEEDS (default
            # "1337 1 2"), each stopped at SEED_STEPS (default 2250) of the 5000-step schedule.
            runs=/tmp/fg-seeds
            rm -rf "$runs" && mkdir -p "$runs"
            for seed in ${SEEDS:-1337 1 2}; do
                build-gpu/bin/fusegrad train configs/shakespeare_char.yaml --max-steps "${SEED_STEPS:-2250}" \
                    --set data.path="$GPU_DATA/tinyshakespeare.txt" --set train.out_dir="$runs/fusegrad_$seed" \
                    --set train.seed="$seed" > "$runs/fusegrad_$seed.log" 2>&1 || status=1
                python3 bench/train_torch.py configs/shakespeare_char.yaml "$runs/torch_$seed" --seed "$seed" \
                    --mode "${SEED_TORCH_MODE:-bf16}" \
                    --data "$GPU_DATA/tinyshakespeare.txt" --steps "${SEED_STEPS:-2250}" \
                    > "$runs/torch_$seed.log" 2>&1 || status=1
            done
            for f in "$runs"/*/metrics.jsonl; do
                echo "$(basename "$(dirname "$f")"): $(grep val_loss "$f" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
print(" ".join("%d:%.4f" % (r["step"], r["val_loss"]) for r in rows), " best %.4f" % min(r["val_loss"] for r in rows))')"
            done | tee "$out/seeds.txt"
            ;;&
        gpt2)
            # GPT-2 small (configs/gpt2_124m.yaml) on random tokens, no files needed: fusegrad with
            # the captured step and without, at 16 x 1024 (and GPT2_BATCHES more, e.g. "64"), then
            # PyTorch bf16 + torch.compile at 16 x 1024; median over steps 11-40.
            g=$(echo $gpt2_timing)
            for run in 16:true 16:false $(for b in ${GPT2_BATCHES:-}; do echo "$b:true"; done); do
                b=${run%%:*} graph=${run##*:} dir=/tmp/fg-gpt2-$b-$graph
                rm -rf "$dir"
                build-gpu/bin/fusegrad train configs/gpt2_124m.yaml $g --set train.batch_size="$b" \
                    --set kernels.cuda_graph="$graph" --set train.out_dir="$dir" --max-steps 40 \
                    > "$out/gpt2_${b}_$graph.log" 2>&1 || status=1
                python3 - "$dir/metrics.jsonl" "fusegrad $b x 1024, cuda_graph=$graph" <<'PY' || status=1
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
late = [r for r in rows if r["step"] > 10]
print("%s: %.2f ms/step, %d tokens/s, MFU %.1f%%, peak %.0f MiB" % (sys.argv[2],
      statistics.median(r["ms"] for r in late), statistics.median(r["tokens_per_s"] for r in late),
      100 * statistics.median(r["mfu"] for r in late), late[-1]["peak_mem_mib"]))
PY
            done
            python3 bench/train_torch.py configs/gpt2_124m.yaml /tmp/fg-gpt2-torch --mode bf16 --compile \
                --steps 40 --eval-iters 1 $g > "$out/gpt2_torch_compile.log" 2>&1 || status=1
            tail -1 "$out/gpt2_torch_compile.log"
            ;;&
        breakdown)
            # Nsight Compute's time for every kernel of a few GPT-2 small steps (16 x 1024, launched
            # eagerly so that each kernel is seen as the step launches it), summed by kernel name.
            # The window skips the first steps' launches (BREAKDOWN_SKIP) and spans several steps
            # (BREAKDOWN_COUNT), well inside the run's 16 steps whatever a step launches (a fused
            # op changes that); kernel_times.py counts the steps by AdamW's launches, so a
            # partial step at either edge weighs little.
            rm -rf /tmp/fg-breakdown
            ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
                --launch-skip "${BREAKDOWN_SKIP:-2200}" --launch-count "${BREAKDOWN_COUNT:-3000}" \
                build-gpu/bin/fusegrad train configs/gpt2_124m.yaml $gpt2_timing \
                --set kernels.cuda_graph=false --set train.out_dir=/tmp/fg-breakdown --max-steps 16 > "$out/breakdown.csv" \
                2> "$out/breakdown.err" || status=1
            # AdamW: one launch a kMaxTensorsPerLaunch (24) of GPT-2's 148 parameter tensors.
            python3 bench/kernel_times.py "$out/breakdown.csv" --top 30 --per-step-kernel adamw_kernel \
                --per-step-count 7 | tee "$out/breakdown.md"
            ;;&
        trace)
            # In-run kernel times: GPT-2 small's captured step on random tokens at 16 x 1024 (and
            # TRACE_BATCHES more, e.g. "64"), 60 steps, under libfg_kernel_trace.so (a CUPTI
            # injection library: every kernel timed as it runs, graphs included, at the clock the
            # card holds while busy), and with NANOGPT_DIR nanoGPT's compiled step at the same
            # batches (bench/nanogpt_gpt2.py, 50 steps) under the same library; the card's SM
            # clock, power and throttle reasons sampled alongside (trace_clocks.csv), summed for
            # each run. The window: steps 21-50 (fusegrad) and 21-45 (nanoGPT), told apart by a
            # kernel that runs once a step (fusegrad's one-pass loss kernel, which a bf16 GPT-2
            # row fits; TRACE_NANOGPT_MARKER: Inductor's name for nanoGPT's loss kernel).
            lib=$PWD/build-gpu/bench/libfg_kernel_trace.so
            if [ ! -f "$lib" ]; then
                echo "trace: $lib was not built (CMake found no CUPTI)"; status=1
            else
                query=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu
                nvidia-smi --query-gpu=$query,clocks_event_reasons.active --format=csv,noheader \
                    -lms 250 > "$out/trace_clocks.csv" 2>&1 &
                sampler=$!
                : > "$out/trace_runs.txt"  # a line a run: its label, start and end (epoch seconds)
                for b in 16 ${TRACE_BATCHES:-}; do
                    dir=/tmp/fg-trace-$b && rm -rf "$dir" "$dir.txt"
                    start=$(date +%s.%N)
                    FG_KERNEL_TRACE_OUT=$dir.txt CUDA_INJECTION64_PATH=$lib build-gpu/bin/fusegrad \
                        train configs/gpt2_124m.yaml $gpt2_timing --set train.batch_size="$b" \
                        --set train.out_dir="$dir" --max-steps 60 \
                        > "$out/trace_fusegrad_$b.log" 2>&1 || status=1
                    echo "fusegrad_$b $start $(date +%s.%N)" >> "$out/trace_runs.txt"
                    python3 bench/kernel_trace_report.py "$dir.txt" --skip 20 --steps 30 \
                        --marker cross_entropy_one_pass_kernel --label "fusegrad, $b x 1024" |
                        tee "$out/trace_fusegrad_$b.md" || status=1
                    if [ -n "${NANOGPT_DIR:-}" ]; then
                        trace=/tmp/nanogpt-trace-$b.txt && rm -f "$trace"
                        start=$(date +%s.%N)
                        FG_KERNEL_TRACE_OUT=$trace CUDA_INJECTION64_PATH=$lib \
                            python3 bench/nanogpt_gpt2.py "$NANOGPT_DIR" --batch "$b" --steps 50 \
                            > "$out/trace_nanogpt_$b.log" 2>&1 || status=1
                        echo "nanogpt_$b $start $(date +%s.%N)" >> "$out/trace_runs.txt"
                        tail -1 "$out/trace_nanogpt_$b.log"
                        python3 bench/kernel_trace_report.py "$trace" --skip 20 --steps 25 \
                            --marker "${TRACE_NANOGPT_MARKER:-prepare_softmax_online}" \
                            --label "nanoGPT model.py, $b x 1024" |
                            tee "$out/trace_nanogpt_$b.md" || status=1
                    fi
                done
                kill "$sampler"; wait "$sampler" 2>/dev/null
                # Each run's samples while the card drew more than 300 W (a run's first step,
                # autotuning and capture included): the SM clock, the power, and how often the
                # power cap held the clock down (throttle reason bit 0x4).
                python3 - "$out/trace_clocks.csv" "$out/trace_runs.txt" <<'PY' || status=1
import csv, datetime, statistics, sys
samples = []
for r in csv.reader(open(sys.argv[1])):
    try:
        t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(r[1].split()[0]), float(r[2].split()[0]), int(r[5], 16)))
    except (IndexError, ValueError):
        pass  # a header, an error line or a line cut short
for line in open(sys.argv[2]):
    label, start, end = line.split()
    busy = [s for s in samples if float(start) <= s[0] <= float(end) and s[2] > 300]
    if busy:
        capped = sum(s[3] & 4 != 0 for s in busy) / len(busy)
        print("%s: %d samples over 300 W, SM clock median %.0f MHz, power median %.0f W, "
              "power-capped in %.0f%%" % (label, len(busy), statistics.median(s[1] for s in busy),
                                           statistics.median(s[2] for s in busy), 100 * capped))
PY
            fi
            ;;&
        nanogpt)
            if [ -z "${NANOGPT_DIR:-}" ]; then
                echo "nanogpt: set NANOGPT_DIR to a nanoGPT checkout"; status=1
            else
                n=${NANOGPT_STEPS:-300} dir=/tmp/fg-nanogpt-fusegrad
                rm -rf "$dir"
                build-gpu/bin/fusegrad train configs/shakespeare_char.yaml --max-steps "$n" \
                    --set data.path="$GPU_DATA/tinyshakespeare.txt" --set train.out_dir="$dir" \
                    --set train.eval_interval=100000 > "$out/nanogpt_fusegrad.log" 2>&1 || status=1
                python3 - "$dir/metrics.jsonl" <<'PY' || status=1
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
late = [r for r in rows if r["step"] > 10]
print("fusegrad bf16: %.2f ms/step, peak %.0f MiB, loss %.4f" % (
    statistics.median(r["ms"] for r in late), late[-1]["peak_mem_mib"], rows[-1]["loss"]))
PY
                python3 bench/nanogpt_baseline.py "$NANOGPT_DIR" "$GPU_DATA/tinyshakespeare.txt" \
                    --steps "$n" --json "$out/nanogpt.json" || status=1
                # GPT-2 small, 16 x 1024 random tokens a step: fusegrad, then nanoGPT's model.py.
                dir=/tmp/fg-nanogpt-gpt2 && rm -rf "$dir"
                build-gpu/bin/fusegrad train configs/gpt2_124m.yaml $gpt2_timing --max-steps 40 \
                    --set train.out_dir="$dir" > "$out/nanogpt_gpt2_fusegrad.log" 2>&1 || status=1
                python3 - "$dir/metrics.jsonl" <<'PY' || status=1
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
late = [r for r in rows if r["step"] > 10]
print("fusegrad GPT-2 small: %.2f ms/step, peak %.0f MiB" % (
    statistics.median(r["ms"] for r in late), late[-1]["peak_mem_mib"]))
PY
                python3 bench/nanogpt_gpt2.py "$NANOGPT_DIR" --json "$out/nanogpt_gpt2.json" || status=1
            fi
            ;;&
        gpt2text)
            if [ -z "${NANOGPT_DIR:-}" ]; then
                echo "gpt2text: set NANOGPT_DIR to a nanoGPT checkout"; status=1
            else
                python3 bench/gpt2_text_proof.py --fusegrad build-gpu/bin/fusegrad \
                    --nanogpt "$NANOGPT_DIR" --text "$GPU_DATA/tinyshakespeare.txt" \
                    --work "${PROOF_WORK:-$(mktemp -d -u /tmp/fg-gpt2-text.XXXXXX)}" --out "$out" \
                    --seeds ${PROOF_SEEDS:-1 2 3} > "$out/gpt2_text_proof.log" 2>&1 || status=1
                tail -40 "$out/gpt2_text_proof.log"
            fi
            ;;
        ddp)
            export NCCL_NVLS_ENABLE=0
            if [ "${DDP_TEST:-1}" = 1 ]; then
                bash tests/distributed_gpu.sh build-gpu/bin/fusegrad \
                    > "$out/distributed_gpu.log" 2>&1 || status=1
                tail -1 "$out/distributed_gpu.log"
            fi
            have=$(nvidia-smi -L | grep -c '^GPU')
            # Every rank waits for the slowest at each exchange, so one card in thermal slowdown
            # bounds them all: each card's temperature, SM clock and slowdown reasons are sampled
            # every 2 s through the runs and summarised after the table.
            nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,clocks_throttle_reasons.active \
                --format=csv,noheader,nounits -lms 2000 > "$out/clocks.csv" 2>/dev/null &
            clock_watch=$!
            runs=/tmp/fg-ddp
            rm -rf "$runs" && mkdir -p "$runs"
            for model in ${DDP_MODELS:-baby gpt2}; do
                if [ "$model" = baby ]; then  # 64 x 256 a GPU, 100 steps
                    cfg=configs/shakespeare_char.yaml per_gpu=64 steps=100
                    sets="--set data.path=$GPU_DATA/tinyshakespeare.txt"
                    tsets="--data $GPU_DATA/tinyshakespeare.txt"
                else  # GPT-2 small, DDP_GPT2_BATCH (16) x 1024 random tokens a GPU, 40 steps
                    cfg=configs/gpt2_124m.yaml per_gpu=${DDP_GPT2_BATCH:-16} steps=40
                    sets="--set data.kind=random_tokens --set train.grad_accum=1" tsets=$sets
                fi
                common="--set train.eval_interval=100000 --set train.checkpoint_interval=100000"
                for n in ${DDP_GPUS:-1 2 4 8}; do
                    [ "$n" -le "$have" ] || continue
                    b=$((per_gpu * n))
                    # ZeRO off and on (bf16 sums: train.exchange_dtype auto), and off with f32
                    # sums as PyTorch DDP sends them.
                    for variant in ${DDP_VARIANTS:-zero0:auto zero1:auto f32sums:f32}; do
                        name=${variant%%:*} wire=${variant##*:} zero=0
                        [ "$name" = zero1 ] && zero=1
                        dir=$runs/fusegrad-${name}_${model}_$n
                        if [ "$n" = 1 ] && [ "$name" != zero0 ]; then  # one rank: the same run
                            ln -sfn "$runs/fusegrad-zero0_${model}_1" "$dir"
                            continue
                        fi
                        build-gpu/bin/fusegrad train $cfg $sets $common --set train.batch_size=$b \
                            --set train.zero=$zero --set train.exchange_dtype=$wire \
                            --set train.out_dir="$dir" --max-steps $steps --ranks "$n" \
                            > "$dir.log" 2>&1 || { status=1; tail -5 "$dir.log"; }
                        echo "$(date +%T) fusegrad $name $model on $n GPU(s): $(grep -c '"ms"' \
                            "$dir/metrics.jsonl" 2>/dev/null) steps"
                    done
                    if [ "$model" = gpt2 ] && [ -n "${NANOGPT_DIR:-}" ]; then
                        # nanoGPT's own model.py under DDP + torch.compile: the anchor's figure.
                        PYTHONUNBUFFERED=1 python3 -m torch.distributed.run --standalone \
                            --nproc_per_node "$n" bench/nanogpt_gpt2.py "$NANOGPT_DIR" \
                            --batch "$per_gpu" --steps "$steps" \
                            > "$runs/nanogpt_${model}_$n.log" 2>&1 || status=1
                        echo "$(date +%T) nanoGPT model.py DDP $model on $n GPU(s):" \
                             "$(tail -1 "$runs/nanogpt_${model}_$n.log")"
                    else  # the project's own harness (a parity tool) where no anchor is carried
                        PYTHONUNBUFFERED=1 python3 -m torch.distributed.run --standalone \
                            --nproc_per_node "$n" bench/train_torch.py $cfg \
                            "$runs/torch-ddp-compile_${model}_$n" --mode bf16 --compile \
                            --steps $steps --eval-iters 1 $tsets $common --set train.batch_size=$b \
                            > "$runs/torch_${model}_$n.log" 2>&1 \
                            || { status=1; tail -5 "$runs/torch_${model}_$n.log"; }
                        echo "$(date +%T) PyTorch DDP $model on $n GPU(s):" \
                             "$(tail -1 "$runs/torch_${model}_$n.log")"
                    fi
                done
            done
            python3 bench/scaling_report.py "$runs" | tee "$out/scaling.md"
            kill -INT "$clock_watch" 2>/dev/null; wait "$clock_watch" 2>/dev/null
            python3 - "$out/clocks.csv" <<'PY' | tee -a "$out/scaling.md"
import collections, sys
cards = collections.defaultdict(list)  # index: (temperature C, SM MHz, slowdown reasons)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    if len(f) == 4 and f[0].isdigit() and f[1].isdigit() and f[2].isdigit():
        try:
            sample = (int(f[1]), int(f[2]), int(f[3], 16))
        except ValueError:  # "[N/A]", or a line cut short when the sampler stopped
            continue
        cards[int(f[0])].append(sample)
if not cards:
    print("no clock samples (nvidia-smi's query failed?)")
for i, s in sorted(cards.items()):
    thermal = sum(1 for _, _, r in s if r & 0x60)  # 0x20 software, 0x40 hardware thermal slowdown
    busy = [mhz for _, mhz, r in s if not r & 0x1] or [0]  # 0x1: the card was idle
    capped = sum(1 for _, _, r in s if not r & 0x1 and r & 0x4)  # 0x4: held to its power cap
    print("GPU %d: %d samples, up to %d C, SM clock %d-%d MHz while busy (at its power cap in %d "
          "of those)%s" % (i, len(s), max(t for t, _, _ in s), min(busy), max(busy), capped,
                           ", THERMAL SLOWDOWN in %d samples: its ranks' figures are bounded by "
                           "it" % thermal if thermal else ""))
PY
            (cd "$runs" && tar czf "$out/ddp_runs.tar.gz" --exclude='*.safetensors' .)
            ;;&
        phases)
            # Where a GPT-2 small step's GPU time goes (train.phase_times: eager steps, 16 x 1024
            # random tokens a GPU, 40 steps), on one GPU and on PHASE_GPUS ranks (default: all of
            # the machine's), for each of PHASE_VARIANTS (';'-separated; each a list of config
            # settings and NCCL_* or CUDA_* environment variables, e.g.
            # "train.bucket_mb=1000;train.exchange_dtype=f32;NCCL_MAX_CTAS=8"; the default first).
            export NCCL_NVLS_ENABLE=0
            have=$(nvidia-smi -L | grep -c '^GPU')
            IFS=';' read -r -a variants <<< ";${PHASE_VARIANTS:-}"
            : > "$out/phases.txt"
            # One GPU, then each count asked for (once each, none beyond the machine's).
            for n in $(printf '%s\n' 1 ${PHASE_GPUS:-$have} | awk '!seen[$0]++'); do
                if [ "$n" -gt "$have" ]; then
                    echo "phases: $n GPUs asked, $have here"; status=1; continue
                fi
                for variant in "${variants[@]}"; do
                    [ "$n" = 1 ] && [ -n "$variant" ] && continue  # variants are the ranks'
                    envs=() sets=()
                    for word in $variant; do
                        case $word in
                            NCCL_*|CUDA_*) envs+=("$word") ;;
                            *) sets+=(--set "$word") ;;
                        esac
                    done
                    dir=/tmp/fg-phases-$n-$(echo "$variant" | tr -c 'A-Za-z0-9_.=\n' '_')
                    rm -rf "$dir"
                    env "${envs[@]}" build-gpu/bin/fusegrad train configs/gpt2_124m.yaml \
                        $gpt2_timing --set train.phase_times=true --set train.batch_size=$((16 * n)) \
                        --set train.out_dir="$dir" --max-steps 40 --ranks "$n" "${sets[@]}" \
                        > "$dir.log" 2>&1 || { status=1; tail -5 "$dir.log"; }
                    cp "$dir.log" "$out/phases-$n-$(basename "$dir").log" 2>/dev/null
                    echo "$n GPU(s) ${variant:-default}: $(grep '^phase times' "$dir.log" |
                        sed 's/.*GPU ms): //')" | tee -a "$out/phases.txt"
                done
            done
            ;;&
        python)
            # The PyTorch package's tests against this build's library, the GPU ones required.
            FUSEGRAD_TEST_PYTHON=${FUSEGRAD_TEST_PYTHON:-python3} FUSEGRAD_REQUIRE_GPU=1 \
                bash scripts/test_python.sh build-gpu > "$out/python.log" 2>&1 || status=1
            tail -1 "$out/python.log"
            ;;&
        models)
            # Real models' training step as written, with fusegrad.patch and with Liger's norms.
            if [ -z "${NANOGPT_DIR:-}" ]; then
                echo "models: set NANOGPT_DIR to a nanoGPT checkout"; status=1
            else
                FUSEGRAD_TORCH_LIBRARY=$PWD/build-gpu/capi/libfusegrad_torch.so \
                PYTHONPATH=$PWD/python python3 bench/norm_torch_models.py --nanogpt "$NANOGPT_DIR" \
                    ${LIGER_SRC:+--liger "$LIGER_SRC"} ${MODELS_FLAGS:-} --json "$out/models.json" \
                    > "$out/models.log" 2>&1 || status=1
                sed -n '/^| model/,$p' "$out/models.log"
            fi
            ;;&
        overhead)
            # Host against GPU time of the norms called from PyTorch, and a profile of the host.
            FUSEGRAD_TORCH_LIBRARY=$PWD/build-gpu/capi/libfusegrad_torch.so PYTHONPATH=$PWD/python \
                python3 bench/norm_torch_overhead.py --profile 200 ${LIGER_SRC:+--liger "$LIGER_SRC"} \
                > "$out/overhead.log" 2>&1 ||
                status=1
            grep "^|" "$out/overhead.log"
            ;;&
        ladder)
            # Every rung of the norm ladder beside the tuned kernels (docs/norms.md section 3).
            build-gpu/bench/bench_norm --kernel ladder ${LADDER_FLAGS:-} --json "$out/ladder.json" \
                > "$out/ladder.log" 2>&1 || status=1
            grep -v "^bench_norm\|^wrote" "$out/ladder.log" | head -400
            ;;
        norm-profile)
            # Nsight Compute on the tuned norm kernels at the widths the project trains
            # (PROFILE_SHAPES, default 16384x384 16384x768; PROFILE_NORMS, default layernorm; bf16),
            # the 4th launch of each, clocks as the benchmark runs them: (1) the launch, occupancy,
            # speed-of-light, memory and warp-state sections with ncu's own clean L2 flush; (2) the
            # DRAM bytes read and written after the benchmark's own flush (ncu leaves the cache as
            # the benchmark left it: dirty lines of the flush buffer are written back during the
            # kernel); then bench_norm at the same shapes for the times.
            for shape in ${PROFILE_SHAPES:-16384x384 16384x768}; do
                for norm in ${PROFILE_NORMS:-layernorm}; do
                    for kernel in norm_forward_kernel norm_backward_staged_kernel; do
                        run="build-gpu/bench/bench_norm --shape $shape --dtype bf16 --norm $norm"
                        name=$out/profile_${norm}_${shape}_$kernel
                        ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 \
                            --launch-count 1 --section LaunchStats --section Occupancy \
                            --section SpeedOfLight --section MemoryWorkloadAnalysis \
                            --section WarpStateStats --section SchedulerStats $run \
                            > "$name.txt" 2>&1 || status=1
                        ncu --clock-control none --cache-control none --kernel-name "regex:$kernel" \
                            --launch-skip 3 --launch-count 1 --csv --print-units base --metrics \
                            gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
                            $run > "$name.dirty.csv" 2>&1 || status=1
                        echo "$norm $shape $kernel:"
                        grep -E "^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Waves Per SM|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued|Eligible Warps|Dynamic Shared)" \
                            "$name.txt" | sed 's/^ */  /'
                        grep -E "dram__bytes|gpu__time" "$name.dirty.csv" |
                            awk -F'","' '{print "  after the benchmark flush: " $(NF-2) " " $NF}' | tr -d '"'
                    done
                done
            done
            build-gpu/bench/bench_norm --dtype bf16 $(for s in ${PROFILE_SHAPES:-16384x384 16384x768}; do
                echo "--shape $s"; done) --sweep --columns "auto" > "$out/profile_bench.log" 2>&1 ||
                status=1
            grep -E "%|copy" "$out/profile_bench.log" | head -40
            ;;
        sanitize|all)
            # Norm cases capped at 2^20 elements so both tools finish in minutes; both in parallel.
            for tool in memcheck racecheck; do
                # SANITIZE_FILTER: a Catch2 filter (names with spaces, comma-separated), one word.
                FG_NORM_TEST_MAX_ELEMS=${FG_NORM_TEST_MAX_ELEMS:-1048576} compute-sanitizer \
                    --tool $tool --error-exitcode 9 build-gpu/tests/fg_gpu_tests \
                    ${SANITIZE_FILTER:+"$SANITIZE_FILTER"} > "$out/sanitize-$tool.log" 2>&1 &
            done
            wait
            for tool in memcheck racecheck; do
                grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$out/sanitize-$tool.log" || status=1
                echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|All tests passed|test cases' "$out/sanitize-$tool.log" | tr '\n' ' ')"
            done
            ;;
    esac
done
[ -f "$out/bench_core.log" ] && sed -n '/^group/,$p' "$out/bench_core.log" | head -30
# The device returns at most 8 files from $OUT: past that, everything goes into one tarball.
if [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
    tar czf /tmp/gpu_check_logs.tgz -C "$out" . && find "$out" -mindepth 1 -delete &&
        mv /tmp/gpu_check_logs.tgz "$out/logs.tgz"
fi
exit $status
