#!/usr/bin/env bash
# tests/gpu_energy_check.sh PYTHON SOURCE_DIR: bench/gpu_energy.py's window and summary on
# made-up samples (every 20 ms: the energy counter 6 J a sample at rest, 14 J while working, that
# is 300 and 700 W; the clock 1980 and 1500 MHz), then the tool itself: without NVML (CI's
# machines) it says so; with it (the GPU machine) it measures a command's marked window.
set -euo pipefail
python=$1 src=$2
"$python" - "$src/bench" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from gpu_energy import summary, window

rows, energy = [], 0
for i in range(200):  # 4 s: at rest, 2 s of work from sample 50 to 149, at rest
    hot = 50 <= i < 150
    energy += 14_000 if hot else 6_000
    rows.append((i * 0.02, energy, 700_000 if hot else 300_000, 1500 if hot else 1980))
# No marks: the middle 60% of the hot span (samples 50 to 149), samples 69 to 130.
assert window(rows, []) == (69, 130), window(rows, [])
line = summary(rows, window(rows, []), "made-up")
assert line == ("made-up: energy 854.0 J over 1.22 s: mean power 700.0 W (sampled median 700 W); "
                "SM clock median 1500 MHz (p10 1500, p90 1500)"), line
# Marks: the samples between the first start and the first stop after it, at rest included.
marks = [(0.5, "start"), (1.0, "stop"), (2.0, "start"), (3.0, "stop")]
assert window(rows, marks) == (25, 50), window(rows, marks)
line = summary(rows, window(rows, marks))
assert line == ("energy 158.0 J over 0.50 s: mean power 316.0 W (sampled median 300 W); "
                "SM clock median 1980 MHz (p10 1980, p90 1980)"), line
# A start with no stop after it, and too few hot samples, leave nothing to measure.
assert window(rows, [(1.0, "stop"), (2.0, "start")]) is None
assert window(rows[:55], []) is None
print("window and summary: ok")
PY
out=$("$python" "$src/bench/gpu_energy.py" 2>&1) && { echo "no command was accepted" >&2; exit 1; }
grep -q "no command given" <<< "$out" || { echo "missing refusal: $out" >&2; exit 1; }
set +e
out=$("$python" "$src/bench/gpu_energy.py" --label marked -- \
      sh -c 'echo before; echo "energy: start"; sleep 0.5; echo "energy: stop"' 2>&1)
status=$?
set -e
echo "$out"
if grep -q "cannot load NVML" <<< "$out"; then
    [ "$status" -ne 0 ] || { echo "exit status 0 without NVML" >&2; exit 1; }
else  # a GPU machine: the command's output, then the window's energy
    [ "$status" -eq 0 ] || { echo "exit status $status" >&2; exit 1; }
    grep -q "^before$" <<< "$out" || { echo "the command's output is missing" >&2; exit 1; }
    grep -qE "^marked: energy [0-9.]+ J over 0\.[3-6][0-9] s: mean power" <<< "$out" ||
        { echo "missing the marked window's summary" >&2; exit 1; }
fi
echo "gpu_energy.py: ok"
