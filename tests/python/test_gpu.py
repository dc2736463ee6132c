"""tests/python/test_gpu.py: the kernels through the PyTorch package on a GPU (marked `gpu`: skipped
without one, unless $FUSEGRAD_REQUIRE_GPU is set).

Every result is checked against torch.nn.functional in float64 on the same rounded inputs (the
kernels do not take float64, so torch.autograd.gradcheck cannot run on them; the float64
reference stands in): F.layer_norm / F.rms_norm for the forward, torch.autograd through them for
the gradients. Then: the modules beside torch.nn's, replace_norms, PyTorch's current stream, CUDA
graph capture, torch.library.opcheck on CUDA tensors, torch.compile with fullgraph=True (static,
dynamic and reduce-overhead), the reductions' determinism, and the errors only a GPU can show.

Shapes: M rows (the product of the leading dims) of N values. Tolerances are norm-wise relative
errors, about four roundings of the output type: f32 2e-5, f16 2e-3, bf16 1.6e-2.
"""
import itertools
import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusegrad

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
FNS = {"rms": fusegrad.rms_norm, "layer": fusegrad.layer_norm}


@pytest.fixture(autouse=True)
def poisoned_allocator():
    """Fills freed blocks of PyTorch's caching allocator with NaN before each test, so that an
    output element a kernel fails to write shows up as NaN instead of a plausible leftover."""
    big = torch.full((64 << 20,), float("nan"), device="cuda")
    small = [torch.full((64 << 10,), float("nan"), device="cuda") for _ in range(64)]
    del big, small
    yield


def rel_err(a, ref, scale=0.0):
    """||a - ref|| / ||ref||, with ||ref|| taken as at least 1e-3 per element's root, so that a
    reference of exact zeros (LayerNorm's dx for one column) asks for values near zero, and as at
    least `scale`: the size of the terms whose difference the reference is, where they cancel."""
    a, ref = a.double(), ref.double()
    floor = max(1e-3 * math.sqrt(max(ref.numel(), 1)), scale)
    return ((a - ref).norm() / ref.norm().clamp_min(floor)).item()


def assert_close(name, a, ref, dtype, scale=0.0):
    assert a.shape == ref.shape, "%s: shape %s, expected %s" % (name, tuple(a.shape),
                                                                tuple(ref.shape))
    assert torch.isfinite(a).all(), "%s has non-finite values (unwritten?)" % name
    err = rel_err(a, ref, scale)
    assert err <= TOL[dtype], "%s: relative error %.3g > %.3g" % (name, err, TOL[dtype])


def make(shape, dtype, scale=1.0, shift=0.0, grad=True):
    t = (torch.randn(shape, device="cuda", dtype=torch.float32) * scale + shift).to(dtype)
    return t.requires_grad_(grad)


def reference(kind, x, weight, bias, eps, residual, zero_centered):
    """torch.nn.functional in float64 on the kernels' inputs: returns (y, h, h64, w64, b64), h64
    (and w64, b64) the float64 leaves the gradients are taken at, h = x + residual rounded to x's
    dtype as the kernels store it (x itself without a residual)."""
    if residual is not None:
        h = (x.detach().float() + residual.detach().float()).to(x.dtype)
    else:
        h = x.detach()
    h64 = h.double().requires_grad_()
    n = x.shape[-1]
    w64 = weight.detach().double().requires_grad_() if weight is not None else None
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    scale = (1.0 + w64 if zero_centered else w64) if w64 is not None else None
    if kind == "layer":
        y = F.layer_norm(h64, (n,), scale, b64, eps)
    else:
        y = F.rms_norm(h64, (n,), scale, eps)
        if b64 is not None:
            y = y + b64
    return y, h, h64, w64, b64


