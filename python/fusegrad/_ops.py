"""python/fusegrad/_ops.py: the norm kernels as PyTorch custom operators (torch.library).

Two ops, both opaque to torch.compile (it sees them through their fake implementations, below,
and keeps them as single nodes of the graph, with no graph break):

  fusegrad::norm_forward(input, residual?, weight?, bias?, kind, eps, zero_centered, reduction,
                         save_stats) -> (y, h, mean, rstd)
  fusegrad::norm_backward(grad_y, grad_h?, saved, weight?, mean, rstd, kind, zero_centered,
                          reduction, param_dtype, want_dweight, want_dbias)
                         -> (grad_input, grad_weight, grad_bias)

Shapes: input, residual, y, h (..., N), contiguous; weight, bias (N,); mean, rstd (M,) fp32 with
M the number of rows (the product of the leading dims). Outputs a call does not make are empty
tensors (ops return no None): h without a residual, mean for RMSNorm, mean and rstd when
save_stats is false (no backward will follow), grad_weight / grad_bias when not wanted.
`kind` is 0 for RMSNorm and 1 for LayerNorm; `reduction` 0 (auto), 1 (locked) or 2 (grid), the
strategy that sums dw / db across rows (docs/norms.md). The forward is differentiable (its
backward is norm_backward); norm_backward is not (no double backward).

All memory comes from PyTorch's allocator (torch.empty on the input's device), and the kernels run
on PyTorch's current stream of that device, so CUDA graphs, streams and torch.compile's
reduce-overhead mode see them as any other op.
"""
import ctypes
import math
from typing import Optional, Tuple

import torch

from . import _library

RMS, LAYER = 0, 1
FUNCTION_NAMES = {RMS: "fusegrad.rms_norm", LAYER: "fusegrad.layer_norm"}
REDUCTIONS = {"auto": 0, "locked": 1, "grid": 2}
# torch dtype -> the C ABI's dtype code (FGN_F32, FGN_BF16, FGN_F16)
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 2, torch.float16: 3}

# Inductor keeps the strides the ops were traced with (they need contiguous tensors).
_TAGS = ((torch.Tag.needs_fixed_stride_order,)
         if hasattr(torch.Tag, "needs_fixed_stride_order") else ())


def _shape(t):
    return str(tuple(t.shape))


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---- argument checks (run by the real and the fake implementations) ----------------------------

def _check_placement(fn, name, t, input):
    if t.device != input.device:
        raise ValueError("%s: %s is on %s, input is on %s: all tensors must be on the input's "
                         "device" % (fn, name, t.device, input.device))
    if not t.is_contiguous():
        raise ValueError("%s: %s is not contiguous (shape %s, strides %s)"
                         % (fn, name, _shape(t), tuple(t.stride())))


def check_input(fn, input):
    """The checks of `input` alone: a CUDA (or meta) tensor of a dtype the kernels take."""
    if not isinstance(input, torch.Tensor):
        raise TypeError("%s: input must be a torch.Tensor, got %s" % (fn, type(input).__name__))
    if input.device.type not in ("cuda", "meta"):
        raise ValueError("%s: input is on %s: fusegrad's norm kernels run on CUDA tensors only "
                         "(move the tensors and the module with .cuda())" % (fn, input.device))
    if input.dtype not in DTYPE_CODES:
        raise TypeError("%s: input is %s: the kernels take float32, bfloat16 and float16"
                        % (fn, _dtype_name(input.dtype)))
    if input.dim() < 1 or input.shape[-1] < 1:
        raise ValueError("%s: input needs a non-empty last dimension, got shape %s"
                         % (fn, _shape(input)))


def param_dtype(input, weight, bias):
    """The dtype of the affine parameters and of their gradients: the weight's, else the bias's,
    else the input's."""
    return weight.dtype if weight is not None else bias.dtype if bias is not None else input.dtype


