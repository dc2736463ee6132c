#!/usr/bin/env bash
# The PyTorch package's tests (tests/python, pytest), run on the source tree as CI runs them:
#   bash scripts/test_python.sh [BUILD_DIR]
# BUILD_DIR (default build/cuda) is a CUDA build: it is configured again with that PyTorch
# (-DFG_TORCH_PYTHON) and its capi/libfusegrad_torch.so built, which the package then loads
# ($FUSEGRAD_TORCH_LIBRARY; the C ABI's tests load capi/libfusegrad_norm.so, $FUSEGRAD_NORM_LIBRARY).
# Without a CUDA build (no nvcc) there is no library to test: the script says so and stops, before
# it installs anything.
# Without a GPU the `gpu` tests are skipped and the rest run: import, the errors users meet, shapes
# through the fake implementations, opcheck and torch.compile on meta tensors, the C ABI's
# argument checks.
# PyTorch (>= 2.4 with its C++ headers; Debian's 1.13 is too old), transformers and pytest come from
# $FUSEGRAD_TEST_PYTHON when set, else from the virtual environment build/pyenv, made here with
# pip on the first run (PyPI's torch 2.11 wheel and the CUDA libraries it depends on: about 5 GB
# and a minute; later runs in the same checkout reuse it). If pip cannot install them, the tests
# are skipped with a warning, as install_deps.sh does for cuDNN's headers.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cuda}
venv=build/pyenv
torch_version=2.11.0
transformers_version=4.46.3  # fusegrad.patch's tests build tiny Llama and GPT-2 models with it
if [ ! -f "$build/capi/libfusegrad_norm.so" ]; then
    echo "warning: no CUDA build in $build (no $build/capi/libfusegrad_norm.so): the PyTorch" \
         "package's tests did not run" >&2
    exit 0
fi
py=${FUSEGRAD_TEST_PYTHON:-}
if [ -z "$py" ]; then
    py=$venv/bin/python
    if ! "$py" -c "import numpy, pytest, torch, transformers
assert torch.__version__.startswith('$torch_version')" >/dev/null 2>&1; then
        echo "installing torch==$torch_version, transformers and pytest into $venv (pip)"
        if ! { python3 -m venv "$venv" &&
               "$py" -m pip install -q --disable-pip-version-check "torch==$torch_version" \
                   "transformers==$transformers_version" pytest numpy; }; then
            echo "warning: could not install PyTorch and pytest with pip: the PyTorch package's" \
                 "tests did not run" >&2
            exit 0
        fi
    fi
fi
case $py in */*) py=$(realpath -s "$py") ;; *) py=$(command -v "$py") ;; esac
cmake -S . -B "$build" -DFG_TORCH_PYTHON="$py" > /dev/null
cmake --build "$build" --target fusegrad_torch
FUSEGRAD_TORCH_LIBRARY=$(realpath "$build/capi/libfusegrad_torch.so")
FUSEGRAD_NORM_LIBRARY=$(realpath "$build/capi/libfusegrad_norm.so")
export FUSEGRAD_TORCH_LIBRARY FUSEGRAD_NORM_LIBRARY
PYTHONPATH=$PWD/python "$py" -m pytest tests/python -q -p no:cacheprovider
