#!/usr/bin/env bash
# tests/gpu_energy_check.sh PYTHON SOURCE_DIR: bench/gpu_energy.py's windows and summary on
# made-up samples, then the tool itself: where NVML cannot be used (CI's machines) it says so and
# fails; where it can (the GPU machine) it measures the two windows a command marks.
#
# The samples, every 20 ms for 4 s: at rest (300 W, 6 J a sample, 1980 MHz), then samples 50-149
# working, where the power climbs by 1 W a sample from 650 W (the energy counter adds what that
# power spends in 20 ms) and the clock falls by 1 MHz a sample from 1600 MHz; sample 150 at
# exactly 350 W, which is not over it; then at rest.
set -euo pipefail
python=$1 src=$2
"$python" - "$src/bench" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from gpu_energy import summary, windows

rows, energy = [], 0
for i in range(200):
    watts, mhz = (650 + (i - 50), 1600 - (i - 50)) if 50 <= i < 150 else (300, 1980)
    if i == 150:
        watts = 350
    energy += watts * 20  # mJ in 20 ms
    rows.append((i * 0.02, energy, watts * 1000, mhz))
# No marks: the middle 60% of the hot span (samples 50 to 149; 150 is not over 350 W): 69 to 130.
assert windows(rows, []) == [(69, 130)], windows(rows, [])
line = summary(rows, windows(rows, [])[0], "made-up")
# 61 samples' energy after sample 69 (samples 70-130: 670-730 W, mean 700) over 1.22 s; the 62
# samples 69-130 sorted (669-730 W, 1520-1581 MHz): power median 700 W (index 31), clock median
# 1551, p10 1526 (index 6), p90 1575 (index 55).
want = ("made-up: energy 854.0 J over 1.22 s: mean power 700.0 W (sampled median 700 W); "
        "SM clock median 1551 MHz (p10 1526, p90 1575)")
assert line == want, line
# Marks: one window a start-stop pair; a second start while one is open, a stop with none open
# and a start never closed are ignored; a pair around a single sample is too short (None).
marks = [(0.5, "stop"), (1.1, "start"), (1.2, "start"), (1.5, "stop"), (2.0, "start"),
         (2.01, "stop"), (3.0, "start")]
assert windows(rows, marks) == [(55, 75), None], windows(rows, marks)
line = summary(rows, windows(rows, marks)[0])
# Samples 56-75 (656-675 W, 20 x 20 ms): 266.2 J over 0.40 s; of the 21 samples 55-75, the
# medians 665 W and 1585 MHz, p10 1577 and p90 1593 MHz.
assert line == ("energy 266.2 J over 0.40 s: mean power 665.5 W (sampled median 665 W); "
                "SM clock median 1585 MHz (p10 1577, p90 1593)"), line
# Only stops, or too few hot samples: nothing to measure.
assert windows(rows, [(1.0, "stop")]) == [(69, 130)]  # no start: the hot span
assert windows(rows[:55], []) == []
print("windows and summary: ok")
PY
out=$("$python" "$src/bench/gpu_energy.py" 2>&1) && { echo "no command was accepted" >&2; exit 1; }
grep -q "no command given" <<< "$out" || { echo "missing refusal: $out" >&2; exit 1; }
set +e
two_windows='echo before; for w in 1 2; do echo "energy: start"; sleep 0.5; echo "energy: stop"'
two_windows+='; done'
out=$("$python" "$src/bench/gpu_energy.py" --label marked -- sh -c "$two_windows" 2>&1)
status=$?
set -e
echo "$out"
if grep -qE "^gpu_energy: cannot (load|use) NVML" <<< "$out"; then
    [ "$status" -ne 0 ] || { echo "exit status 0 without NVML" >&2; exit 1; }
else  # a GPU machine: the command's output, then each window's energy
    [ "$status" -eq 0 ] || { echo "exit status $status" >&2; exit 1; }
    grep -q "^before$" <<< "$out" || { echo "the command's output is missing" >&2; exit 1; }
    for w in 1 2; do
        grep -qE "^marked \(window $w\): energy [0-9.]+ J over 0\.[3-6][0-9] s: mean power" \
            <<< "$out" || { echo "missing window $w's summary" >&2; exit 1; }
    done
