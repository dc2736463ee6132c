#!/usr/bin/env python3
"""bench/nanogpt_gpt2.py: nanoGPT's own GPT-2 small step on random tokens, the baseline for
fusegrad's configs/gpt2_124m.yaml with data.kind=random_tokens in the same GPU call.

nanoGPT is not part of this repository: pass the folder of a nanoGPT checkout; its model.py is
imported as it is. The step is its train.py's with grad_accum 1: its GPT (12 x 768, 1024 tokens
of context, vocabulary 50304, biases, no dropout), its configure_optimizers (fused AdamW, weight
decay 0.1 on the 2-D weights, betas 0.9 / 0.95), torch.compile, bf16 autocast, TF32 allowed as
train.py allows it, the next batch copied from pinned memory while the step runs, gradient
clipping at 1.0, and the loss read back every step (train.py's log line). Prints the median step
time after the first 10 (compilation left out), tokens per second and the peak memory PyTorch
allocated.

Under torchrun (several GPUs: RANK, LOCAL_RANK and WORLD_SIZE set) each rank runs that step on
its own --batch, the model wrapped in PyTorch's DistributedDataParallel after torch.compile, as
nanoGPT's train.py wraps it (NCCL; gradients summed in f32, DDP's default); rank 0 prints the
median step and the tokens a second of all the ranks together.

usage: nanogpt_gpt2.py NANOGPT_DIR [--batch 16] [--steps 40] [--no-compile] [--json OUT]
       torchrun --standalone --nproc_per_node N nanogpt_gpt2.py NANOGPT_DIR [...]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("nanogpt")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--json", default=None)
a = ap.parse_args()
sys.path.insert(0, a.nanogpt)
from model import GPT, GPTConfig  # noqa: E402  (nanoGPT's own)

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
T, V = 1024, 50304
model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=T, vocab_size=V,
                      dropout=0.0, bias=True)).cuda()
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
if not a.no_compile:
    model = torch.compile(model)
if world > 1:
    model = DDP(model, device_ids=[torch.cuda.current_device()])
ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)


def batch():
    x = torch.randint(50257, (a.batch, T)).pin_memory().cuda(non_blocking=True)
    y = torch.randint(50257, (a.batch, T)).pin_memory().cuda(non_blocking=True)
    return x, y


times, x, y = [], *batch()
for step in range(a.steps):
    start = time.perf_counter()
    with ctx:
        _, loss = model(x, y)
    x, y = batch()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss_value = loss.item()
    times.append((time.perf_counter() - start) * 1000)
ms = statistics.median(times[10:])
result = {"framework": "nanoGPT model.py" + (" + DDP" if world > 1 else ""),
          "compile": not a.no_compile, "gpus": world, "batch_per_gpu": a.batch,
          "median_ms_per_step": round(ms, 2),
          "tokens_per_s": round(a.batch * T * world / ms * 1000),
          "peak_mem_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
          "last_loss": round(loss_value, 4)}
if rank == 0:
    print(json.dumps(result))
    if a.json:
        json.dump(result, open(a.json, "w"))
if world > 1:
    dist.destroy_process_group()
