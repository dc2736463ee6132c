#!/usr/bin/env python3
"""bench/attention_torch.py: PyTorch's flash attention (F.scaled_dot_product_attention with the
FLASH_ATTENTION backend only, bf16, is_causal=True) at the shapes of bench_attention's cuDNN rows,
timed as bench_attention times fusegrad (CUDA events, median of 30, L2 flushed before every
repetition, the host's launches queued behind a GPU spin before the start event), and printed in
bench_attention's table format, so that both runs of one GPU call can be read side by side.

  forward:           out = sdpa(q, k, v) under no_grad (no statistics kept for a backward)
  forward+backward:  the same on a qkv that requires grad, then out.backward(g)
q, k, v are the three (B, H, T, D) slices of one (3, B, H, T, D) leaf, as in fusegrad's op; its
gradient is gathered into one tensor (PyTorch stacks dq, dk, dv; fusegrad copies its dqkv into
the leaf's .grad), one copy of dqkv on each side. TF/s counts 4 B H T^2 D per forward (the two
(T, T) GEMMs at full size) and three times that per forward+backward, as bench_attention does.

With --fusegrad bench_attention.json (the same GPU call's), each row also gets the ratio of
fusegrad's "cudnn bf16" time at that case to this one (the project's target: at most 1.2).

Usage: python3 bench/attention_torch.py [--json PATH] [--fusegrad BENCH_ATTENTION_JSON]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timer import Timer  # bench/torch_timer.py (python3 puts bench/ on the path)

SHAPES = [(64, 6, 256, 64), (16, 12, 1024, 64)]  # the baby GPT's, GPT-2 small's (B, H, T, D)
DROPOUT = [0.0, 0.2]


def flash_only():
    """A context in which SDPA may use the flash kernels only (an error if it cannot)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # PyTorch before 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


def shape_name(b, h, t, d, p):
    return f"{b}x{h}x{t}x{d} p={p:.1f}"  # bench_attention's shape column


def bench_case(timer, b, h, t, d, p):
    qkv = torch.randn(3, b, h, t, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    g = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)

    def forward():
        q, k, v = qkv.unbind(0)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    def forward_backward():
        qkv.grad = None
        forward().backward(g)

    with flash_only():
        with torch.no_grad():
            fwd = timer.median_ms(forward)
        both = timer.median_ms(forward_backward)
    return fwd, both


ROW = "%-12s %-34s %-22s %10.4f %8.1f %-4s %s"  # bench/bench_common.h's print_table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="attention_torch.json")
    ap.add_argument("--fusegrad", help="bench_attention's JSON from the same GPU call")
    args = ap.parse_args()
    fusegrad = {}
    if args.fusegrad:
        with open(args.fusegrad) as f:
            for r in json.load(f)["rows"]:
                if r["name"] == "cudnn bf16":
                    fusegrad[(r["group"], r["shape"])] = r["ms"]
    torch.manual_seed(0)
    timer = Timer()
    print(f"attention_torch on {torch.cuda.get_device_name(0)}: PyTorch {torch.__version__}, "
          f"flash attention, bf16")
    print("\n%-12s %-34s %-22s %10s %12s %10s" % ("group", "name", "shape", "ms", "value", "ratio"))
    rows = []
    for b, h, t, d in SHAPES:
        for p in DROPOUT:
            fwd, both = bench_case(timer, b, h, t, d, p)
            shape = shape_name(b, h, t, d, p)
            flop = 4.0 * b * h * t * t * d
            for group, ms, work in (("attention fwd", fwd, flop), ("attention f+b", both, 3 * flop)):
                ours = fusegrad.get((group, shape))
                ratio = f"{100 * ours / ms:.0f}% cudnn/torch time" if ours else ""
                print(ROW % (group, "torch flash bf16", shape, ms, work / (ms * 1e9), "TF/s", ratio))
                rows.append({"group": group, "name": "torch flash bf16", "shape": shape, "ms": ms,
                             "value": work / (ms * 1e9), "unit": "TF/s",
                             "fusegrad_cudnn_ms": ours})
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "rows": rows}, f, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
