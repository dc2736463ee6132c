"""python/fusegrad/_library.py: finds and loads libfusegrad_torch.so, the library that registers
fusegrad's norm ops with PyTorch's dispatcher in C++ (capi/torch_ops.cpp; it calls the kernels in
libfusegrad_norm.so beside it). `import fusegrad` loads it once, so that the ops exist before any
call or torch.compile trace; a missing or broken library is not an import error: the first call
raises LibraryError with the reason, and is_available() / why_unavailable() say it.

Where the library is looked for: $FUSEGRAD_TORCH_LIBRARY (a path, for a library built by CMake,
e.g. build/cuda/capi/libfusegrad_torch.so), else beside this file (where `pip install .` puts it).
"""
import os

import torch

ENV_VAR = "FUSEGRAD_TORCH_LIBRARY"
FILE_NAME = "libfusegrad_torch.so"


class LibraryError(RuntimeError):
    """The ops' library is missing, cannot be loaded, or was built for another PyTorch."""


def library_path():
    """The path the library is loaded from (it may not exist): $FUSEGRAD_TORCH_LIBRARY, else the
    package's own folder."""
    override = os.environ.get(ENV_VAR)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), FILE_NAME)


def _load(path):
    """Loads the library at `path`; returns None, or the LibraryError message."""
    source = ("$%s" % ENV_VAR) if os.environ.get(ENV_VAR) else "the package's folder"
    if not os.path.isfile(path):
        return ("fusegrad: the ops' library %s was not found (looked in %s: %s). Install the "
                "package with `pip install --no-build-isolation .` from fusegrad's repository on "
                "a machine with the CUDA toolkit and PyTorch, or set %s to a libfusegrad_torch.so "
                "built by CMake with -DFG_TORCH_PYTHON=<python with torch> (build/<dir>/capi/)."
                % (FILE_NAME, source, path, ENV_VAR))
    if hasattr(torch.ops, "fusegrad") and hasattr(torch.ops.fusegrad, "norm_forward"):
        return None  # registered already in this process (the same library, loaded before)
    try:
        torch.ops.load_library(path)
    except OSError as e:
        return ("fusegrad: could not load %s (from %s): %s. It is built against one PyTorch: "
                "rebuild it (pip install --no-build-isolation .) after installing another."
                % (path, source, e))
    if not hasattr(torch.ops.fusegrad, "norm_forward"):
        return "fusegrad: %s is not fusegrad's ops library (it registers no fusegrad ops)" % path
    return None


_failure = _load(library_path())


def check_loaded():
    """Raises LibraryError, saying why, when the library did not load at import."""
    if _failure is not None:
        raise LibraryError(_failure)


def status():
    """(True, path) when the library loaded, else (False, why)."""
    return (True, library_path()) if _failure is None else (False, _failure)
