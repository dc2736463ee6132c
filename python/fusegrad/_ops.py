"""python/fusegrad/_ops.py: the two ops that libfusegrad_torch.so registers with PyTorch's
dispatcher (capi/torch_ops.cpp states their schemas, checks and autograd formula), and the codes
their arguments take:

  torch.ops.fusegrad.norm_forward(input, residual?, weight?, bias?, kind, eps, zero_centered,
                                  reduction, save_stats) -> (y, h, mean, rstd)
  torch.ops.fusegrad.norm_backward(grad_y, grad_h?, saved, weight?, mean, rstd, kind,
                                   zero_centered, reduction, param_dtype, want_dweight,
                                   want_dbias) -> (grad_input, grad_weight, grad_bias)

Each has a CUDA and a Meta implementation in C++ (torch.compile traces through the Meta one, so
the ops are single nodes of its graphs with no graph break), and norm_forward's derivative is
norm_backward, registered in C++ too: an eager call and its backward run no Python of fusegrad's
beyond modules.py's forward or functional.py's argument handling.
"""
import torch

from . import _library

RMS, LAYER = 0, 1
FUNCTION_NAMES = {RMS: "fusegrad.rms_norm", LAYER: "fusegrad.layer_norm"}
REDUCTIONS = {"auto": 0, "locked": 1, "grid": 2}


def _shape(t):
    return str(tuple(t.shape))


# The operators' overloads, looked up once (None when the library did not load).
_forward = torch.ops.fusegrad.norm_forward.default if _library.status()[0] else None
_backward = torch.ops.fusegrad.norm_backward.default if _library.status()[0] else None


def norm_forward(*args):
    """torch.ops.fusegrad.norm_forward (above); LibraryError when the library did not load."""
    if _forward is None:
        _library.check_loaded()
    return _forward(*args)


def norm_backward(*args):
    """torch.ops.fusegrad.norm_backward (above); LibraryError when the library did not load."""
    if _backward is None:
        _library.check_loaded()
    return _backward(*args)
