#!/usr/bin/env python3
"""bench/norm_torch_overhead.py: where the time of a fusegrad norm call from PyTorch goes, beside
PyTorch's own module and Liger-Kernel's (when its source is given): the host's time to launch a
forward + backward (Python, the dispatcher, autograd), the GPU's time for it as
bench/torch_timer.py measures it (and how long the GPU had to spin before the timed region for
the host to finish launching), and the sum of the kernels' own times from the profiler. When the
host's time is near or above the GPU's, an eager model is bound by the host; when the timer's
figure is far above the kernels' sum, the timer measured the host.

Usage: python3 bench/norm_torch_overhead.py [--reps N] [--case KIND:DTYPE:MxN ...] [--profile N]
                                           [--liger DIR]
(default cases: the norms of the models in bench/norm_torch_models.py: nanoGPT's baby GPT and
GPT-2 small, LayerNorm over an f32 residual stream under autocast; Llama's RMSNorm at 1024).
--liger DIR: a Liger-Kernel checkout's src/ folder (carried, never committed). --profile N
also runs N forward + backward calls of fusegrad's module under cProfile and under PyTorch's
profiler (CPU side) for the first case and prints what took the host's time, by own time: where
the launch cost is, in Python and inside the operators.
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timer import Timer  # noqa: E402  (bench/torch_timer.py)

DEFAULT_CASES = ["layernorm:float32:16384x384", "layernorm:float32:16384x768",
                 "rmsnorm:bfloat16:8192x1024", "rmsnorm:float32:8192x1024"]


def module_for(impl, kind, n, dtype):
    if impl == "fusegrad":
        import fusegrad
        cls = fusegrad.LayerNorm if kind == "layernorm" else fusegrad.RMSNorm
    elif impl == "liger":
        from liger_kernel.transformers.layer_norm import LigerLayerNorm
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        module = (LigerLayerNorm(n, eps=1e-5, bias=True) if kind == "layernorm"
                  else LigerRMSNorm(n, eps=1e-5))
        return module.to(device="cuda", dtype=dtype)
    else:
        cls = nn.LayerNorm if kind == "layernorm" else nn.RMSNorm
    return cls(n, eps=1e-5, device="cuda", dtype=dtype)


def measure(impl, kind, dtype, m, n, reps):
    """impl: "fusegrad", "liger" or "torch"."""
    torch.manual_seed(0)
    module = module_for(impl, kind, n, dtype)
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    params = list(module.parameters())

    def step():
        return torch.autograd.grad(module(x), [x] + params, dy)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    host = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        host.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    timer = Timer()
    gpu = timer.median_ms(step, reps=reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    # The kernels themselves: events that ran on the GPU, each its own duration.
    kernels_us = sum(e.time_range.elapsed_us() for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA) / 10
    return {"host_ms": statistics.median(host), "timer_ms": gpu, "kernels_ms": kernels_us / 1e3,
            "spin_cycles": timer.lead, "host_bound_reps": timer.host_bound}


def profile_host(kind, dtype, m, n, calls):
    """cProfile over `calls` forward + backward calls of fusegrad's module (the host's side)."""
    module = module_for("fusegrad", kind, n, dtype)
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    params = list(module.parameters())
    for _ in range(5):
        torch.autograd.grad(module(x), [x] + params, dy)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        torch.autograd.grad(module(x), [x] + params, dy)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print("\nhost profile of %d fusegrad forward + backward calls (%s %s %dx%d), by own time:"
          % (calls, kind, dtype, m, n))
    print(text.getvalue())
    # Inside C++: PyTorch's profiler, CPU side, the operators and what they call (allocation,
    # autograd's nodes, the engine), by their own host time.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            torch.autograd.grad(module(x), [x] + params, dy)
        torch.cuda.synchronize()
    print("PyTorch's profiler over the same calls (CPU), by own time:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--case", action="append", default=None, metavar="KIND:DTYPE:MxN")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile N fusegrad calls of the first case (0: no profile)")
    ap.add_argument("--liger", default=None, metavar="DIR", help="Liger-Kernel's src/ folder")
    args = ap.parse_args()
    impls = ["torch", "fusegrad"]
    if args.liger:
        sys.path.insert(0, args.liger)
        impls.append("liger")
    print("%s, torch %s" % (torch.cuda.get_device_name(0), torch.__version__))
    print("| case | impl | host ms (launch fwd+bwd) | timer ms | kernels ms (profiler) | "
          "spin cycles | host-bound reps |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in args.case or DEFAULT_CASES:
        kind, dtype_name, shape = case.split(":")
        m, n = (int(v) for v in shape.split("x"))
        dtype = getattr(torch, dtype_name)
        for impl in impls:
            try:
                r = measure(impl, kind, dtype, m, n, args.reps)
                print("| %s | %s | %.3f | %.3f | %.3f | %d | %d |" % (
                    case, impl, r["host_ms"], r["timer_ms"], r["kernels_ms"], r["spin_cycles"],
                    r["host_bound_reps"]), flush=True)
            except Exception as e:  # say what failed and go on with the next
                print("| %s | %s | error: %s |" % (case, impl, str(e).splitlines()[0][:120]),
                      flush=True)
    if args.profile > 0:
        kind, dtype_name, shape = (args.case or DEFAULT_CASES)[0].split(":")
        m, n = (int(v) for v in shape.split("x"))
        profile_host(kind, getattr(torch, dtype_name), m, n, args.profile)


if __name__ == "__main__":
    main()