def check_case(kind, shape, dtype, wdtype, weight=True, bias=False, residual=False,
               zero_centered=False, reduction="auto", eps=1e-5, use_y=True, use_h=True):
    """One call of fusegrad's function, forward and backward, against the float64 reference."""
    n = shape[-1]
    x = make(shape, dtype, scale=1.5, shift=0.3)
    r = make(shape, dtype) if residual else None
    w = make((n,), wdtype, 0.2, 1.0) if weight else None
    if zero_centered and w is not None:
        w = make((n,), wdtype, 0.2)
    b = make((n,), wdtype, 0.2) if bias else None
    out = FNS[kind](x, w, b, eps, r, zero_centered, reduction=reduction)
    y, h = out if residual else (out, None)
    y_ref, h_ref, h64, w64, b64 = reference(kind, x, w, b, eps, r, zero_centered)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close("y", y, y_ref, dtype)
    if residual:
        assert torch.equal(h, h_ref), "h is not x + residual rounded to the input's dtype"
    dy = make(shape, dtype, grad=False)
    dh = make(shape, dtype, grad=False) if residual else None
    outs, grads = [], []
    if use_y:
        outs.append(y)
        grads.append(dy)
    if residual and use_h:
        outs.append(h)
        grads.append(dh)
    torch.autograd.backward(outs, grads)
    ref_loss = 0.0
    if use_y:
        ref_loss = ref_loss + (y_ref * dy.double()).sum()
    if residual and use_h:
        ref_loss = ref_loss + (h64 * dh.double()).sum()
    leaves = [t for t in (h64, w64, b64) if t is not None]
    ref_grads = torch.autograd.grad(ref_loss, leaves, allow_unused=True)
    dh_ref = ref_grads[0] if ref_grads[0] is not None else torch.zeros_like(h64)
    # dx = (g - x_hat c1 - c2) rstd with g = w' dy: its terms are of the size of g rstd, and in a
    # row of a few columns they nearly cancel (one column: 1 - x_hat^2, a few eps over x^2), so
    # there the error is measured against that size; longer rows keep the result's own size.
    with torch.no_grad():
        h = h64.detach()
        centred = h - h.mean(-1, keepdim=True) if kind == "layer" else h
        rstd = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
        g = dy.double() if use_y else torch.zeros_like(h)
        if w64 is not None:
            g = g * ((1.0 + w64) if zero_centered else w64).detach()
        term_size = (g * rstd).norm().item() if n <= 4 else 0.0
    assert_close("dx", x.grad, dh_ref, dtype, term_size)
    if residual:
        assert_close("dresidual", r.grad, dh_ref, dtype, term_size)
    k = 1
    for name, p, p64 in (("dweight", w, w64), ("dbias", b, b64)):
        if p is None:
            continue
        g_ref = ref_grads[k] if ref_grads[k] is not None else torch.zeros_like(p64)
        k += 1
        if g_ref.norm() == 0:  # y unused: no gradient, or a zero one
            assert p.grad is None or torch.count_nonzero(p.grad) == 0, name
            continue
        assert p.grad.dtype == p.dtype
        assert_close(name, p.grad, g_ref, p.dtype if p.dtype != torch.float32 else dtype)


# ---- accuracy ----------------------------------------------------------------------------------

SHAPES = [(1, 1), (3, 7), (5, 33), (2, 3, 100), (7, 1000), (4, 4097), (64, 384), (33, 1024),
          (9, 8192), (3, 32768), (2, 1 << 18)]
# (bias, residual, zero_centered, reduction), cycled over the shapes.
OPTIONS = [(True, False, False, "auto"), (False, True, False, "grid"),
           (True, True, True, "locked"), (False, False, True, "auto"),
           (True, True, False, "auto"), (False, False, False, "locked")]


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype, wdtype", [("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16"),
                                           ("f16", "f32"), ("f16", "f16")])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(kind, dtype, wdtype, shape):
    torch.manual_seed(zlib.crc32(repr((kind, dtype, wdtype, shape)).encode()))
    bias, residual, zc, reduction = OPTIONS[SHAPES.index(shape) % len(OPTIONS)]
    check_case(kind, shape, DTYPES[dtype], DTYPES[wdtype], bias=bias, residual=residual,
               zero_centered=zc, reduction=reduction)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("weight, bias, residual, zc, reduction", [
    c for c in itertools.product([True, False], [True, False], [True, False], [True, False],
                                 ["auto", "locked", "grid"]) if c[0] or not c[3]])
