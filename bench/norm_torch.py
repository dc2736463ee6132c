#!/usr/bin/env python3
"""bench/norm_torch.py: PyTorch's LayerNorm / RMSNorm (eager and torch.compile) on the shapes of
bench_norm, timed the same way (CUDA events, median, L2 flushed before every repetition, the host's
launches queued behind a GPU spin before the start event), so that
bench/norm_report.py can print both side by side. Writes JSON.

The forward is timed twice, as bench_norm times its own: as training runs it (inputs that require
grad, so the forward also saves what its backward needs: torch.compile's kernel then writes the
statistics too) and as inference runs it (under no_grad: y alone).

Usage: python3 bench/norm_torch.py [--json PATH] [--quick] [--no-compile]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timer import Timer  # bench/torch_timer.py (python3 puts bench/ on the path)

SHAPES = [(16384, 384), (16384, 768), (32768, 1024), (8192, 4096), (4096, 8192), (2048, 16384), (1024, 32768)]
QUICK = [(16384, 384), (16384, 768), (4096, 8192)]


def norm_fn(kind, n):
    if kind == "layernorm":
        return lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5)
    return lambda x, w, b: F.rms_norm(x, (n,), w, 1e-5)


def bench(timer, kind, dtype, m, n, compiled):
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype)).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda", dtype=dtype)).requires_grad_()
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    fn = norm_fn(kind, n)
    if compiled:
        fn = torch.compile(fn, dynamic=False)
    inputs = [x, w] + ([b] if kind == "layernorm" else [])
    with torch.no_grad():
        fwd_infer = timer.median_ms(lambda: fn(x, w, b))
    fwd_train = timer.median_ms(lambda: fn(x, w, b))
    y = fn(x, w, b)
    bwd = timer.median_ms(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True))
    s = x.element_size()
    return {
        "impl": "torch.compile" if compiled else "torch eager",
        "norm": kind,
        "dtype": "bf16" if dtype == torch.bfloat16 else "f32",
        "shape": f"{m}x{n}",
        "fwd_train_ms": fwd_train,
        "fwd_infer_ms": fwd_infer,
        "bwd_ms": bwd,
        "fwd_train_gbs": 2 * m * n * s / (fwd_train * 1e6),
        "fwd_infer_gbs": 2 * m * n * s / (fwd_infer * 1e6),
        "bwd_gbs": 3 * m * n * s / (bwd * 1e6),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="norm_torch.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 256
    timer = Timer()
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")  # 1 GiB, as bench_norm
    c = torch.empty_like(a)
    copy_ms = timer.median_ms(lambda: c.copy_(a))
    copy_gbs = 2 * a.numel() * a.element_size() / (copy_ms * 1e6)
    rows = []
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "copy_gbs": copy_gbs, "rows": rows}
    for dtype in (torch.bfloat16, torch.float32):
        for kind in ("layernorm", "rmsnorm"):
            for m, n in QUICK if args.quick else SHAPES:
                for compiled in (False,) if args.no_compile else (False, True):
                    r = bench(timer, kind, dtype, m, n, compiled)
                    rows.append(r)
                    print(f"{r['impl']:14} {kind:9} {r['dtype']:4} {r['shape']:>11} "
                          f"fwd {r['fwd_train_gbs']:7.0f} GB/s (inference {r['fwd_infer_gbs']:7.0f})"
                          f"  bwd {r['bwd_gbs']:7.0f} GB/s", flush=True)
                    with open(args.json, "w") as f:  # after every row: a time limit loses little
                        json.dump(out, f, indent=1)
    print(f"copy {copy_gbs:.0f} GB/s; wrote {args.json}")


if __name__ == "__main__":
    main()
