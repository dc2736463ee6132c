"""tests/python/test_package.py: what the package does without a GPU, so that CI runs it: import,
the errors a PyTorch user meets (each names the argument), the modules' API against torch.nn's,
shapes and dtypes through the ops' Meta implementations, torch.library.opcheck and
torch.compile(fullgraph=True) traced on meta tensors, the missing-library message, the autograd
formula registered in C++, and the C ABI's argument checks through ctypes (which need no GPU).

Shapes: M rows of N values; meta tensors stand in for CUDA ones (same checks, no kernels).
"""
import ctypes
import inspect
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fusegrad
from fusegrad import _library

META = "meta"


def meta(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=META, dtype=dtype, requires_grad=grad)


# ---- import and availability -------------------------------------------------------------------

def test_import_needs_no_gpu_and_says_why_unavailable():
    assert fusegrad.__version__
    if not torch.cuda.is_available():
        assert not fusegrad.is_available()
        assert "CUDA" in fusegrad.why_unavailable()


def _fresh_import(code, library):
    """Runs `code` after `import fusegrad` in a new interpreter whose ops' library is `library`."""
    env = dict(os.environ, FUSEGRAD_TORCH_LIBRARY=str(library),
               PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", "import fusegrad, torch\n" + code], env=env,
                          capture_output=True, text=True)


def test_missing_library_is_a_clear_error_at_the_first_call(tmp_path):
    # Importing and building modules work without the library; the first call says what is
    # missing and how to get it.
    missing = tmp_path / "nowhere" / "libfusegrad_torch.so"
    out = _fresh_import("m = fusegrad.LayerNorm(8)\n"
                        "ok, why = fusegrad._library.status(); assert not ok\n"
                        "try:\n    m(torch.randn(2, 8, device='meta'))\n"
                        "except fusegrad.LibraryError as e:\n    print(e)\n", missing)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert str(missing) in text and "FUSEGRAD_TORCH_LIBRARY" in text
    assert "pip install --no-build-isolation ." in text


def test_library_that_is_not_ours(tmp_path):
    not_ours = tmp_path / "libfusegrad_torch.so"
    not_ours.write_bytes(b"not an ELF file")
    out = _fresh_import("print(fusegrad._library.status()[1])", not_ours)
    assert out.returncode == 0, out.stderr
    assert "could not load" in out.stdout and str(not_ours) in out.stdout


# ---- errors that name the argument -------------------------------------------------------------

def test_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match=r"fusegrad.layer_norm: input is on cpu.*CUDA"):
        fusegrad.layer_norm(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"fusegrad.rms_norm: input is on cpu"):
        fusegrad.RMSNorm(8)(torch.randn(4, 8))
    # Reaching the op directly gives the same message (not the dispatcher's).
    with pytest.raises(ValueError, match=r"input is on cpu"):
        torch.ops.fusegrad.norm_forward(torch.randn(4, 8), None, None, None, 1, 1e-5, False, 0,
                                        False)


