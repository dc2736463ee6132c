#!/usr/bin/env bash
# Fills .gpu/ (git-ignored) with what the GPU machine needs but cannot download: the shared
# preparation (yaml-cpp, Catch2, env.sh, data) plus OpenBLAS and its Fortran runtime, which the
# CPU reference matmul links, nlohmann-json, xxhash, CLI11 and PCRE2, GPT-2's vocabulary
# (gpt2.tiktoken, into .gpu/data, which env.sh names as FUSEGRAD_DATA), and the cuDNN frontend's
# headers. Run once per checkout, from anywhere inside the repository.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bash ../shared/device/prepare.sh
cd .gpu/debs
if ! ls libpcre2-dev_*.deb >/dev/null 2>&1; then
    apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev \
        libopenblas0 libgfortran5 libquadmath0 nlohmann-json3-dev libxxhash-dev libcli11-dev \
        libpcre2-dev libpcre2-8-0 >/dev/null
fi
ls -1
# GPT-2's vocabulary, as the set-up installed it here (scripts/install_deps.sh --tokenizer).
vocab=${FUSEGRAD_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/fusegrad}/gpt2.tiktoken
[ -f "$vocab" ] || bash "$root/scripts/install_deps.sh" --tokenizer
mkdir -p "$root/.gpu/data" && cp "$vocab" "$root/.gpu/data/"
grep -q FUSEGRAD_DATA "$root/.gpu/env.sh" ||
    echo 'export FUSEGRAD_DATA=$PWD/.gpu/data  # gpt2.tiktoken (scripts/prepare_gpu.sh)' >> "$root/.gpu/env.sh"
# The cuDNN frontend's headers (header-only C++; the GPU machine has cuDNN itself in python3's
# nvidia/cudnn but not these): from the nvidia-cudnn-frontend wheel, into .gpu/cudnn_frontend,
# which gpu_check.sh points FG_CUDNN_FRONTEND_INCLUDE at. Without them the build there goes on
# without cuDNN's attention.
cd "$root/.gpu"
if [ ! -f cudnn_frontend/include/cudnn_frontend.h ]; then
    tmp=$(mktemp -d)
    if python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
            nvidia-cudnn-frontend >/dev/null 2>&1; then
        python3 - "$tmp" <<'EOF2'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_cudnn_frontend-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall("cudnn_frontend", [n for n in z.namelist() if n.startswith("include/")])
EOF2
        echo "cuDNN frontend headers: $(basename "$tmp"/*.whl)"
    else
        echo "warning: could not download nvidia-cudnn-frontend: the GPU build will lack" \
             "cuDNN's attention" >&2
    fi
    rm -rf "$tmp"
fi