def check_forward(kind, input, residual, weight, bias, eps, zero_centered, reduction):
    fn = FUNCTION_NAMES.get(kind)
    if fn is None:
        raise ValueError("fusegrad::norm_forward: kind must be 0 (RMSNorm) or 1 (LayerNorm), "
                         "got %r" % (kind,))
    check_input(fn, input)
    _check_placement(fn, "input", input, input)
    n = input.shape[-1]
    if residual is not None:
        if residual.shape != input.shape:
            raise ValueError("%s: residual has shape %s, input has shape %s: they must be the same"
                             % (fn, _shape(residual), _shape(input)))
        if residual.dtype != input.dtype:
            raise TypeError("%s: residual is %s, input is %s: they must be the same dtype"
                            % (fn, _dtype_name(residual.dtype), _dtype_name(input.dtype)))
        _check_placement(fn, "residual", residual, input)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.dim() != 1 or p.shape[0] != n:
            raise ValueError("%s: %s has shape %s, but the input's rows have %d values: it must "
                             "have shape (%d,)" % (fn, name, _shape(p), n, n))
        if p.dtype != torch.float32 and p.dtype != input.dtype:
            raise TypeError("%s: %s is %s, input is %s: weights must be float32 or the input's "
                            "dtype" % (fn, name, _dtype_name(p.dtype), _dtype_name(input.dtype)))
        _check_placement(fn, name, p, input)
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError("%s: weight is %s and bias is %s: they must be the same dtype"
                        % (fn, _dtype_name(weight.dtype), _dtype_name(bias.dtype)))
    if zero_centered and weight is None:
        raise ValueError("%s: zero_centered=True needs a weight (weight is None)" % fn)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError("%s: eps must be a finite number > 0, got %r" % (fn, eps))
    if reduction not in REDUCTIONS.values():
        raise ValueError("%s: reduction must be one of %s, got %r"
                         % (fn, ", ".join(map(repr, REDUCTIONS)), reduction))


def _rows(t):
    return t.numel() // t.shape[-1]


# ---- calling the library -----------------------------------------------------------------------

def _ptr(t):
    return t.data_ptr() if t is not None and t.numel() > 0 else None


