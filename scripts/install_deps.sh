#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages fusegrad builds with, if any is missing (apt-get; sudo when
# not root). CUDA is optional and not installed here: with nvcc present (on PATH or in
# /usr/local/cuda) the kernels are built too.
set -euo pipefail
# With --tests, also python3-torch: the PyTorch parity test (tests/parity) runs with it.
packages=(cmake g++ ninja-build pkg-config libyaml-cpp-dev catch2 libopenblas-dev nlohmann-json3-dev
    libxxhash-dev)
if [ "${1:-}" = "--tests" ]; then
    packages+=(python3-torch)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
