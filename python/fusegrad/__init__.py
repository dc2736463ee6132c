"""fusegrad: the fused RMSNorm / LayerNorm CUDA kernels of fusegrad (a C++17/CUDA training
framework) for PyTorch: functions, drop-in modules, and the ops beneath them (registered with
PyTorch's dispatcher in C++).

    import fusegrad
    norm = fusegrad.LayerNorm(768).cuda()          # as torch.nn.LayerNorm(768)
    y = norm(x)                                     # x: (..., 768), CUDA, f32 / bf16 / f16
    y, h = fusegrad.rms_norm(x, w, residual=r)      # fused residual add: h = x + r, y = norm(h)
    fusegrad.replace_norms(model)                   # swap a model's nn.LayerNorm / nn.RMSNorm
    fusegrad.patch(model)                           # nanoGPT / Llama / GPT-2 norms, fused adds
                                                    # (compiled, the model's own norms run)

Importing needs PyTorch (2.4 or newer) but no GPU. It loads the ops' library (libfusegrad_torch.so,
built by `pip install --no-build-isolation .` against the installed PyTorch); a missing or broken
one is not an import error but reported at the first call, as is a CPU tensor. docs/pytorch.md is
the guide.
"""
import torch as _torch

if tuple(int(v) for v in _torch.__version__.split(".")[:2] if v.isdigit()) < (2, 4):
    raise ImportError("fusegrad needs PyTorch 2.4 or newer; this is PyTorch %s"
                      % _torch.__version__)

from . import _library  # noqa: E402
from ._library import LibraryError, library_path  # noqa: E402,F401
from ._ops import norm_backward, norm_forward  # noqa: E402,F401
from .functional import layer_norm, rms_norm  # noqa: E402,F401
from .modules import LayerNorm, RMSNorm, replace_norms  # noqa: E402,F401
from .patch import patch  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = ["rms_norm", "layer_norm", "RMSNorm", "LayerNorm", "replace_norms", "patch",
           "is_available", "why_unavailable",
           "library_path", "LibraryError"]


def is_available():
    """True when the kernels can run here: the library loads and PyTorch sees a CUDA device."""
    return _torch.cuda.is_available() and _library.status()[0]


def why_unavailable():
    """None when is_available(), else a sentence saying what is missing."""
    if not _torch.cuda.is_available():
        return "PyTorch sees no CUDA device (torch.cuda.is_available() is False)"
    ok, why = _library.status()
    return None if ok else why
