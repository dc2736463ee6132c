#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing (with the cuDNN frontend's headers
# where nvcc and cuDNN are installed, so that the CUDA build has cuDNN's attention), then
#   0. the teaching path's line budget (scripts/line_budget.py);
#   1. the CUDA configuration (when nvcc exists; compile and link only without a GPU), -Werror,
#      and its CPU tests (ctest -LE gpu); on a machine with a GPU, also the gpu tests;
#   2. the PyTorch package's pytest suite (scripts/test_python.sh: PyTorch from pip into
#      build/pyenv), over the CUDA build's libraries (libfusegrad_torch.so built there for it);
#   3. a CPU-only configuration under AddressSanitizer + UndefinedBehaviorSanitizer, -Werror,
#      and its CPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --tests --cudnn
jobs=$(nproc)
echo "== the teaching path's code lines (scripts/line_budget.py)"
python3 scripts/line_budget.py
export PATH="$PATH:/usr/local/cuda/bin"

if command -v nvcc >/dev/null; then
    echo "== CUDA build (build/cuda)"
    cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DFG_CUDA=ON -DFG_WERROR=ON
    cmake --build build/cuda -j "$jobs"
    label="-LE gpu"
    if nvidia-smi >/dev/null 2>&1; then label=""; fi
    ctest --test-dir build/cuda $label --output-on-failure -j "$jobs"
else
    echo "== no nvcc: skipping the CUDA build"
fi

echo "== the PyTorch package (tests/python; builds and loads build/cuda's libfusegrad_torch.so)"
bash scripts/test_python.sh build/cuda

echo "== CPU-only build under ASan + UBSan (build/cpu-asan)"
cmake -S . -B build/cpu-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFG_CUDA=OFF \
    -DFG_SANITIZE=ON -DFG_WERROR=ON
cmake --build build/cpu-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build/cpu-asan -LE gpu --output-on-failure -j "$jobs"
echo "== all tests passed"
