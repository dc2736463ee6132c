#!/usr/bin/env bash
# The main command (README): installs what is missing, builds fusegrad (with CUDA when nvcc
# exists), trains the default config (configs/addition.yaml: a small GPT learning two-digit
# addition, on the GPU when there is one) into a new run directory, then samples from it.
# Extra arguments go to `fusegrad train` (e.g. --set train.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFG_BUILD_TESTS=OFF \
    -DFG_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)"
fusegrad=./build/release/bin/fusegrad
run="runs/addition-$(date +%Y%m%d-%H%M%S)"
$fusegrad info
$fusegrad train configs/addition.yaml --set "train.out_dir=$run" "$@"
echo "== samples (greedy) from $run"
for prompt in "12+34=" "47+38=" "99+99=" "05+70="; do
    $fusegrad sample "$run" --prompt "$prompt" --max-new-tokens 3 --temperature 0
done
