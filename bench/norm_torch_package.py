#!/usr/bin/env python3
"""bench/norm_torch_package.py: the PyTorch package's modules (fusegrad.LayerNorm, fusegrad.RMSNorm,
installed with `pip install .`) beside PyTorch eager, torch.compile, Liger-Kernel's LigerLayerNorm
/ LigerRMSNorm and QuACK's rmsnorm (each when it imports; QuACK has no differentiable LayerNorm),
on docs/norms.md section 6's shapes, timed as bench/norm_torch.py times PyTorch (bench/torch_timer.py: CUDA events, median, L2
flushed, the host's launches queued behind a GPU spin, so the GPU's work alone is timed).

Each case is M rows of N values, inputs that require grad (the training forward, which also keeps
what the backward needs). Timed: `fwd` (the module's forward) and `fwd+bwd` (forward, then the
gradients of input, weight and bias for a random dy). Effective bandwidth counts the tensors of
M x N values read and written once: fwd 2 (x, y), fwd+bwd 5 (x, y; x, dy, dx); the statistics
and the (N,) parameters are left out. `% copy` is that against a 1 GiB device-to-device copy
timed in the same run.

Weights are in the input's dtype for every implementation (as PyTorch's modules hold them in a
bf16 model); `fusegrad f32w` adds fusegrad with float32 weights for the bf16 rows (its kernels
take either). Liger's RMSNorm runs with in_place=False (its in-place backward writes dx over dy;
the bytes moved are the same). Every implementation's y is checked against PyTorch eager's (the
`err` column: norm-wise relative difference) so that a fast wrong kernel shows.

Usage: python3 bench/norm_torch_package.py [--json PATH] [--quick] [--only IMPL,...] [--table JSON]
"""
import argparse
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timer import Timer  # noqa: E402  (bench/torch_timer.py)

SHAPES = [(16384, 384), (32768, 1024), (8192, 4096), (4096, 8192), (2048, 16384), (1024, 32768)]
QUICK = [(16384, 384), (4096, 8192)]
EPS = 1e-5


def fusegrad_module(kind, n, dtype, weight_dtype):
    import fusegrad
    cls = fusegrad.LayerNorm if kind == "layernorm" else fusegrad.RMSNorm
    return cls(n, eps=EPS, device="cuda", dtype=weight_dtype)


def torch_module(kind, n, dtype):
    cls = nn.LayerNorm if kind == "layernorm" else nn.RMSNorm
    return cls(n, eps=EPS, device="cuda", dtype=dtype)


def liger_module(kind, n, dtype):
    from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm
    if kind == "layernorm":
        m = LigerLayerNorm(n, eps=EPS, bias=True)
    else:
        m = LigerRMSNorm(n, eps=EPS, in_place=False)
    return m.to(device="cuda", dtype=dtype)


class QuackNorm(nn.Module):
    """QuACK's differentiable RMSNorm (quack.rmsnorm) behind a module of the same parameters;
    QuACK (0.6) ships LayerNorm's forward and backward kernels but no autograd function for them,
    so LayerNorm is not timed for it."""

    def __init__(self, kind, n, dtype):
        super().__init__()
        import quack
        if kind != "rmsnorm":
            raise NotImplementedError("QuACK has no differentiable LayerNorm")
        self.fn = quack.rmsnorm
        self.weight = nn.Parameter(torch.ones(n, device="cuda", dtype=dtype))

    def forward(self, x):
        return self.fn(x, self.weight, eps=EPS)


def implementations(kind, n, dtype):
    """(name, zero-argument factory) for every implementation, in table order."""
    impls = [("fusegrad", lambda: fusegrad_module(kind, n, dtype, dtype))]
    if dtype != torch.float32:
        impls.append(("fusegrad f32w", lambda: fusegrad_module(kind, n, dtype, torch.float32)))
    impls += [
        ("torch eager", lambda: torch_module(kind, n, dtype)),
        ("torch.compile", lambda: torch.compile(torch_module(kind, n, dtype), dynamic=False)),
        ("liger", lambda: liger_module(kind, n, dtype)),
        ("quack", lambda: QuackNorm(kind, n, dtype)),
    ]
    return impls