@pytest.mark.parametrize("fn", [fusegrad.rms_norm, fusegrad.layer_norm])
@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(input=meta(4, 8).double()), TypeError, r"input is float64: the kernels take float32"),
    (dict(input=meta(4, 8).int()), TypeError, r"input is int32"),
    (dict(input="x"), TypeError, r"input must be a torch.Tensor, got str"),
    (dict(input=meta(4, 0)), ValueError, r"non-empty last dimension"),
    (dict(input=meta(8, 4).t()), ValueError, r"input's last dimension is not contiguous"),
    (dict(input=meta(4, 8), weight=meta(7)), ValueError,
     r"weight has shape \(7,\), but input has shape \(4, 8\)"),
    (dict(input=meta(4, 8), weight=meta(8), bias=meta(9)), ValueError,
     r"bias has shape \(9,\), expected \(8,\)"),
    (dict(input=meta(4, 8), weight=meta(16)[::2]), ValueError,
     r"weight's last dimension is not contiguous"),
    (dict(input=meta(4, 8), weight=meta(8, dtype=torch.float16)), TypeError,
     r"weight is float16, input is float32: weights must be float32 or the input's dtype"),
    (dict(input=meta(4, 8, dtype=torch.bfloat16), weight=meta(8, dtype=torch.float16)), TypeError,
     r"weight is float16, input is bfloat16"),
    (dict(input=meta(4, 8, dtype=torch.bfloat16), weight=meta(8),
          bias=meta(8, dtype=torch.bfloat16)), TypeError,
     r"weight is float32 and bias is bfloat16: they must be the same dtype"),
    (dict(input=meta(4, 8), residual=meta(4, 9)), ValueError,
     r"residual has shape \(4, 9\), input has shape \(4, 8\)"),
    (dict(input=meta(4, 8), residual=meta(4, 8, dtype=torch.float16)), TypeError,
     r"residual is float16, input is float32"),
    (dict(input=meta(4, 8), residual=meta(8, 4).t()), ValueError,
     r"residual's last dimension is not contiguous"),
    (dict(input=meta(4, 8), eps=0.0), ValueError, r"eps must be a finite number > 0, got 0.0"),
    (dict(input=meta(4, 8), eps=float("nan")), ValueError, r"eps must be a finite number"),
    (dict(input=meta(4, 8), eps="small"), TypeError, r"eps must be a number, got 'small'"),
    (dict(input=meta(4, 8), reduction="fast"), ValueError,
     r"reduction must be one of 'auto', 'locked', 'grid', got 'fast'"),
    (dict(input=meta(4, 8), zero_centered=True), ValueError,
     r"zero_centered=True needs a weight"),
    (dict(input=meta(4, 8), normalized_shape=(3, 8)), ValueError,
     r"normalized_shape is \(3, 8\), but input has shape \(4, 8\)"),
    (dict(input=meta(4, 8), normalized_shape=0), ValueError, r"normalized_shape must be"),
])
def test_bad_arguments_name_what_is_wrong(fn, kwargs, error, pattern):
    name = "fusegrad.%s" % fn.__name__
    with pytest.raises(error, match=pattern) as e:
        fn(**kwargs)
    assert str(e.value).startswith(name + ": ")


def test_weight_on_another_device_is_refused():
    x = meta(4, 8)
    with pytest.raises(ValueError, match=r"weight is on cpu, input is on meta"):
        fusegrad.layer_norm(x, torch.ones(8))


def test_module_fast_path_checks_eps_as_the_functions_do():
    # The module's common case skips functional.py, not its checks: eps=None is RMSNorm's
    # default only, and eps must be a number.
    x = meta(4, 8)
    with pytest.raises(TypeError, match=r"fusegrad.layer_norm: eps must be a number, got None"):
        fusegrad.LayerNorm(8, eps=None, device=META)(x)
    m = fusegrad.RMSNorm(8, device=META)
    m.eps = "small"
    with pytest.raises(TypeError, match=r"fusegrad.rms_norm: eps must be a number, got 'small'"):
        m(x)
    assert fusegrad.RMSNorm(8, device=META)(x).shape == x.shape  # eps=None: PyTorch's default


def test_module_arguments_are_checked():
    with pytest.raises(ValueError, match=r"fusegrad.LayerNorm: reduction must be one of"):
        fusegrad.LayerNorm(8, reduction="parallel")
    with pytest.raises(ValueError, match=r"normalized_shape must be positive"):
        fusegrad.RMSNorm(0)
    with pytest.raises(ValueError, match=r"zero_centered=True needs elementwise_affine=True"):
        fusegrad.RMSNorm(8, elementwise_affine=False, zero_centered=True)


# ---- shapes and dtypes through the fake implementations -----------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("wdtype", ["f32", "same"])
def test_outputs_have_the_input_shape_and_dtype(dtype, wdtype):
    wt = torch.float32 if wdtype == "f32" else dtype
    x = meta(2, 3, 5, 64, dtype=dtype, grad=True)
    w = meta(64, dtype=wt, grad=True)
    b = meta(64, dtype=wt, grad=True)
    r = meta(2, 3, 5, 64, dtype=dtype, grad=True)
    y = fusegrad.layer_norm(x, w, b)
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == META
    y, h = fusegrad.rms_norm(x, w, residual=r)
    assert y.shape == h.shape == x.shape and h.dtype == dtype
    (y.sum() + h.sum()).backward()
    assert x.grad.shape == x.shape and r.grad.shape == r.shape
    assert w.grad.shape == (64,) and w.grad.dtype == wt
    assert b.grad is None  # rms_norm above took no bias; layer_norm's y was not used


