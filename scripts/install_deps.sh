#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages fusegrad builds with, if any is missing (apt-get; sudo when
# not root). CUDA is optional and not installed here: with nvcc present (on PATH or in
# /usr/local/cuda) the kernels are built too.
#   --tests  also python3-torch, python3-pip and python3-venv (the PyTorch parity test,
#            tests/parity, runs with torch; pip and venv for the package's tests), GPT-2's
#            vocabulary (as --tokenizer), tiktoken in build/tiktoken (the tokenizer's parity
#            test) and transformers in build/hf (tests/hf: GPT-2 weights in and out);
#   --tokenizer  GPT-2's vocabulary gpt2.tiktoken for text/gpt2_bpe.h (see below);
#   --cudnn  also the cuDNN frontend's headers (cudnn_frontend.h, header-only C++), which
#            cuDNN's fused attention needs (FG_CUDNN, README "Building by hand"), when nvcc and
#            cuDNN itself (cudnn.h) are installed and the headers are not: downloaded with pip
#            (the wheel of the PyPI package nvidia-cudnn-frontend ships them in include/) and
#            copied to /usr/local/include (or $CUDNN_FRONTEND_PREFIX/include). Nothing changes in
#            any Python environment. Without cuDNN, or when the download fails, the build goes on
#            without cuDNN's attention.
set -euo pipefail
packages=(cmake g++ ninja-build pkg-config libyaml-cpp-dev catch2 libopenblas-dev nlohmann-json3-dev
    libxxhash-dev libcli11-dev libpcre2-dev)
cudnn=0 tokenizer=0 tiktoken=0
for arg in "$@"; do
    case $arg in
        --tests) packages+=(python3-torch python3-pip python3-venv) tokenizer=1 tiktoken=1 ;;
        --cudnn) cudnn=1 ;;
        --tokenizer) tokenizer=1 ;;
        *) echo "usage: install_deps.sh [--tests] [--cudnn] [--tokenizer]" >&2; exit 2 ;;
    esac
done

sudo=""
need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "error: need root or sudo to install: $*" >&2; exit 1; }
        sudo="sudo"
    fi
}

missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    need_root "${missing[*]}"
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# GPT-2's vocabulary for text/gpt2_bpe.h (--tokenizer; --tests too): gpt2.tiktoken from the
# openai-whisper 20250625 source distribution on PyPI (whisper/assets/gpt2.tiktoken), checked by its
# sha256, into $FUSEGRAD_DATA (default ${XDG_DATA_HOME:-~/.local/share}/fusegrad). Nothing fetches
# it at run time. --tests also puts tiktoken (pip) in build/tiktoken, for the parity test against
# it.
if [ "$tokenizer" = 1 ]; then
    dest=${FUSEGRAD_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/fusegrad}
    sha=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
    if ! echo "$sha  $dest/gpt2.tiktoken" | sha256sum -c --quiet >/dev/null 2>&1; then
        tmp=$(mktemp -d)
        python3 -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" \
            openai-whisper==20250625 >/dev/null
        tar -xzf "$tmp"/openai_whisper-20250625.tar.gz -C "$tmp" \
            openai_whisper-20250625/whisper/assets/gpt2.tiktoken
        echo "$sha  $tmp/openai_whisper-20250625/whisper/assets/gpt2.tiktoken" | sha256sum -c --quiet
        mkdir -p "$dest" && cp "$tmp"/openai_whisper-20250625/whisper/assets/gpt2.tiktoken "$dest/"
        rm -rf "$tmp"
        echo "installed $dest/gpt2.tiktoken"
    fi
fi
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$tiktoken" = 1 ] && [ ! -d "$root/build/tiktoken/tiktoken" ]; then
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --target "$root/build/tiktoken" \
        tiktoken >/dev/null
fi
# transformers for Debian's python3 and its torch (tests/hf): a version that still runs on
# Debian 12's torch 1.13, beside the system's numpy (the same version pinned, so pip does not put
# a numpy 2 in front of it).
if [ "$tiktoken" = 1 ] && [ ! -d "$root/build/hf/transformers" ]; then
    numpy_version=$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')
    PIP_ROOT_USER_ACTION=ignore /usr/bin/python3 -m pip install --quiet --target "$root/build/hf" \
        transformers==4.46.3 "numpy==$numpy_version" >/dev/null
fi

[ "$cudnn" = 1 ] || exit 0
# cuDNN itself: with the CUDA toolkit, in the system's include folders, or pip's nvidia-cudnn-*.
has_cudnn_h() {
    for d in /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu; do
        [ -f "$d/cudnn.h" ] && return 0
    done
    python3 - <<'EOF' 2>/dev/null
import importlib.util, os, sys
s = importlib.util.find_spec("nvidia.cudnn")
sys.exit(0 if s and any(os.path.isfile(os.path.join(p, "include", "cudnn.h"))
                        for p in s.submodule_search_locations) else 1)
EOF
}
prefix=${CUDNN_FRONTEND_PREFIX:-/usr/local}
has_frontend() {
    for d in "$prefix/include" /usr/local/include /usr/include; do
        [ -f "$d/cudnn_frontend.h" ] && return 0
    done
    python3 -c "import importlib.metadata as m; m.distribution('nvidia-cudnn-frontend')" 2>/dev/null
}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "no nvcc: cuDNN's attention is not built, its frontend not installed"
    exit 0
fi
if ! has_cudnn_h; then
    echo "no cuDNN (cudnn.h): cuDNN's attention is not built, its frontend not installed"
    exit 0
fi
if has_frontend; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" nvidia-cudnn-frontend >/dev/null 2>&1; then
    echo "warning: could not download nvidia-cudnn-frontend (pip); building without cuDNN's attention" >&2
    exit 0
fi
python3 - "$tmp" <<'EOF'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_cudnn_frontend-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[1] + "/unpacked", [n for n in z.namelist() if n.startswith("include/")])
EOF
[ -f "$tmp/unpacked/include/cudnn_frontend.h" ] || { echo "warning: the nvidia-cudnn-frontend wheel holds no include/cudnn_frontend.h; building without cuDNN's attention" >&2; exit 0; }
if [ "$(id -u)" -ne 0 ] && [ ! -w "$(dirname "$prefix")" ]; then
    command -v sudo >/dev/null || { echo "warning: need root or sudo to copy the cuDNN frontend's headers to $prefix/include; building without cuDNN's attention" >&2; exit 0; }
    sudo="sudo"
fi
echo "installing the cuDNN frontend's headers ($(basename "$tmp"/*.whl)) into $prefix/include"
$sudo mkdir -p "$prefix/include"
$sudo cp -r "$tmp/unpacked/include/." "$prefix/include/"
