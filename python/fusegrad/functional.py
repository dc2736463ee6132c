"""python/fusegrad/functional.py: fusegrad.rms_norm and fusegrad.layer_norm, the functions over the
op norm_forward of _ops.py (the math is in kernels/norm.h and docs/norms.md). The op checks the
tensors it gets (device, dtype, shapes); these functions check what is theirs to interpret
(normalized_shape, eps, reduction) and bring the tensors to rows of N values.

Both normalise over the trailing dims of `input` that `normalized_shape` names when given (weight
and bias must then match it), else `weight`'s shape, else `bias`'s, else the last dim: shape
(..., *normalized_shape). y has the input's
dtype; the statistics and all sums are fp32. Weights are float32 or the input's dtype. With a
`residual`, h = input + residual is normalised and both are returned: (y, h), h rounded to the
input's dtype as y is (the fused residual add of pre-norm transformers).
"""
import torch

from . import _ops

# F.rms_norm's eps when None: the machine epsilon of the type it computes in, float32 for the
# dtypes the kernels take.
_RMS_DEFAULT_EPS = torch.finfo(torch.float32).eps


def _norm(kind, input, weight, bias, eps, residual, zero_centered, normalized_shape, reduction):
    fn = _ops.FUNCTION_NAMES[kind]
    if not isinstance(input, torch.Tensor):
        raise TypeError("%s: input must be a torch.Tensor, got %s" % (fn, type(input).__name__))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError("%s: eps must be a number, got %r" % (fn, eps))
    code = _ops.REDUCTIONS.get(reduction) if isinstance(reduction, str) else None
    if code is None:
        raise ValueError("%s: reduction must be one of %s, got %r"
                         % (fn, ", ".join(map(repr, _ops.REDUCTIONS)), reduction))
    shape = _normalized_shape(fn, input, weight, bias, normalized_shape)
    cols = 1
    for s in shape:
        cols *= s
    lead = tuple(input.shape[:input.dim() - len(shape)])
    x = _rows_of(fn, "input", input, lead, cols)
    r = None
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError("%s: residual must be a torch.Tensor or None, got %s"
                            % (fn, type(residual).__name__))
        if residual.shape != input.shape:
            raise ValueError("%s: residual has shape %s, input has shape %s: they must be the same"
                             % (fn, _ops._shape(residual), _ops._shape(input)))
        r = _rows_of(fn, "residual", residual, lead, cols)
    w = _rows_of(fn, "weight", weight, (), cols) if weight is not None else None
    b = _rows_of(fn, "bias", bias, (), cols) if bias is not None else None
    save_stats = wants_statistics(input, residual, weight, bias)
    y, h, _, _ = _ops.norm_forward(x, r, w, b, kind, float(eps), bool(zero_centered), code,
                                   save_stats)
    y = y.view(input.shape)
    return (y, h.view(input.shape)) if residual is not None else y


def wants_statistics(input, residual, weight, bias):
    """Whether a backward may follow: grad mode on and a tensor that requires grad (else the
    forward keeps no statistics)."""
    return torch.is_grad_enabled() and (
        input.requires_grad or (residual is not None and residual.requires_grad) or
        (weight is not None and weight.requires_grad) or (bias is not None and bias.requires_grad))


def _normalized_shape(fn, input, weight, bias, normalized_shape):
    """The trailing dims normalised over, checked against the input's, the weight's and the
    bias's shapes."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and not isinstance(p, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor or None, got %s"
                            % (fn, name, type(p).__name__))
    if normalized_shape is not None:
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(normalized_shape))
        if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError("%s: normalized_shape must be a positive int or a non-empty sequence "
                             "of them, got %r" % (fn, normalized_shape))
    else:
        ref = weight if weight is not None else bias
        if ref is not None and ref.dim() == 0:
            raise ValueError("%s: %s is a 0-dim tensor: it needs the shape of the normalised "
                             "trailing dimensions"
                             % (fn, "weight" if weight is not None else "bias"))
        shape = tuple(ref.shape) if ref is not None else tuple(input.shape[-1:])
    if input.dim() < len(shape) or tuple(input.shape[input.dim() - len(shape):]) != shape:
        source = ("normalized_shape is %s" % (shape,) if normalized_shape is not None else
                  "weight has shape %s" % (shape,) if weight is not None else
                  "bias has shape %s" % (shape,))
        raise ValueError("%s: %s, but input has shape %s: its trailing dimensions must be %s"
                         % (fn, source, _ops._shape(input), shape))
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError("%s: %s has shape %s, expected %s (the normalised trailing "
                             "dimensions of input, shape %s)"
                             % (fn, name, _ops._shape(p), shape, _ops._shape(input)))
    return shape


def _rows_of(fn, name, t, lead, cols):
    """t as (*lead, cols), contiguous: a copy when its rows are apart in memory, an error when the
    values of a row are (the kernels read each row as adjacent values). A contiguous 1-D weight
    or bias of cols values (the modules' own) is returned as it is."""
    if not lead and t.dim() == 1 and t.shape[0] == cols and t.is_contiguous():
        return t
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError("%s: %s's last dimension is not contiguous (shape %s, strides %s): the "
                         "kernels read rows of adjacent values; pass %s.contiguous()"
                         % (fn, name, _ops._shape(t), tuple(t.stride()), name))
    return t.contiguous().view(*lead, cols)


def rms_norm(input, weight=None, bias=None, eps=None, residual=None, zero_centered=False, *,
             normalized_shape=None, reduction="auto"):
    """RMSNorm: y = input / sqrt(mean(input^2) + eps) * weight (+ bias), over the trailing dims
    normalized_shape names (else weight's, else bias's, else the last). eps=None is F.rms_norm's
    default (float32's machine epsilon). zero_centered: the scale is 1 + weight. reduction: 'auto',
    'locked' or 'grid', how dw / db are summed over rows in the backward. With a residual,
    returns (y, h), y being the norm of h = input + residual."""
    return _norm(_ops.RMS, input, weight, bias, _RMS_DEFAULT_EPS if eps is None else eps, residual,
                 zero_centered, normalized_shape, reduction)


def layer_norm(input, weight=None, bias=None, eps=1e-5, residual=None, zero_centered=False, *,
               normalized_shape=None, reduction="auto"):
    """LayerNorm: y = (input - mean) / sqrt(var + eps) * weight + bias, over the trailing dims
    normalized_shape names (else weight's, else bias's, else the last); var is the biased
    variance, as in F.layer_norm. Other arguments as rms_norm."""
    return _norm(_ops.LAYER, input, weight, bias, eps, residual, zero_centered, normalized_shape,
                 reduction)