def randomise(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            centre = 1.0 if "weight" in name else 0.0
            p.copy_(torch.randn_like(p, dtype=torch.float32) * 0.1 + centre)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_case(timer, kind, dtype, m, n, only):
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    ref_module = torch_module(kind, n, dtype)
    randomise(ref_module)
    params_ref = {k: v.detach().clone() for k, v in ref_module.named_parameters()}
    y_ref = ref_module(x).detach()
    s = x.element_size()
    rows = []
    for name, factory in implementations(kind, n, dtype):
        if only and name not in only:
            continue
        row = {"impl": name, "norm": kind, "dtype": str(dtype).replace("torch.", ""),
               "shape": "%dx%d" % (m, n)}
        try:
            module = factory()
            inner = getattr(module, "_orig_mod", module)
            with torch.no_grad():  # the same parameters for everyone
                for k, p in inner.named_parameters():
                    p.copy_(params_ref[k].to(p.dtype))
            params = [p for p in module.parameters()]
            y = module(x)
            row["err"] = rel_err(y, y_ref)
            fwd = timer.median_ms(lambda: module(x))
            both = timer.median_ms(lambda: torch.autograd.grad(module(x), [x] + params, dy))
            row.update(fwd_ms=fwd, fwdbwd_ms=both,
                       fwd_gbs=2 * m * n * s / (fwd * 1e6), fwdbwd_gbs=5 * m * n * s / (both * 1e6))
        except Exception as e:  # an implementation missing or failing here: say so, go on
            first = str(e).splitlines()[0][:160] if str(e) else ""
            row["error"] = "%s: %s" % (type(e).__name__, first)
        rows.append(row)
        del row
    return rows


def table(out):
    """The results as a markdown table: GB/s (% of copy) per implementation, fwd | fwd+bwd."""
    copy = out["copy_gbs"]
    impls = []
    for r in out["rows"]:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    cases = []
    for r in out["rows"]:
        key = (r["norm"], r["dtype"], r["shape"])
        if key not in cases:
            cases.append(key)
    lines = ["| norm, dtype | M x N | pass | " + " | ".join(impls) + " | fusegrad / best other |",
             "| --- | --- | --- | " + " | ".join("---" for _ in impls) + " | --- |"]
    by = {(r["norm"], r["dtype"], r["shape"], r["impl"]): r for r in out["rows"]}
    for norm, dtype, shape in cases:
        for key, label in (("fwd_gbs", "fwd"), ("fwdbwd_gbs", "fwd+bwd")):
            cells, ours, others = [], None, []
            for impl in impls:
                r = by.get((norm, dtype, shape, impl))
                if r is None:
                    cells.append("")
                elif key not in r:
                    cells.append("n/a")
                else:
                    bad = " (err %.0e)" % r["err"] if r.get("err", 0) > 0.05 else ""
                    cells.append("%.0f (%.0f%%)%s" % (r[key], 100 * r[key] / copy, bad))
                    if impl == "fusegrad":
                        ours = r[key]
                    elif not impl.startswith("fusegrad"):
                        others.append(r[key])
            ratio = "%.2fx" % (ours / max(others)) if ours and others else ""
            lines.append("| %s %s | %s | %s | %s | %s |"
                         % (norm, dtype, shape.replace("x", " x "), label, " | ".join(cells),
                            ratio))
    return "\n".join(lines)


def copy_gbs(timer):
    """The device-to-device copy bandwidth of 1 GiB (as bench_norm measures it), bytes read and
    written."""
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    c = torch.empty_like(a)
    ms = timer.median_ms(lambda: c.copy_(a))
    return 2 * a.numel() * a.element_size() / (ms * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="norm_torch_package.json")
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    ap.add_argument("--only", default="", help="comma-separated implementation names")
    ap.add_argument("--table", metavar="JSON", help="print the table of an earlier run and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return
    torch._dynamo.config.cache_size_limit = 256
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    timer = Timer()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "copy_gbs": copy_gbs(timer), "rows": []}
    for name in ("fusegrad", "liger_kernel", "quack", "triton"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception as e:
            why = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
            out[name] = "not importable: %s" % why
    print("%s, torch %s, copy %.0f GB/s; fusegrad %s, liger %s, quack %s"
          % (out["device"], out["torch"], out["copy_gbs"], out["fusegrad"], out["liger_kernel"],
             out["quack"]), flush=True)
    start = time.time()
    for dtype in (torch.bfloat16, torch.float32):
        for kind in ("layernorm", "rmsnorm"):
            for m, n in QUICK if args.quick else SHAPES:
                for r in bench_case(timer, kind, dtype, m, n, only):
                    out["rows"].append(r)
                    if "error" in r:
                        line = "error: " + r["error"]
                    else:
                        line = "fwd %6.0f GB/s  fwd+bwd %6.0f GB/s  err %.1e" % (
                            r["fwd_gbs"], r["fwdbwd_gbs"], r["err"])
                    print("%-13s %-9s %-8s %11s  %s" % (r["impl"], kind, r["dtype"], r["shape"],
                                                        line), flush=True)
                out["timer_lead_cycles"], out["timer_host_bound_reps"] = timer.lead, timer.host_bound
                with open(args.json, "w") as f:  # after every case: a time limit loses little
                    json.dump(out, f, indent=1)
    print("%.0f s; wrote %s; the GPU spun %d cycles before each timed region, %d repetitions were"
          " still host-bound\n" % (time.time() - start, args.json, timer.lead, timer.host_bound))
    print(table(out))


if __name__ == "__main__":
    main()
