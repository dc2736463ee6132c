"""bench/train_torch.py: the PyTorch baseline for fusegrad's trainer.

Trains the nanoGPT-shaped reference model of tests/parity/nanogpt_ref.py on a fusegrad text
config (same model, data split, schedule, AdamW groups, clipping, evaluation cadence), so that
fusegrad's run and PyTorch's can be compared in the same GPU call: step time, tokens/s, peak GPU
memory and the loss curves. Writes OUT_DIR/metrics.jsonl in fusegrad's format (so `fusegrad plot`
draws both) and OUT_DIR/summary.json.

Precision modes: fp32 (fp32 weights and activations, TF32 matmuls: fusegrad's train.precision
tf32), bf16 (fp32 weights, bf16 autocast, fused AdamW: fusegrad's train.precision bf16), each
eager or with --compile.

Data: a text file (data.kind text, as fusegrad's char-level configs), or data.kind random_tokens
(uniform ids below model.vocab_size, no file: GPT-2 small's benchmark, configs/gpt2_124m.yaml with
--set data.kind=random_tokens).

Several GPUs: started by torchrun (WORLD_SIZE > 1), the model is wrapped in
DistributedDataParallel (NCCL; gloo on the CPU), as nanoGPT does (compiled first, then wrapped).
Every rank draws the same global batch of train.batch_size rows and trains on its share of them,
as fusegrad's ranks do; the micro-batches before the last skip DDP's exchange (no_sync); rank 0
writes the metrics (the ranks' mean loss) and the summary (tokens/s of the global batch).

Without a GPU (--device cpu, fp32 only) the same script runs on the CPU: a check of its logic.

The config is read as fusegrad reads it (bench/fg_config.py: `fusegrad config CONFIG --set ...`
fills in every key the file leaves at its default and checks the --set values).

usage: train_torch.py CONFIG.yaml OUT_DIR [--mode fp32|bf16] [--compile] [--steps N]
                      [--data PATH] [--eval-iters N] [--seed S] [--set KEY.PATH=VALUE]...
                      [--device cuda|cpu] [--fusegrad BIN]
       torchrun --nproc_per_node N train_torch.py ...
"""
import contextlib
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from nanogpt_ref import GPT, GPTConfig, adamw, cosine_lr  # noqa: E402
from fg_config import resolved_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("out_dir")
    ap.add_argument("--mode", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="stop after N steps (schedule unchanged)")
    ap.add_argument("--data", default=None, help="the text file (default: the config's data.path)")
    ap.add_argument("--eval-iters", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None, help="instead of the config's train.seed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override a config value, as fusegrad's --set")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--fusegrad", default=None, help="the fusegrad binary that resolves the config")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elif args.mode != "fp32" or args.compile:
        sys.exit("train_torch.py: --device cpu runs fp32 eager only")
    c = resolved_config(args.config, args.set, args.fusegrad, "train_torch.py")
    m, o, t = c["model"], c["optim"], c["train"]
    if args.seed is not None:
        t["seed"] = args.seed
    torch.manual_seed(t["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = args.device

    block, batch = m["block_size"], t["batch_size"]
    if batch % world:
        sys.exit("train_torch.py: train.batch_size (%d) must be a multiple of WORLD_SIZE (%d)" % (batch, world))
    share = batch // world  # this rank's rows of every training batch
    random_tokens = c["data"]["kind"] == "random_tokens"
    if random_tokens:
        vocab = m["vocab_size"]
    else:
        text = open(args.data or c["data"]["path"], "rb").read()
        chars = sorted(set(text))
        vocab = len(chars)
        lookup = {ch: i for i, ch in enumerate(chars)}
        ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.long)
        n_val = int(len(ids) * c["data"]["val_fraction"])
        splits = {"train": ids[:len(ids) - n_val], "val": ids[len(ids) - n_val:]}

    def to_device(t):
        return t.pin_memory().to(device, non_blocking=True) if device == "cuda" else t

    def get_batch(split, gen, rows=None):
        """The whole batch from `gen` (every rank draws it, so the generator moves as one
        process's), then rows [rows[0], rows[1]) of it when given."""
        if random_tokens:  # uniform ids; the targets are the next ids, as from a token stream
            seq = torch.randint(vocab, (batch, block + 1), generator=gen)
            x, y = seq[:, :-1], seq[:, 1:]
        else:
            data = splits[split]
            starts = torch.randint(len(data) - block, (batch,), generator=gen)
            x = torch.stack([data[i:i + block] for i in starts])
            y = torch.stack([data[i + 1:i + 1 + block] for i in starts])
        if rows is not None:
            x, y = x[rows[0]:rows[1]], y[rows[0]:rows[1]]
        return to_device(x.contiguous()), to_device(y.contiguous())

    cfg = GPTConfig(vocab_size=vocab, block_size=block, n_layer=m["n_layer"], n_head=m["n_head"],
                    n_embd=m["n_embd"], norm=m["norm"], bias=m["bias"], dropout=m["dropout"],
                    gelu=m["gelu"])
    model = GPT(cfg).to(device)
    fused = {"fused": True} if device == "cuda" else {}  # the CPU check: any PyTorch's AdamW
    opt = adamw(model, o["lr"], (o["beta1"], o["beta2"]), o["weight_decay"], **fused)
    plain_fn = torch.compile(model) if args.compile else model
    step_fn = plain_fn
    if world > 1:
        step_fn = torch.nn.parallel.DistributedDataParallel(
            plain_fn, device_ids=[torch.cuda.current_device()] if device == "cuda" else None)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.mode == "bf16")
    writer = rank == 0
    if writer:
        os.makedirs(args.out_dir, exist_ok=True)
    metrics = open(os.path.join(args.out_dir, "metrics.jsonl"), "w") if writer else open(os.devnull, "w")
    steps = args.steps or t["steps"]
    eval_iters = args.eval_iters or t["eval_iters"]
    train_gen = torch.Generator().manual_seed(t["seed"] + 1)
    tokens = batch * block * t["grad_accum"]

    @torch.no_grad()
    def evaluate():
        model.eval()
        gen = torch.Generator().manual_seed(t["seed"] + 3)  # the same batches each time
        out = {}
        for split in ("train", "val"):
            total = 0.0
            for _ in range(eval_iters):
                x, y = get_batch(split, gen)
                with autocast:
                    total += plain_fn(x, y)[1].item()  # every rank the whole batch
            out[split] = total / eval_iters
        model.train()
        return out

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, best, at_1000 = [], (math.inf, 0), None
    mine = (rank * share, (rank + 1) * share)
    for step in range(steps):
        start = time.perf_counter()
        lr = cosine_lr(step, o["lr"], o["min_lr"], o["warmup_steps"], t["steps"])
        for group in opt.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=device)
        for micro in range(t["grad_accum"]):
            x, y = get_batch("train", train_gen, mine)
            last = micro == t["grad_accum"] - 1
            # DDP: only the last micro-batch's backward exchanges the gradients.
            sync = contextlib.nullcontext() if world == 1 or last else step_fn.no_sync()
            with sync:
                with autocast:
                    loss = step_fn(x, y)[1] / t["grad_accum"]
                loss.backward()
            total += loss.detach()
        if world > 1:
            torch.distributed.all_reduce(total)
            total /= world
        total = total.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        norm = norm.item()  # waits for the step, like fusegrad's host timing
        ms = (time.perf_counter() - start) * 1000
        times.append(ms)
        done = step + 1
        metrics.write(json.dumps({"step": done, "loss": round(total, 6), "lr": lr, "grad_norm": round(norm, 5),
                                  "ms": round(ms, 2), "tokens_per_s": round(tokens / ms * 1000)}) + "\n")
        if done % t["eval_interval"] == 0 or done == steps:
            e = evaluate()
            best = min(best, (e["val"], done))
            if done == 1000:
                at_1000 = e["val"]
            metrics.write(json.dumps({"step": done, "train_loss": round(e["train"], 6),
                                      "val_loss": round(e["val"], 6)}) + "\n")
            if writer:
                print("step %d: train loss %.4f, val loss %.4f, %.2f ms/step" % (done, e["train"], e["val"], ms), flush=True)
    steady = times[min(10, len(times) // 2):]  # leave out warm-up (and compilation)
    summary = {
        "framework": "pytorch %s" % torch.__version__, "mode": args.mode, "compile": args.compile,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "gpus": world,
        "steps": steps,
        "median_ms_per_step": statistics.median(steady),
        "tokens_per_s": tokens / statistics.median(steady) * 1000,
        "peak_mem_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "best_val_loss": best[0], "best_val_step": best[1], "val_loss_at_1000": at_1000,
    }
    if writer:
        json.dump(summary, open(os.path.join(args.out_dir, "summary.json"), "w"), indent=1)
        print(json.dumps(summary))
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