def _stream(device):
    """PyTorch's current stream on `device`, as the integer handle the C ABI takes."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _require_cuda(fn, t):
    if t.device.type != "cuda":
        raise ValueError("%s: input is on %s: fusegrad's norm kernels run on CUDA tensors only"
                         % (fn, t.device))


# ---- fusegrad::norm_forward --------------------------------------------------------------------

@torch.library.custom_op("fusegrad::norm_forward", mutates_args=(), tags=_TAGS)
def norm_forward(input: torch.Tensor, residual: Optional[torch.Tensor],
                 weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], kind: int,
                 eps: float, zero_centered: bool, reduction: int,
                 save_stats: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm_forward_impl(input, residual, weight, bias, kind, eps, zero_centered, reduction,
                              save_stats)


def _norm_forward_impl(input, residual, weight, bias, kind, eps, zero_centered, reduction,
                       save_stats):
    """The forward on real CUDA tensors: the custom op's implementation, and _EagerNorm's."""
    check_forward(kind, input, residual, weight, bias, eps, zero_centered, reduction)
    _require_cuda(FUNCTION_NAMES[kind], input)
    y, h, mean, rstd = _forward_outputs(input, residual, kind, save_stats)
    rows, cols = _rows(input), input.shape[-1]
    if rows == 0:
        return y, h, mean, rstd
    lib = _library.load()
    _library.check(lib.fgn_norm_forward(
        kind, DTYPE_CODES[input.dtype], DTYPE_CODES[param_dtype(input, weight, bias)], rows, cols,
        eps, int(zero_centered), input.data_ptr(), _ptr(residual), _ptr(h), _ptr(weight),
        _ptr(bias), y.data_ptr(), _ptr(mean), _ptr(rstd), input.device.index,
        _stream(input.device)))
    return y, h, mean, rstd


def _forward_outputs(input, residual, kind, save_stats):
    rows = _rows(input)
    y = torch.empty_like(input, memory_format=torch.contiguous_format)
    h = torch.empty_like(y) if residual is not None else input.new_empty(0)
    rstd = input.new_empty(rows if save_stats else 0, dtype=torch.float32)
    mean = input.new_empty(rows if save_stats and kind == LAYER else 0, dtype=torch.float32)
    return y, h, mean, rstd


@norm_forward.register_fake
def _norm_forward_fake(input, residual, weight, bias, kind, eps, zero_centered, reduction,
                       save_stats):
    check_forward(kind, input, residual, weight, bias, eps, zero_centered, reduction)
    return _forward_outputs(input, residual, kind, save_stats)


# ---- fusegrad::norm_backward -------------------------------------------------------------------

def _check_backward(grad_y, grad_h, saved, weight, mean, rstd, kind, reduction, want_dweight):
    fn = "fusegrad::norm_backward"
    if kind not in FUNCTION_NAMES:
        raise ValueError("%s: kind must be 0 (RMSNorm) or 1 (LayerNorm), got %r" % (fn, kind))
    check_input(fn, saved)
    rows = _rows(saved)
    for name, t in (("grad_y", grad_y), ("grad_h", grad_h)):
        if t is None:
            continue
        if t.shape != saved.shape or t.dtype != saved.dtype:
            raise ValueError("%s: %s is %s %s, the saved input is %s %s" % (
                fn, name, _dtype_name(t.dtype), _shape(t), _dtype_name(saved.dtype), _shape(saved)))
        _check_placement(fn, name, t, saved)
    needed = [("rstd", rstd)] + ([("mean", mean)] if kind == LAYER else [])
    for name, t in needed:
        if rows > 0 and (t.dtype != torch.float32 or t.shape != (rows,)):
            raise ValueError("%s: %s is %s %s, expected float32 (%d,) (the forward's statistics; "
                             "a forward run with save_stats=False has none)"
                             % (fn, name, _dtype_name(t.dtype), _shape(t), rows))
        _check_placement(fn, name, t, saved)
    if weight is not None:
        if weight.shape != (saved.shape[-1],):
            raise ValueError("%s: weight has shape %s, the input's rows have %d values"
                             % (fn, _shape(weight), saved.shape[-1]))
        _check_placement(fn, "weight", weight, saved)
    elif want_dweight:
        raise ValueError("%s: want_dweight without a weight" % fn)
    if reduction not in REDUCTIONS.values():
        raise ValueError("%s: reduction must be 0, 1 or 2, got %r" % (fn, reduction))


def _backward_outputs(saved, param_dtype, want_dweight, want_dbias):
    n = saved.shape[-1]
    dx = torch.empty_like(saved, memory_format=torch.contiguous_format)
    dw = saved.new_empty(n if want_dweight else 0, dtype=param_dtype)
    db = saved.new_empty(n if want_dbias else 0, dtype=param_dtype)
    return dx, dw, db


@torch.library.custom_op("fusegrad::norm_backward", mutates_args=(), tags=_TAGS)
def norm_backward(grad_y: torch.Tensor, grad_h: Optional[torch.Tensor], saved: torch.Tensor,
                  weight: Optional[torch.Tensor], mean: torch.Tensor, rstd: torch.Tensor,
                  kind: int, zero_centered: bool, reduction: int, param_dtype: torch.dtype,
                  want_dweight: bool,
                  want_dbias: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm_backward_impl(grad_y, grad_h, saved, weight, mean, rstd, kind, zero_centered,
                               reduction, param_dtype, want_dweight, want_dbias)


def _norm_backward_impl(grad_y, grad_h, saved, weight, mean, rstd, kind, zero_centered,
                        reduction, param_dtype, want_dweight, want_dbias, checked=False):
    """The backward on real CUDA tensors: the custom op's implementation, and _EagerNorm's.
    `checked`: the arguments are known good (_EagerNorm's, all from its own checked forward and
    from autograd, which gives each gradient its output's shape, dtype and device), so the
    checks are not run again."""
    if not checked:
        _check_backward(grad_y, grad_h, saved, weight, mean, rstd, kind, reduction, want_dweight)
        _require_cuda("fusegrad::norm_backward", saved)
    dx, dw, db = _backward_outputs(saved, param_dtype, want_dweight, want_dbias)
    rows, cols = _rows(saved), saved.shape[-1]
    lib = _library.load()
    args = (kind, DTYPE_CODES[saved.dtype], DTYPE_CODES[param_dtype], rows, cols,
            int(zero_centered), reduction, _ptr(saved), _ptr(grad_y), _ptr(grad_h), _ptr(weight),
            _ptr(mean), _ptr(rstd), _ptr(dx), _ptr(dw), _ptr(db))
    device = saved.device.index
    size = ctypes.c_size_t(0)
    _library.check(lib.fgn_norm_backward_workspace_bytes(*args, device, ctypes.byref(size)))
    workspace = None
    if size.value:
        workspace = torch.empty(size.value, dtype=torch.uint8, device=saved.device)
    _library.check(lib.fgn_norm_backward(*args, _ptr(workspace), size.value, device,
                                         _stream(saved.device)))
    return dx, dw, db


@norm_backward.register_fake
def _norm_backward_fake(grad_y, grad_h, saved, weight, mean, rstd, kind, zero_centered, reduction,
                        param_dtype, want_dweight, want_dbias):
    _check_backward(grad_y, grad_h, saved, weight, mean, rstd, kind, reduction, want_dweight)
    return _backward_outputs(saved, param_dtype, want_dweight, want_dbias)


# ---- autograd: norm_forward's derivative is norm_backward ---------------------------------------

def _setup_context(ctx, inputs, output):
    input, residual, weight, bias, kind, eps, zero_centered, reduction, save_stats = inputs
    y, h, mean, rstd = output
    # The backward reads the normalised tensor: h when the residual add was fused.
    ctx.save_for_backward(h if residual is not None else input, weight, mean, rstd)
    ctx.kind, ctx.zero_centered, ctx.reduction = kind, zero_centered, reduction
    ctx.has_residual = residual is not None
    ctx.param_dtype = param_dtype(input, weight, bias)
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, grad_y, grad_h, grad_mean, grad_rstd, backward=None):
    """norm_forward's derivative through `backward` (the custom op norm_backward, or for
    _EagerNorm its implementation called directly)."""
    backward = backward or norm_backward
    saved, weight, mean, rstd = ctx.saved_tensors
    want_dweight, want_dbias = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    if not ctx.has_residual:
        grad_h = None
    elif grad_h is not None:
        grad_h = grad_h.contiguous()
    if grad_y is None:  # only h was used: its gradient passes through the add to x and residual
        return grad_h, grad_h, None, None, None, None, None, None, None
    if saved.numel() > 0 and rstd.numel() == 0:
        raise RuntimeError("%s: the forward ran with save_stats=False, so it kept no statistics "
                           "and cannot be differentiated" % FUNCTION_NAMES[ctx.kind])
    dx, dw, db = backward(grad_y.contiguous(), grad_h, saved, weight, mean, rstd, ctx.kind,
                          ctx.zero_centered, ctx.reduction, ctx.param_dtype, want_dweight,
                          want_dbias)
    return (dx, dx if ctx.has_residual else None, dw if want_dweight else None,
            db if want_dbias else None, None, None, None, None, None)


norm_forward.register_autograd(_backward, setup_context=_setup_context)


# ---- eager calls: the same implementations through a plain autograd.Function --------------------
# A call through the custom ops goes through PyTorch's dispatcher and back into Python for the
# op, for its autograd formula and again for the backward op: host time on every call, which an
# eager model with many small norms pays as a slower step. Where nothing needs the ops as graph
# nodes (no torch.compile, torch.export or tracing: plain CUDA tensors), functional.py calls
# _EagerNorm instead, which runs the same implementations and the same autograd formula directly.
# EAGER_PATH = "custom_op" routes every call through the custom ops (the tests run both).

EAGER_PATH = "function"


class _EagerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, residual, weight, bias, kind, eps, zero_centered, reduction,
                save_stats):
        args = (input, residual, weight, bias, kind, eps, zero_centered, reduction, save_stats)
        outputs = _norm_forward_impl(*args)
        _setup_context(ctx, args, outputs)
        return outputs

    @staticmethod
    def backward(ctx, grad_y, grad_h, grad_mean, grad_rstd):
        return _backward(ctx, grad_y, grad_h, grad_mean, grad_rstd, backward=_checked_backward)


def _checked_backward(*args):
    return _norm_backward_impl(*args, checked=True)


def uses_custom_ops(input):
    """Whether a call on `input` goes through the custom ops: under torch.compile or torch.export
    (dynamo), on meta tensors, on tensor subclasses (fake tensors, functional tensors), or when
    EAGER_PATH says so; else through _EagerNorm."""
    return (EAGER_PATH != "function" or torch.compiler.is_compiling() or
            type(input) is not torch.Tensor or input.device.type == "meta")


def norm(input, residual, weight, bias, kind, eps, zero_centered, reduction, save_stats):
    """(y, h, mean, rstd) of norm_forward, through the custom op or _EagerNorm (above)."""
    if uses_custom_ops(input):
        return norm_forward(input, residual, weight, bias, kind, eps, zero_centered, reduction,
                            save_stats)
    return _EagerNorm.apply(input, residual, weight, bias, kind, eps, zero_centered, reduction,
                            save_stats)
