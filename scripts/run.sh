#!/usr/bin/env bash
# The main command (README): installs what is missing, builds fusegrad (with CUDA when nvcc
# exists) and runs its main job. Until the GPT trainer lands, that is `fusegrad demo`, a small
# MLP trained with fusegrad's autograd on the GPU when there is one, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFG_BUILD_TESTS=OFF -DFG_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)"
./build/release/train/fusegrad info
./build/release/train/fusegrad demo "$@"
