#!/usr/bin/env bash
# Fills .gpu/ (git-ignored) with what the GPU machine needs but cannot download: the shared
# preparation (yaml-cpp, Catch2, env.sh, data) plus OpenBLAS and its Fortran runtime, which the
# CPU reference matmul links. Run once per checkout, from anywhere inside the repository.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bash ../shared/device/prepare.sh
cd .gpu/debs
if ! ls libxxhash-dev_*.deb >/dev/null 2>&1; then
    apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev \
        libopenblas0 libgfortran5 libquadmath0 nlohmann-json3-dev libxxhash-dev >/dev/null
fi
ls -1