def test_every_option(kind, dtype, weight, bias, residual, zc, reduction):
    torch.manual_seed(7)
    check_case(kind, (37, 520), DTYPES[dtype], DTYPES[dtype], weight=weight, bias=bias,
               residual=residual, zero_centered=zc, reduction=reduction)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_only_one_of_y_and_h_used(kind):
    check_case(kind, (12, 256), torch.bfloat16, torch.float32, bias=True, residual=True,
               use_y=False)
    check_case(kind, (12, 256), torch.bfloat16, torch.float32, bias=True, residual=True,
               use_h=False)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_unaligned_pointers(dtype):
    # Views one element into a buffer: 16-byte vectors are impossible, the scalar path runs.
    dt = DTYPES[dtype]
    m, n = 19, 264
    buf = torch.randn(m * n + 1, device="cuda").to(dt)
    x = buf[1:].view(m, n).requires_grad_()
    wbuf = (1 + 0.1 * torch.randn(n + 1, device="cuda")).to(dt)
    w = wbuf[1:].detach().requires_grad_()
    assert x.data_ptr() % 16 != 0 and w.data_ptr() % 16 != 0
    y = fusegrad.layer_norm(x, w)
    y_ref, _, h64, w64, _ = reference("layer", x, w, None, 1e-5, None, False)
    assert_close("y", y, y_ref, dt)
    dy = torch.randn_like(y)
    y.backward(dy)
    gx, gw = torch.autograd.grad((y_ref * dy.double()).sum(), [h64, w64])
    assert_close("dx", x.grad, gx, dt)
    assert_close("dw", w.grad, gw, dt)


def test_zero_rows():
    x = torch.empty(0, 64, device="cuda", requires_grad=True)
    m = fusegrad.LayerNorm(64).cuda()
    y = m(x)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert torch.count_nonzero(m.weight.grad) == 0 and torch.count_nonzero(m.bias.grad) == 0


def test_frozen_parameters_get_no_gradient():
    m = fusegrad.LayerNorm(96).cuda().requires_grad_(False)
    x = make((8, 96), torch.float32)
    m(x).sum().backward()
    assert x.grad is not None and m.weight.grad is None and m.bias.grad is None


def test_inference_keeps_no_statistics():
    x = make((8, 96), torch.float32, grad=False)
    w = torch.ones(96, device="cuda", requires_grad=True)
    with torch.no_grad():
        y = fusegrad.rms_norm(x, w)
    assert not y.requires_grad
    y2, _, _, rstd = torch.ops.fusegrad.norm_forward(x, None, w.detach(), None, 0, 1e-6, False,
                                                     0, False)
    assert rstd.numel() == 0 and torch.isfinite(y2).all()


# ---- beside PyTorch's modules --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("ours, theirs, kwargs", [
    (fusegrad.LayerNorm, nn.LayerNorm, {}),
    (fusegrad.LayerNorm, nn.LayerNorm, dict(bias=False, eps=1e-6)),
    (fusegrad.RMSNorm, nn.RMSNorm, {}),
    (fusegrad.RMSNorm, nn.RMSNorm, dict(eps=1e-6)),
])
def test_modules_agree_with_torch(dtype, ours, theirs, kwargs):
    dt = DTYPES[dtype]
    torch.manual_seed(3)
    a = ours(384, device="cuda", dtype=dt, **kwargs)
    b = theirs(384, device="cuda", dtype=dt, **kwargs)
    with torch.no_grad():
        for p in b.parameters():
            p.normal_(1.0, 0.1)
    a.load_state_dict(b.state_dict())
    x = make((4, 50, 384), dt, 2.0, 0.5)
    x2 = x.detach().clone().requires_grad_()
    ya, yb = a(x), b(x2)
    dy = torch.randn_like(ya)
    ya.backward(dy)
    yb.backward(dy)
    tol = 2 * TOL[dt]  # both are roundings of the same float64 result
    assert rel_err(ya, yb) <= tol and rel_err(x.grad, x2.grad) <= tol
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert rel_err(pa.grad, pb.grad) <= tol


def test_normalized_shape_of_two_dims_agrees_with_torch():
    torch.manual_seed(4)
    a, b = fusegrad.LayerNorm((4, 32)).cuda(), nn.LayerNorm((4, 32)).cuda()
    with torch.no_grad():
        b.weight.normal_(1.0, 0.1)
        b.bias.normal_(0.0, 0.1)
    a.load_state_dict(b.state_dict())
    x = make((3, 5, 4, 32), torch.float32)
    x2 = x.detach().clone().requires_grad_()
    ya, yb = a(x), b(x2)
    ya.sum().backward()
    yb.sum().backward()
    assert rel_err(ya, yb) <= 1e-5 and rel_err(x.grad, x2.grad) <= 1e-4
    assert rel_err(a.weight.grad, b.weight.grad) <= 1e-5 and a.weight.grad.shape == (4, 32)


