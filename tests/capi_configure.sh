#!/usr/bin/env bash
# tests/capi_configure.sh SOURCE_DIR CUDA_COMPILER: the PyTorch package's configure-time refusals
# (capi/CMakeLists.txt). A stand-in "python" that cannot import torch, then one whose torch is
# older than 2.4: the package-only configure (FG_NORM_SHARED_ONLY, what pip runs) must stop,
# saying so, before anything is compiled.
set -u
src=$1 nvcc=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '#!/bin/sh\necho "ModuleNotFoundError: No module named '"'"'torch'"'"'" >&2\nexit 1\n' \
    > "$dir/no_torch"
printf '#!/bin/sh\nprintf "/inc\\n/lib\\n1\\n2.3.1\\n"\n' > "$dir/old_torch"
chmod +x "$dir/no_torch" "$dir/old_torch"
status=0
for case in "no_torch:cannot import torch:" "no_torch:No module named 'torch'" \
            "no_torch:pip install --no-build-isolation ." \
            "old_torch:needs PyTorch 2.4 or later;" "old_torch:has 2.3.1"; do
    python=${case%%:*} expected=${case#*:}
    bash "$(dirname "$0")/cli_expect_error.sh" "$expected" \
        cmake -S "$src" -B "$dir/build" -DFG_NORM_SHARED_ONLY=ON -DFG_CUDNN=OFF \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DFG_TORCH_PYTHON="$dir/$python" || status=1
done
exit $status