fi
# The whole tool on CI's machines too, against a stand-in NVML (a card at a steady 500 W and
# 1500 MHz whose energy counter runs with the clock; FAKE_NVML=init or energy makes that call
# fail): both marked windows at 500 W, then each refusal with its message.
fake=$(mktemp -d /tmp/fg_fake_nvml.XXXXXX)
trap 'rm -rf "$fake"' EXIT
cat > "$fake/nvml.c" <<'C'
#include <stdlib.h>
#include <string.h>
#include <time.h>
static int fails(const char* what) {
    const char* f = getenv("FAKE_NVML");
    return f && strcmp(f, what) == 0;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int nvmlInit_v2(void) { return fails("init") ? 1 : 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** h) { *h = (void*)1; return i == 0 ? 0 : 2; }
int nvmlDeviceGetTotalEnergyConsumption(void* h, unsigned long long* mj) {
    (void)h;
    *mj = (unsigned long long)(now() * 500000.0);
    return fails("energy") ? 3 : 0;
}
int nvmlDeviceGetPowerUsage(void* h, unsigned* mw) { (void)h; *mw = 500000; return 0; }
int nvmlDeviceGetClockInfo(void* h, int kind, unsigned* mhz) {
    (void)h;
    *mhz = 1500;
    return kind == 1 ? 0 : 2;
}
C
if cc -shared -fPIC -o "$fake/libnvidia-ml.so.1" "$fake/nvml.c" 2> "$fake/cc.log"; then
    out=$(LD_LIBRARY_PATH="$fake" "$python" "$src/bench/gpu_energy.py" --label fake -- \
          sh -c "$two_windows")
    echo "$out"
    for w in 1 2; do
        grep -qE "^fake \(window $w\): energy [0-9.]+ J over 0\.[3-6][0-9] s: mean power "\
"(49[5-9]|50[0-5])\.[0-9] W \(sampled median 500 W\); SM clock median 1500 MHz" <<< "$out" ||
            { echo "missing the stand-in's window $w" >&2; exit 1; }
    done
    # refuses NAME STATUS MESSAGE ENV-AND-ARGS...: the tool with the stand-in exits with STATUS
    # (any non-zero: "nonzero") and prints MESSAGE on stderr.
    refuses() {
        local name=$1 want=$2 message=$3 status
        shift 3
        set +e
        env LD_LIBRARY_PATH="$fake" "$@" > /dev/null 2> "$fake/err"
        status=$?
        set -e
        if [ "$want" = nonzero ]; then [ "$status" -ne 0 ]; else [ "$status" -eq "$want" ]; fi ||
            { echo "$name: exit status $status" >&2; exit 1; }
        grep -qF "$message" "$fake/err" ||
            { echo "$name: missing '$message' in: $(cat "$fake/err")" >&2; exit 1; }
    }
    tool="$src/bench/gpu_energy.py"
    refuses "no GPU 1" nonzero "gpu_energy: cannot use NVML: it has no GPU 1" \
        "$python" "$tool" --gpu 1 -- true
    refuses "init fails" nonzero "gpu_energy: cannot use NVML: nvmlInit failed" \
        FAKE_NVML=init "$python" "$tool" -- true
    refuses "no energy counter" nonzero "gpu_energy: cannot use NVML: GPU 0 has no energy counter" \
        FAKE_NVML=energy "$python" "$tool" -- true
    refuses "no such command" nonzero "gpu_energy: cannot run /nonexistent/command:" \
        "$python" "$tool" -- /nonexistent/command
    refuses "unmarked and short" 1 \
        "gpu_energy: nothing to measure for short: no start and stop lines, and too few" \
        "$python" "$tool" --label short -- true
    refuses "never stopped" 1 "gpu_energy: nothing to measure: no 'energy: stop' line after" \
        "$python" "$tool" -- sh -c 'echo "energy: start"'
    refuses "too short a window" 1 "gpu_energy: brief: window too short to measure" \
        "$python" "$tool" --label brief -- sh -c 'echo "energy: start"; echo "energy: stop"'
    refuses "the command's own failure" 3 "" "$python" "$tool" -- sh -c 'exit 3'
    # A command ended by SIGTERM: its status as a shell gives it (128 + 15).
    set +e
    LD_LIBRARY_PATH="$fake" "$python" "$src/bench/gpu_energy.py" -- sh -c 'kill -TERM $$' \
        2> /dev/null
    status=$?
    set -e
    [ "$status" -eq 143 ] || { echo "a command ended by SIGTERM gave status $status" >&2; exit 1; }
else
    echo "no C compiler: the stand-in NVML was skipped ($(head -1 "$fake/cc.log"))"
fi
echo "gpu_energy.py: ok"
