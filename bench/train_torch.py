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

usage: train_torch.py CONFIG.yaml OUT_DIR [--mode fp32|bf16] [--compile] [--steps N]
                      [--data PATH] [--eval-iters N] [--seed S] [--set KEY.PATH=VALUE]...
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from nanogpt_ref import GPT, GPTConfig, adamw, cosine_lr  # noqa: E402


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
    args = ap.parse_args()
    with open(args.config) as f:
        c = yaml.safe_load(f)
    for override in args.set:
        key, _, value = override.partition("=")
        section, _, name = key.partition(".")
        if not value or not name or section not in c:
            sys.exit("train_torch.py: --set wants SECTION.KEY=VALUE, got '%s'" % override)
        c[section][name] = yaml.safe_load(value)
    m, o, t = c["model"], c["optim"], c["train"]
    if args.seed is not None:
        t["seed"] = args.seed
    torch.manual_seed(t["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = "cuda"

    block, batch = m["block_size"], t["batch_size"]
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

    def get_batch(split, gen):
        if random_tokens:  # uniform ids; the targets are the next ids, as from a token stream
            seq = torch.randint(vocab, (batch, block + 1), generator=gen)
            return (seq[:, :-1].pin_memory().to(device, non_blocking=True),
                    seq[:, 1:].pin_memory().to(device, non_blocking=True))
        data = splits[split]
        starts = torch.randint(len(data) - block, (batch,), generator=gen)
        x = torch.stack([data[i:i + block] for i in starts])
        y = torch.stack([data[i + 1:i + 1 + block] for i in starts])
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)

    cfg = GPTConfig(vocab_size=vocab, block_size=block, n_layer=m["n_layer"], n_head=m["n_head"],
                    n_embd=m["n_embd"], norm=m["norm"], bias=m["bias"], dropout=m["dropout"])
    model = GPT(cfg).to(device)
    opt = adamw(model, o["lr"], (o["beta1"], o["beta2"]), o["weight_decay"], fused=True)
    step_fn = torch.compile(model) if args.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.mode == "bf16")
    os.makedirs(args.out_dir, exist_ok=True)
    metrics = open(os.path.join(args.out_dir, "metrics.jsonl"), "w")
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
                    total += step_fn(x, y)[1].item()
            out[split] = total / eval_iters
        model.train()
        return out

    torch.cuda.reset_peak_memory_stats()
    times, best, at_1000 = [], (math.inf, 0), None
    for step in range(steps):
        start = time.perf_counter()
        lr = cosine_lr(step, o["lr"], o["min_lr"], o["warmup_steps"], t["steps"])
        for group in opt.param_groups:
            group["lr"] = lr
        total = 0.0
        for _ in range(t["grad_accum"]):
            x, y = get_batch("train", train_gen)
            with autocast:
                loss = step_fn(x, y)[1] / t["grad_accum"]
            loss.backward()
            total += loss.item()
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
            print("step %d: train loss %.4f, val loss %.4f, %.2f ms/step" % (done, e["train"], e["val"], ms), flush=True)
    steady = times[min(10, len(times) // 2):]  # leave out warm-up (and compilation)
    summary = {
        "framework": "pytorch %s" % torch.__version__, "mode": args.mode, "compile": args.compile,
        "gpu": torch.cuda.get_device_name(), "steps": steps,
        "median_ms_per_step": statistics.median(steady),
        "tokens_per_s": tokens / statistics.median(steady) * 1000,
        "peak_mem_mib": torch.cuda.max_memory_allocated() / 2**20,
        "best_val_loss": best[0], "best_val_step": best[1], "val_loss_at_1000": at_1000,
    }
    json.dump(summary, open(os.path.join(args.out_dir, "summary.json"), "w"), indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
