"""python/fusegrad/modules.py: fusegrad.RMSNorm and fusegrad.LayerNorm, drop-in torch.nn.Module
replacements for torch.nn.RMSNorm and torch.nn.LayerNorm (the same argument names, defaults,
parameter names and state_dict keys), and replace_norms, which swaps them into a built model.

Beyond PyTorch's modules: forward(input, residual) fuses the residual add (returns (y, h));
zero_centered=True keeps the scale as 1 + weight (weight initialised to zeros); RMSNorm takes a
bias; reduction picks how dw / db are summed in the backward ('auto', 'locked', 'grid').

A module swapped in for a model's own norm (replace_norms, fusegrad.patch) with compiled="torch"
(the default) runs the replaced norm's forward, on its own parameters, while torch.compile (or
torch.export) traces the model: Inductor fuses the model's norm with the casts and adds around
it, which an opaque op cannot join, and that made compiled models slower with fusegrad's kernels
inside (docs/pytorch.md). Eager calls always run fusegrad's kernels; compiled="fusegrad" keeps
them in compiled graphs too.
"""
import numbers

import torch
from torch import nn

from . import _ops
from .functional import _RMS_DEFAULT_EPS, layer_norm, rms_norm, wants_statistics


def _as_shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


# What a swapped-in module runs under torch.compile: the model's own norm, or fusegrad's ops.
COMPILED = ("torch", "fusegrad")


class _Norm(nn.Module):
    _model_forward = None  # the replaced norm's forward, run under torch.compile (sharing())
    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "zero_centered", "reduction"]

    def __init__(self, kind, normalized_shape, eps, elementwise_affine, bias, device, dtype,
                 zero_centered, reduction):
        super().__init__()
        name = type(self).__name__
        self.normalized_shape = _as_shape(normalized_shape)
        if not self.normalized_shape or min(self.normalized_shape) < 1:
            raise ValueError("fusegrad.%s: normalized_shape must be positive, got %r"
                             % (name, normalized_shape))
        if reduction not in _ops.REDUCTIONS:
            raise ValueError("fusegrad.%s: reduction must be one of %s, got %r"
                             % (name, ", ".join(map(repr, _ops.REDUCTIONS)), reduction))
        if zero_centered and not elementwise_affine:
            raise ValueError("fusegrad.%s: zero_centered=True needs elementwise_affine=True "
                             "(it describes the weight)" % name)
        self._kind = kind
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.zero_centered = zero_centered
        self.reduction = reduction
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            (nn.init.zeros_ if self.zero_centered else nn.init.ones_)(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input, residual=None):
        if self._model_forward is not None and torch.compiler.is_compiling():
            if residual is None:
                return self._model_forward(self, input)
            h = (input + residual).to(input.dtype)  # as the kernel rounds it
            return self._model_forward(self, h), h
        # The common case straight to the operator, which checks the tensors: contiguous rows of
        # the one normalised dimension. Anything else takes functional.py's shape handling.
        code = _ops.REDUCTIONS.get(self.reduction)
        eps = _RMS_DEFAULT_EPS if self.eps is None and self._kind == _ops.RMS else self.eps
        if (len(self.normalized_shape) == 1 and isinstance(input, torch.Tensor) and
                isinstance(eps, (int, float)) and not isinstance(eps, bool) and
                input.dim() >= 1 and input.shape[-1] == self.normalized_shape[0] and
                input.is_contiguous() and code is not None and
                (residual is None or (isinstance(residual, torch.Tensor) and
                                      residual.is_contiguous()))):
            w, b = self.weight, self.bias
            y, h, _, _ = _ops.norm_forward(input, residual, w, b, self._kind, float(eps),
                                           bool(self.zero_centered), code,
                                           wants_statistics(input, residual, w, b))
            return y if residual is None else (y, h)
        fn = rms_norm if self._kind == _ops.RMS else layer_norm
        return fn(input, self.weight, self.bias, self.eps, residual, self.zero_centered,
                  normalized_shape=self.normalized_shape, reduction=self.reduction)

    def extra_repr(self):
        s = "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(
            **self.__dict__)
        if self.elementwise_affine:
            s += ", bias=%s" % (self.bias is not None)
        if self.zero_centered:
            s += ", zero_centered=True"
        if self.reduction != "auto":
            s += ", reduction=%r" % self.reduction
        return s


class LayerNorm(_Norm):
    """torch.nn.LayerNorm on fusegrad's fused kernels (CUDA tensors of float32, bfloat16 or
    float16; parameters float32 or the input's dtype)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None,
                 dtype=None, *, zero_centered=False, reduction="auto"):
        super().__init__(_ops.LAYER, normalized_shape, eps, elementwise_affine, bias, device, dtype,
                         zero_centered, reduction)


class RMSNorm(_Norm):
    """torch.nn.RMSNorm on fusegrad's fused kernels. eps=None is PyTorch's default (float32's
    machine epsilon); bias=False as PyTorch's, which has none."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, bias=False, device=None,
                 dtype=None, *, zero_centered=False, reduction="auto"):
        super().__init__(_ops.RMS, normalized_shape, eps, elementwise_affine, bias, device, dtype,
                         zero_centered, reduction)


def _swap_for(module, reduction, compiled):
    """fusegrad's module for `module` (a torch.nn.LayerNorm or torch.nn.RMSNorm, matched by exact
    type), sharing its parameters, or None."""
    kind = type(module)
    if kind is nn.LayerNorm:
        cls = LayerNorm
    elif getattr(nn, "RMSNorm", None) is not None and kind is nn.RMSNorm:
        cls = RMSNorm
    else:
        return None
    return sharing(cls, module, module.normalized_shape, module.eps, module.weight,
                   getattr(module, "bias", None), reduction, compiled)


def check_compiled(compiled):
    if compiled not in COMPILED:
        raise ValueError("fusegrad: compiled must be one of %s, got %r"
                         % (", ".join(map(repr, COMPILED)), compiled))


def sharing(cls, original, normalized_shape, eps, weight, bias, reduction, compiled):
    """fusegrad's `cls` in place of the norm `original`, over the given weight and bias (the same
    Parameter objects, either may be None: an optimizer built before a swap still updates them),
    in original's training mode. With compiled="torch" it keeps original's forward (a function,
    not the module: whatever later replaces the parameters in the model's tree, a state_dict
    loaded with assign=True among them, is what it reads) and the plain attributes that forward
    may read, and runs it on itself under torch.compile."""
    new = cls(normalized_shape, eps, False, reduction=reduction)
    new.elementwise_affine = weight is not None
    new.weight, new.bias = weight, bias
    new.train(original.training)
    if compiled == "torch":
        for key, value in vars(original).items():  # e.g. LlamaRMSNorm's variance_epsilon
            if not key.startswith("_") and key != "training" and not hasattr(new, key):
                setattr(new, key, value)
        new.__dict__["_model_forward"] = type(original).forward
    return new


def replace_norms(model, reduction="auto", compiled="torch"):
    """Replaces, in place, every torch.nn.LayerNorm and torch.nn.RMSNorm inside `model` (exact
    types, not subclasses, whose forward may differ) by fusegrad's module with the same
    parameters; returns how many were replaced. The model's tensors must then be on CUDA.
    compiled: what the new modules run under torch.compile (the module's docstring)."""
    check_compiled(compiled)
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = _swap_for(child, reduction, compiled)
            if new is not None:
                setattr(parent, name, new)
                count += 1
    return count