def test_replace_norms_keeps_the_model():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 64),
                          nn.RMSNorm(64)).cuda()
    x = torch.randn(16, 64, device="cuda")
    before = model(x)
    params = list(model.parameters())
    assert fusegrad.replace_norms(model) == 2
    now = list(model.parameters())
    assert len(now) == len(params) and all(a is b for a, b in zip(now, params))
    after = model(x)
    assert rel_err(after, before) <= 1e-5
    after.sum().backward()
    assert all(p.grad is not None for p in params)


# ---- streams, graphs, compile --------------------------------------------------------------------

def test_runs_on_the_current_stream():
    # On a side stream, the input is written after a long GPU spin. A kernel queued on any other
    # stream would read it before the write and return the norm of zeros.
    m = fusegrad.LayerNorm(1024).cuda()
    source = torch.randn(64, 1024, device="cuda")
    x = torch.zeros_like(source)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(source)
        y = m(x)
    side.synchronize()
    assert rel_err(y, F.layer_norm(source, (1024,), m.weight, m.bias)) <= 1e-5


def test_cuda_graph_capture_and_replay():
    m = fusegrad.RMSNorm(512, bias=True).cuda()
    x = torch.randn(32, 512, device="cuda", requires_grad=True)
    dy = torch.randn(32, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (plans, allocator)
        for _ in range(2):
            m(x).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    m.zero_grad(set_to_none=True)
    x.grad = None
    with torch.cuda.graph(graph):
        y = m(x)
        y.backward(dy)
    for _ in range(2):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            dy.copy_(torch.randn_like(dy))
        m.weight.grad.zero_()
        m.bias.grad.zero_()
        x.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        eps = torch.finfo(torch.float32).eps
        y_ref, _, h64, w64, b64 = reference("rms", x, m.weight, m.bias, eps, None, False)
        assert_close("y", y, y_ref, torch.float32)
        gx, gw, gb = torch.autograd.grad((y_ref * dy.double()).sum(), [h64, w64, b64])
        assert_close("dx", x.grad, gx, torch.float32)
        assert_close("dw", m.weight.grad, gw, torch.float32)
        assert_close("db", m.bias.grad, gb, torch.float32)


@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_opcheck_on_cuda(kind, dtype):
    dt = DTYPES[dtype]
    x, r = make((24, 200), dt), make((24, 200), dt)
    w, b = make((200,), torch.float32, 0.1, 1.0), make((200,), torch.float32, 0.1)
    for args in [(x, None, w, b, kind, 1e-5, False, 0, True),
                 (x, r, w, None, kind, 1e-6, True, 2, True),
                 (x, r, None, b, kind, 1e-5, False, 1, True),
                 (x.detach(), None, None, None, kind, 1e-5, False, 0, False)]:
        torch.library.opcheck(torch.ops.fusegrad.norm_forward.default, args)
    _, _, mean, rstd = torch.ops.fusegrad.norm_forward(x.detach(), None, w.detach(), None, kind,
                                                       1e-5, False, 0, True)
    dy = make((24, 200), dt, grad=False)
    torch.library.opcheck(torch.ops.fusegrad.norm_backward.default,
                          (dy, dy.clone(), x.detach(), w.detach(), mean, rstd, kind, False, 2,
                           torch.float32, True, True))


class Block(nn.Module):
    """A pre-norm residual block using the fused residual add, and a final norm."""

    def __init__(self, n, dtype=torch.float32):
        super().__init__()
        self.ln = fusegrad.LayerNorm(n, device="cuda")
        self.rms = fusegrad.RMSNorm(n, device="cuda", zero_centered=True, reduction="locked")
        self.fc = nn.Linear(n, n, device="cuda", dtype=dtype)

    def forward(self, x):
        y, h = self.ln(x, residual=self.fc(x))
        return self.rms(self.fc(y) + h)


def _run(model, x, graphs=False):
    if graphs:  # reduce-overhead: a new iteration of the CUDA graph trees
        torch.compiler.cudagraph_mark_step_begin()
    out = model(x)
    out.backward(torch.ones_like(out))
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    return out.detach().clone(), grads


@pytest.mark.parametrize("mode", ["default", "dynamic", "reduce-overhead"])
def test_torch_compile_fullgraph(mode):
    torch._dynamo.reset()
    torch.manual_seed(11)
    model = Block(256)
    kwargs = dict(fullgraph=True)
    if mode == "dynamic":
        kwargs["dynamic"] = True
    elif mode == "reduce-overhead":
        kwargs["mode"] = "reduce-overhead"
    compiled = torch.compile(model, **kwargs)
    for rows in ((8, 8) if mode != "dynamic" else (8, 13)):
        x = torch.randn(rows, 256, device="cuda", requires_grad=True)
        out_e, grads_e = _run(model, x)
        for _ in range(3 if mode == "reduce-overhead" else 1):  # record, then replay
            out_c, grads_c = _run(compiled, x, graphs=mode == "reduce-overhead")
        assert rel_err(out_c, out_e) <= 1e-5
        for ge, gc in zip(grads_e, grads_c):
            assert rel_err(gc, ge) <= 1e-5
    explanation = torch._dynamo.explain(model)(torch.randn(8, 256, device="cuda"))
    assert explanation.graph_break_count == 0


def test_compiled_graph_calls_the_custom_ops():
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch.compile(Block(64), backend=backend, fullgraph=True)(torch.randn(4, 64, device="cuda"))
    assert any("fusegrad.norm_forward" in s for s in seen), seen


# ---- the reductions --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_grid_reduction_is_deterministic_and_agrees_with_locked(dtype):
    dt = DTYPES[dtype]
    x = make((4096, 768), dt, grad=False)
    dy = make((4096, 768), dt, grad=False)
    w = torch.ones(768, device="cuda", requires_grad=True)
    b = torch.zeros(768, device="cuda", requires_grad=True)
    results = {}
    for reduction in ("grid", "grid", "locked"):
        xr = x.clone().requires_grad_()
        y = fusegrad.layer_norm(xr, w, b, reduction=reduction)
        gw, gb = torch.autograd.grad(y, [w, b], dy)
        if reduction in results:
            assert torch.equal(gw, results[reduction][0]) and torch.equal(gb, results[reduction][1])
        results[reduction] = (gw, gb)
    assert rel_err(results["locked"][0], results["grid"][0]) <= 1e-5
    assert rel_err(results["locked"][1], results["grid"][1]) <= 1e-5


# ---- errors only a GPU shows -----------------------------------------------------------------

def test_tensors_on_two_devices_are_refused():
    x = make((4, 32), torch.float32)
    with pytest.raises(ValueError,
                       match=r"fusegrad.layer_norm: weight is on cpu, input is on cuda:0"):
        fusegrad.layer_norm(x, torch.ones(32))
    with pytest.raises(ValueError,
                       match=r"fusegrad.rms_norm: residual is on cpu, input is on cuda"):
        fusegrad.rms_norm(x, residual=torch.ones(4, 32))
    with pytest.raises(ValueError, match=r"input is on cpu"):
        fusegrad.LayerNorm(32).cuda()(torch.ones(4, 32))


def test_backward_without_statistics_is_refused():
    x = make((4, 32), torch.float32)
    y, _, _, _ = fusegrad._ops.norm_forward(x, None, None, None, 1, 1e-5, False, 0, False)
    with pytest.raises(RuntimeError, match=r"save_stats=False"):
        y.sum().backward()


def test_autocast_leaves_the_dtypes_alone():
    m = fusegrad.LayerNorm(128).cuda()
    lin = nn.Linear(128, 128).cuda()
    x = torch.randn(16, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = lin(x)              # bf16 under autocast
        y = m(h)                # bf16 input, f32 weights: a bf16 result, f32 statistics inside
        z = m(x)                # f32 in, f32 out
    assert h.dtype == y.dtype == torch.bfloat16 and z.dtype == torch.float32
    y.float().sum().backward()
    assert m.weight.grad.dtype == torch.float32


def test_default_eps_matches_torch_rms_norm():
    x = make((8, 64), torch.bfloat16, 1e-3, grad=False)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    assert rel_err(fusegrad.rms_norm(x, w), F.rms_norm(x, (64,), w)) <= TOL[torch.bfloat16]
    assert math.isclose(torch.finfo(torch.float32).eps, 1.1920928955078125e-07)
