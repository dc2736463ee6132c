"""python/fusegrad/_library.py: finds and loads libfusegrad_norm.so, the C ABI of fusegrad's norm
kernels (capi/fusegrad_norm.h), with ctypes, once, at the first kernel call: importing fusegrad
needs neither the library nor a GPU. Every call's return code becomes a Python exception carrying
the library's message.

Where the library is looked for: $FUSEGRAD_NORM_LIBRARY (a path, for a library built by CMake,
e.g. build/cuda/capi/libfusegrad_norm.so), else beside this file (where `pip install .` puts it).
"""
import ctypes
import os
import threading

ABI_VERSION = 1  # capi/fusegrad_norm.h: FGN_ABI_VERSION
ENV_VAR = "FUSEGRAD_NORM_LIBRARY"
FILE_NAME = "libfusegrad_norm.so"

# Return codes (FGN_OK, FGN_ERROR_*).
_OK, _ERROR_ARGUMENT = 0, 1


class LibraryError(RuntimeError):
    """The norm kernels' library is missing, cannot be loaded, or is of another ABI version."""


def library_path():
    """The path the library is loaded from (it may not exist): $FUSEGRAD_NORM_LIBRARY, else the
    package's own folder."""
    override = os.environ.get(ENV_VAR)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), FILE_NAME)


_lock = threading.Lock()
_lib = None
_failure = None  # the LibraryError message, once loading has failed (not retried)


def _declare(lib):
    c_int, c_i64, c_f, c_p = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.fgn_abi_version.argtypes = []
    lib.fgn_abi_version.restype = c_int
    lib.fgn_last_error.argtypes = []
    lib.fgn_last_error.restype = ctypes.c_char_p
    # kind, x_dtype, w_dtype, rows, cols, eps, zero_centered, x, residual, h_out, weight, bias,
    # y, mean, rstd, device, stream
    lib.fgn_norm_forward.argtypes = [c_int, c_int, c_int, c_i64, c_i64, c_f, c_int,
                                     c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_int, c_p]
    lib.fgn_norm_forward.restype = c_int
    # kind, x_dtype, w_dtype, rows, cols, zero_centered, reduction, x, dy, dh, weight, mean,
    # rstd, dx, dweight, dbias, then (workspace size query) device, size_t* bytes, or
    # (backward) workspace, workspace_bytes, device, stream
    common = [c_int, c_int, c_int, c_i64, c_i64, c_int, c_int,
              c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    lib.fgn_norm_backward_workspace_bytes.argtypes = common + [c_int, size_p]
    lib.fgn_norm_backward_workspace_bytes.restype = c_int
    lib.fgn_norm_backward.argtypes = common + [c_p, ctypes.c_size_t, c_int, c_p]
    lib.fgn_norm_backward.restype = c_int


def load():
    """The loaded library (ctypes.CDLL); raises LibraryError saying what is missing."""
    global _lib, _failure
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        if _failure is not None:
            raise LibraryError(_failure)
        path = library_path()
        try:
            _lib = _open(path)
        except LibraryError as e:
            _failure = str(e)
            raise
        return _lib


def _open(path):
    source = ("$%s" % ENV_VAR) if os.environ.get(ENV_VAR) else "the package's folder"
    if not os.path.isfile(path):
        raise LibraryError(
            "fusegrad: the norm kernels' library %s was not found (looked in %s: %s). Install "
            "the package with `pip install .` from fusegrad's repository on a machine with the "
            "CUDA toolkit, or set %s to a libfusegrad_norm.so built by CMake "
            "(build/<dir>/capi/)." % (FILE_NAME, source, path, ENV_VAR))
    # PyTorch first: its CUDA runtime (libcudart.so.13 for CUDA 13) is then the one the library
    # binds to, by soname, rather than a second copy.
    import torch  # noqa: F401
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise LibraryError("fusegrad: could not load %s (from %s): %s"
                           % (path, source, e)) from None
    try:
        _declare(lib)
    except AttributeError as e:
        raise LibraryError("fusegrad: %s is not fusegrad's norm library: %s" % (path, e)) from None
    version = lib.fgn_abi_version()
    if version != ABI_VERSION:
        raise LibraryError(
            "fusegrad: %s has C ABI version %d, this package needs version %d: rebuild and "
            "reinstall the package (pip install .) from one checkout"
            % (path, version, ABI_VERSION))
    return lib


def check(rc):
    """Raises the library's error for a non-zero return code: ValueError for an argument it
    refused, RuntimeError for a CUDA or internal error."""
    if rc == _OK:
        return
    message = "fusegrad: " + _lib.fgn_last_error().decode("utf-8", "replace")
    if rc == _ERROR_ARGUMENT:
        raise ValueError(message)
    raise RuntimeError(message)


def status():
    """(True, path) when the library loads, else (False, why)."""
    try:
        load()
        return True, library_path()
    except LibraryError as e:
        return False, str(e)