def test_normalized_shape_of_several_dims():
    x = meta(3, 4, 8, grad=True)
    m = fusegrad.LayerNorm((4, 8), device=META)
    y = m(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert m.weight.grad.shape == (4, 8) and x.grad.shape == x.shape
    assert fusegrad.rms_norm(x, normalized_shape=(4, 8)).shape == x.shape


def test_no_statistics_without_grad():
    x = meta(16, 8)
    _, _, mean, rstd = torch.ops.fusegrad.norm_forward(x, None, None, None, 1, 1e-5, False, 0,
                                                       False)
    assert mean.numel() == 0 and rstd.numel() == 0
    _, _, mean, rstd = torch.ops.fusegrad.norm_forward(x, None, None, None, 1, 1e-5, False, 0,
                                                       True)
    assert mean.shape == rstd.shape == (16,) and rstd.dtype == torch.float32
    _, _, mean, rstd = torch.ops.fusegrad.norm_forward(x, None, None, None, 0, 1e-5, False, 0,
                                                       True)
    assert mean.numel() == 0 and rstd.shape == (16,)  # RMSNorm keeps no mean


# ---- the modules against torch.nn ---------------------------------------------------------------

def _params(cls):
    return {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and v.kind != inspect.Parameter.KEYWORD_ONLY}


def test_module_signatures_match_torch():
    assert _params(fusegrad.LayerNorm) == _params(nn.LayerNorm)
    ours, theirs = _params(fusegrad.RMSNorm), _params(nn.RMSNorm)
    assert ours.pop("bias") is False  # fusegrad's RMSNorm can also have a bias; torch's has none
    assert ours == theirs


@pytest.mark.parametrize("cls, ref, kwargs", [
    (fusegrad.LayerNorm, nn.LayerNorm, {}),
    (fusegrad.LayerNorm, nn.LayerNorm, dict(bias=False)),
    (fusegrad.LayerNorm, nn.LayerNorm, dict(elementwise_affine=False)),
    (fusegrad.RMSNorm, nn.RMSNorm, {}),
    (fusegrad.RMSNorm, nn.RMSNorm, dict(eps=1e-6)),
])
def test_modules_hold_what_torch_holds(cls, ref, kwargs):
    ours, theirs = cls((4, 6), **kwargs), ref((4, 6), **kwargs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    theirs_sd = {k: torch.randn_like(v) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs_sd)
    assert ours.normalized_shape == theirs.normalized_shape and ours.eps == theirs.eps
    assert repr(ours).startswith(cls.__name__ + "((4, 6), eps=")


def test_module_options():
    m = fusegrad.RMSNorm(8, bias=True, zero_centered=True, reduction="locked",
                         dtype=torch.bfloat16)
    assert torch.equal(m.weight, torch.zeros(8, dtype=torch.bfloat16))  # scale 1 + 0
    assert m.bias is not None and m.weight.dtype == torch.bfloat16
    assert "zero_centered=True" in repr(m) and "reduction='locked'" in repr(m)


def test_replace_norms_shares_parameters():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Sequential(nn.RMSNorm(8, eps=1e-6)),
                          nn.LayerNorm(8, bias=False))
    w = model[1].weight
    assert fusegrad.replace_norms(model, reduction="grid") == 3
    assert isinstance(model[1], fusegrad.LayerNorm) and model[1].weight is w
    assert isinstance(model[2][0], fusegrad.RMSNorm) and model[2][0].eps == 1e-6
    assert model[3].bias is None and model[1].reduction == "grid"
    assert fusegrad.replace_norms(model) == 0


# ---- torch.library: opcheck and torch.compile on meta tensors -----------------------------------

def test_opcheck_on_meta():
    x, w, b, r = meta(6, 32, grad=True), meta(32, grad=True), meta(32, grad=True), meta(6, 32)
    for args in [(x, None, w, b, 1, 1e-5, False, 0, True), (x, r, w, None, 0, 1e-6, True, 2, True),
                 (x, None, None, None, 0, 1e-6, False, 1, False)]:
        torch.library.opcheck(torch.ops.fusegrad.norm_forward.default, args)
    stats = torch.empty(6, device=META)
    torch.library.opcheck(torch.ops.fusegrad.norm_backward.default,
                          (meta(6, 32), meta(6, 32), x.detach(), w.detach(), stats, stats, 1,
                           False, 2, torch.float32, True, True))


class _Tiny(nn.Module):
    """Two pre-norm residual blocks with every kind of fusegrad norm."""

    def __init__(self, n, device):
        super().__init__()
        self.ln = fusegrad.LayerNorm(n, device=device)
        self.rms = fusegrad.RMSNorm(n, device=device, zero_centered=True)
        self.fc = nn.Linear(n, n, device=device)

    def forward(self, x):
        y, h = self.ln(x, residual=self.fc(x))
        return self.rms(self.fc(y) + h)


def test_compile_traces_without_graph_breaks_on_meta():
    torch._dynamo.reset()
    model = _Tiny(16, META)
    x = meta(4, 16, grad=True)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert out.shape == x.shape and x.grad.shape == x.shape
    assert model.ln.weight.grad.shape == (16,) and model.rms.weight.grad.shape == (16,)


# ---- autograd: the formula registered in C++ -------------------------------------------------

def test_autograd_calls_the_backward_op_from_cpp():
    """norm_forward's derivative is a C++ autograd node (no Python on the way back), which calls
    norm_backward: its gradients have the shapes and dtypes of the inputs, and the statistics none."""
    x, w = meta(4, 8, grad=True), meta(8, grad=True)
    y, h, mean, rstd = torch.ops.fusegrad.norm_forward(x, None, w, None, 0, 1e-5, False, 0, True)
    assert "NormFunction" in y.grad_fn.name() and type(y.grad_fn).__name__ != "BackwardCFunction"
    assert not mean.requires_grad and not rstd.requires_grad
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    # Without statistics there is nothing to differentiate with: the backward says so.
    y, _, _, _ = torch.ops.fusegrad.norm_forward(x, None, w, None, 0, 1e-5, False, 0, False)
    with pytest.raises(RuntimeError, match=r"fusegrad.rms_norm: the forward ran with "
                                           r"save_stats=False"):
        y.sum().backward()


class _OpLog(TorchDispatchMode):
    """The ops that reach the backends while it is on."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_unused_outputs_cost_nothing_in_the_backward():
    """No zeros are made for the gradients of unused outputs, and when only h = x + residual is
    used its gradient passes to both without the backward kernels."""
    x, r, w = meta(4, 8, grad=True), meta(4, 8, grad=True), meta(8, grad=True)
    y, h, _, _ = torch.ops.fusegrad.norm_forward(x, r, w, None, 0, 1e-5, False, 0, True)
    with _OpLog() as log:
        torch.autograd.grad(h.sum(), [x, r])
    assert not any("norm_backward" in op or "zeros" in op for op in log.ops), log.ops
    y, h, _, _ = torch.ops.fusegrad.norm_forward(x, r, w, None, 0, 1e-5, False, 0, True)
    with _OpLog() as log:
        torch.autograd.grad(y.sum(), [x, r, w])
    assert "fusegrad.norm_backward.default" in log.ops
    assert not any("zeros" in op or "fill" in op for op in log.ops), log.ops


def test_double_backward_is_refused():
    x, w = meta(4, 8, grad=True), meta(8, grad=True)
    y = torch.ops.fusegrad.norm_forward(x, None, w, None, 1, 1e-5, False, 0, True)[0]
    gx, = torch.autograd.grad(y.sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match=r"not implemented"):
        torch.autograd.grad(gx.sum(), [w])


def test_backward_op_checks_its_dtypes():
    saved, dy, stats = meta(4, 8, dtype=torch.bfloat16), meta(4, 8, dtype=torch.bfloat16), \
        torch.empty(4, device=META)
    with pytest.raises(TypeError, match=r"param_dtype is float64, the saved input is bfloat16"):
        torch.ops.fusegrad.norm_backward(dy, None, saved, None, stats, stats, 0, False, 0,
                                         torch.float64, False, False)
    with pytest.raises(TypeError, match=r"weight is float32, param_dtype is bfloat16"):
        torch.ops.fusegrad.norm_backward(dy, None, saved, meta(8), stats, stats, 0, False, 0,
                                         torch.bfloat16, True, False)
    with pytest.raises(ValueError, match=r"saved is not contiguous"):
        torch.ops.fusegrad.norm_backward(dy, None, meta(8, 4, dtype=torch.bfloat16).t(), None,
                                         stats, stats, 0, False, 0, torch.float32, False, False)


# The operators' own checks of what the functions never send (they check or build these first):
# each refused on meta tensors, by name.
_X, _S = (lambda: meta(4, 8)), (lambda: torch.empty(4, device=META))


@pytest.mark.parametrize("op, make_args, error, pattern", [
    ("norm_forward", lambda: (_X(), None, None, None, 2, 1e-5, False, 0, True), ValueError,
     r"^fusegrad::norm_forward: kind must be 0 \(RMSNorm\) or 1 \(LayerNorm\), got 2"),
    ("norm_forward", lambda: (_X(), None, None, None, 0, 1e-5, False, 5, True), ValueError,
     r"^fusegrad.rms_norm: reduction must be one of 'auto', 'locked', 'grid', got 5"),
    ("norm_forward", lambda: (_X(), None, meta(7), None, 1, 1e-5, False, 0, True), ValueError,
     r"^fusegrad.layer_norm: weight has shape \(7,\), but the input's rows have 8 values: it "
     r"must have shape \(8,\)"),
    ("norm_backward", lambda: (_X(), None, _X(), None, _S(), _S(), 3, False, 0, torch.float32,
                               False, False), ValueError,
     r"^fusegrad::norm_backward: kind must be 0 \(RMSNorm\) or 1 \(LayerNorm\), got 3"),
    ("norm_backward", lambda: (meta(4, 9), None, _X(), None, _S(), _S(), 0, False, 0,
                               torch.float32, False, False), ValueError,
     r"grad_y is float32 \(4, 9\), the saved input is float32 \(4, 8\)"),
    ("norm_backward", lambda: (_X(), meta(4, 8, dtype=torch.bfloat16), _X(), None, _S(), _S(), 0,
                               False, 0, torch.float32, False, False), ValueError,
     r"grad_h is bfloat16 \(4, 8\), the saved input is float32 \(4, 8\)"),
    ("norm_backward", lambda: (_X(), None, _X(), None, _S(), torch.empty(3, device=META), 0,
                               False, 0, torch.float32, False, False), ValueError,
     r"rstd is float32 \(3,\), expected float32 \(4,\) \(the forward's statistics; a forward "
     r"run with save_stats=False has none\)"),
    ("norm_backward", lambda: (_X(), None, _X(), None, torch.empty(0, device=META), _S(), 1,
                               False, 0, torch.float32, False, False), ValueError,
     r"mean is float32 \(0,\), expected float32 \(4,\)"),
    ("norm_backward", lambda: (_X(), None, _X(), meta(7), _S(), _S(), 0, False, 0, torch.float32,
                               True, False), ValueError,
     r"weight has shape \(7,\), the input's rows have 8 values"),
    ("norm_backward", lambda: (_X(), None, _X(), None, _S(), _S(), 0, False, 0, torch.float32,
                               True, False), ValueError, r"want_dweight without a weight"),
    ("norm_backward", lambda: (_X(), None, _X(), None, _S(), _S(), 0, False, 3, torch.float32,
                               False, False), ValueError, r"reduction must be 0, 1 or 2, got 3"),
])
def test_operators_refuse_what_the_functions_never_send(op, make_args, error, pattern):
    with pytest.raises(error, match=pattern):
        getattr(torch.ops.fusegrad, op)(*make_args())


# ---- the C ABI's argument checks (no GPU needed) ------------------------------------------------

ABI_VERSION = 1  # capi/fusegrad_norm.h: FGN_ABI_VERSION


def _norm_library_path():
    """libfusegrad_norm.so: $FUSEGRAD_NORM_LIBRARY, else beside the ops' library."""
    return os.environ.get("FUSEGRAD_NORM_LIBRARY") or os.path.join(
        os.path.dirname(_library.library_path()), "libfusegrad_norm.so")


def _lib_or_skip():
    """The C ABI's library through ctypes, its functions declared."""
    path = _norm_library_path()
    if not os.path.isfile(path):
        pytest.skip("no libfusegrad_norm.so at %s" % path)
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    c_int, c_i64, c_f, c_p = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.fgn_abi_version.restype = c_int
    lib.fgn_last_error.restype = ctypes.c_char_p
    lib.fgn_norm_forward.argtypes = [c_int, c_int, c_int, c_i64, c_i64, c_f, c_int,
                                     c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_int, c_p]
    common = [c_int, c_int, c_int, c_i64, c_i64, c_int, c_int] + [c_p] * 9
    lib.fgn_norm_backward_workspace_bytes.argtypes = common + [c_int,
                                                               ctypes.POINTER(ctypes.c_size_t)]
    lib.fgn_norm_backward.argtypes = common + [c_p, ctypes.c_size_t, c_int, c_p]
    return lib


def _forward(lib, **over):
    a = dict(kind=0, x_dtype=0, w_dtype=0, rows=4, cols=8, eps=1e-5, zc=0, x=16, residual=None,
             h=None, weight=None, bias=None, y=32, mean=None, rstd=None, device=0, stream=None)
    a.update(over)
    rc = lib.fgn_norm_forward(*a.values())
    return rc, lib.fgn_last_error().decode()


def test_c_abi_version_and_exports():
    lib = _lib_or_skip()
    assert lib.fgn_abi_version() == ABI_VERSION
    out = subprocess.run(["nm", "-D", "--defined-only", _norm_library_path()],
                         capture_output=True, text=True)
    if out.returncode == 0:
        exported = [line.split()[-1] for line in out.stdout.splitlines()
                    if line.split()[1:2] == ["T"]]
        assert sorted(exported) == ["fgn_abi_version", "fgn_last_error", "fgn_norm_backward",
                                    "fgn_norm_backward_workspace_bytes", "fgn_norm_forward"]


@pytest.mark.parametrize("over, message", [
    (dict(kind=2), "kind must be FGN_RMS_NORM (0) or FGN_LAYER_NORM (1), got 2"),
    (dict(x_dtype=1), "x_dtype must be FGN_F32 (0), FGN_BF16 (2) or FGN_F16 (3), got 1"),
    (dict(w_dtype=2), "w_dtype must be FGN_F32 or x_dtype (FGN_F32), got 2 (FGN_BF16)"),
    (dict(rows=-1), "rows must be >= 0, got -1"),
    (dict(cols=0), "cols must be in 1..2^30, got 0"),
    (dict(cols=(1 << 30) + 1), "cols must be in 1..2^30"),
    (dict(zc=1), "zero_centered needs a weight (weight is NULL)"),
    (dict(device=-1), "device must be a CUDA device index >= 0, got -1"),
    (dict(eps=0.0), "eps must be finite and > 0, got 0"),
    (dict(eps=float("inf")), "eps must be finite and > 0"),
    (dict(residual=48), "h_out is NULL: a residual needs h_out"),
    (dict(h=48), "h_out is given without a residual"),
    (dict(kind=1, rstd=64), "mean and rstd must both be given"),
    (dict(x=None), "x is NULL"),
    (dict(y=None), "y is NULL"),
])
def test_c_abi_forward_refuses_bad_arguments(over, message):
    lib = _lib_or_skip()
    rc, text = _forward(lib, **over)
    assert rc == 1, text  # FGN_ERROR_ARGUMENT
    assert text.startswith("[fgn_norm_forward] " + message), text


def test_c_abi_no_rows_needs_no_gpu():
    lib = _lib_or_skip()
    assert _forward(lib, rows=0, x=None, y=None)[0] == 0  # no rows: nothing to do, no GPU asked


def test_c_abi_backward_refuses_bad_arguments():
    lib = _lib_or_skip()
    size = ctypes.c_size_t(7)
    base = dict(kind=1, x_dtype=2, w_dtype=0, rows=4, cols=8, zc=0, reduction=0, x=16, dy=32,
                dh=None, weight=None, mean=48, rstd=64, dx=80, dw=None, db=None)

    def query(**over):
        a = dict(base, **over)
        rc = lib.fgn_norm_backward_workspace_bytes(*a.values(), 0, ctypes.byref(size))
        return rc, lib.fgn_last_error().decode()

    fn = "[fgn_norm_backward_workspace_bytes] "
    assert query(reduction=3) == (1, fn + "reduction must be FGN_REDUCTION_AUTO (0), "
                                  "FGN_REDUCTION_LOCKED (1) or FGN_REDUCTION_GRID (2), got 3")
    assert query(dw=96) == (1, fn + "dweight is asked for but weight is NULL")
    assert query(mean=None) == (1, fn + "mean (LayerNorm) is NULL")
    assert query(dy=None) == (1, fn + "dy is NULL")
    assert query(w_dtype=3) == (1, fn + "w_dtype must be FGN_F32 or x_dtype (FGN_BF16), got 3 "
                                "(FGN_F16)")
    assert query(db=None)[0] == 0 and size.value == 0  # no dw / db: no workspace, no GPU asked
    a = dict(base, reduction=7)
    rc = lib.fgn_norm_backward(*a.values(), None, 0, 0, None)
    assert rc == 1 and "[fgn_norm_backward] reduction must be" in lib.fgn_last_error().decode()


def test_rms_norm_default_eps_is_torchs():
    # F.rms_norm's eps=None is float32's machine epsilon for 16-bit inputs too.
    x = torch.randn(4, 8).to(torch.bfloat16) * 1e-4
    default = F.rms_norm(x, (8,))
    assert torch.equal(default, F.rms_norm(x, (8,), eps=torch.finfo(torch.float32).eps))
    assert fusegrad.RMSNorm(8).eps is None
