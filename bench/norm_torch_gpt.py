#!/usr/bin/env python3
"""bench/norm_torch_gpt.py: the parity test's PyTorch GPT (tests/parity/nanogpt_ref.py, nanoGPT's
architecture) trained with its own norms and with them swapped for fusegrad's modules (the PyTorch
package, `pip install .`), eager and under torch.compile: loss curves and step time.

Every run starts from the same initial weights, draws the same batches and the same dropout
masks (the same seeds; in eager mode the norms draw no random numbers, so the masks match draw for
draw), and trains as bench/train_torch.py does: bf16 autocast, fused AdamW with nanoGPT's groups,
warmup + cosine learning rate, gradient clipping. Under autocast the residual stream is float32,
so both kinds of norm run on float32 activations with float32 weights.

Runs (--runs, comma-separated; `:compile` compiles the model with torch.compile):
  torch            the model as written (F.layer_norm, or the reference RMSNorm's formula)
  fusegrad         its norms replaced by fusegrad.LayerNorm / fusegrad.RMSNorm, same parameters
  fusegrad-res     as fusegrad, and each block's first residual add fused into ln_2 (the norm
                   returns (y, h): y = ln_2(h), h = x + attn(ln_1(x)))
Reported per run: median ms/step after the first 20 steps (compilation left out), peak memory,
the mean training loss of the last 50 steps, the validation loss at the end, and the largest and
mean |loss - torch's loss| over the steps against the run of the same mode. The yardstick for "the
same within bf16 noise" is how far torch:compile's curve is from torch's: two correct
implementations of one model that round differently.

usage: norm_torch_gpt.py [--config configs/shakespeare_char.yaml] [--data FILE] [--steps 300]
                         [--runs torch,fusegrad,torch:compile,fusegrad:compile] [--json PATH]
                         [--fusegrad BIN] [--eval-iters 20]   (the config is read as fusegrad
                         resolves it); --table JSON prints an earlier run's table and exits
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
import nanogpt_ref  # noqa: E402
from fg_config import resolved_config  # noqa: E402
from nanogpt_ref import GPT, GPTConfig, adamw, cosine_lr  # noqa: E402


def swap_norms(model, fuse_residual):
    """Replaces nanogpt_ref's LayerNorm / RMSNorm modules by fusegrad's, sharing the parameters;
    with fuse_residual, each block's ln_2 also takes the residual add before it."""
    import fusegrad
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (nanogpt_ref.LayerNorm, nanogpt_ref.RMSNorm)):
                cls = (fusegrad.LayerNorm if isinstance(child, nanogpt_ref.LayerNorm)
                       else fusegrad.RMSNorm)
                new = cls(child.weight.shape[0], eps=child.eps, bias=child.bias is not None,
                          device=child.weight.device)
                new.weight = child.weight
                new.bias = child.bias
                setattr(parent, name, new)
    if fuse_residual:
        for block in model.transformer.h:
            block.forward = types.MethodType(_fused_block_forward, block)


def _fused_block_forward(self, x):
    y, h = self.ln_2(self.attn(self.ln_1(x)), residual=x)  # h = x + attn(ln_1(x)), y = ln_2(h)
    return h + self.mlp(y)


def load_text(path, val_fraction):
    text = open(path, "rb").read()
    chars = sorted(set(text))
    lookup = {ch: i for i, ch in enumerate(chars)}
    ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.long)
    n_val = int(len(ids) * val_fraction)
    return len(chars), {"train": ids[:len(ids) - n_val], "val": ids[len(ids) - n_val:]}


def train(run, cfg, c, splits, steps, eval_iters, init_state):
    kind, _, mode = run.partition(":")
    o, t = c["optim"], c["train"]
    batch, block = t["batch_size"], cfg.block_size
    torch.manual_seed(t["seed"])
    model = GPT(cfg).cuda()
    model.load_state_dict(init_state)
    if kind != "torch":
        swap_norms(model, fuse_residual=kind == "fusegrad-res")
    opt = adamw(model, o["lr"], (o["beta1"], o["beta2"]), o["weight_decay"], fused=True)
    torch._dynamo.reset()
    step_fn = torch.compile(model) if mode == "compile" else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)

    def get_batch(split, gen):
        data = splits[split]
        starts = torch.randint(len(data) - block, (batch,), generator=gen)
        x = torch.stack([data[i:i + block] for i in starts])
        y = torch.stack([data[i + 1:i + 1 + block] for i in starts])
        return x.cuda(non_blocking=True), y.cuda(non_blocking=True)

    gen = torch.Generator().manual_seed(t["seed"] + 1)
    torch.manual_seed(t["seed"] + 2)  # dropout
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step in range(steps):
        start = time.perf_counter()
        lr = cosine_lr(step, o["lr"], o["min_lr"], o["warmup_steps"], t["steps"])
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch("train", gen)
        with autocast:
            loss = step_fn(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step
        times.append((time.perf_counter() - start) * 1000)
    peak = torch.cuda.max_memory_allocated() / 2**20
    model.eval()
    eval_gen = torch.Generator().manual_seed(t["seed"] + 3)
    with torch.no_grad():
        val = 0.0
        for _ in range(eval_iters):
            x, y = get_batch("val", eval_gen)
            with autocast:  # the eager module (the same weights): no second compilation
                val += model(x, y)[1].item()
    del model, opt, step_fn
    torch.cuda.empty_cache()
    return {"run": run, "losses": losses, "ms": times,
            "median_ms": statistics.median(times[min(20, len(times) // 2):]),
            "peak_mib": peak, "last50_loss": statistics.mean(losses[-50:]),
            "val_loss": val / eval_iters, "finite": all(math.isfinite(v) for v in losses)}


def summary(out):
    """A markdown table: per run, the step time, memory, losses, and the distance of its curve
    from torch's in the same mode (and torch:compile's from torch's, the yardstick)."""
    runs = {r["run"]: r for r in out["runs"]}
    lines = ["| run | ms/step | peak MiB | train loss (last 50) | val loss | max / mean "
             "abs diff from torch, same mode |", "| --- | --- | --- | --- | --- | --- |"]
    for name, r in runs.items():
        kind, _, mode = name.partition(":")
        base = runs.get("torch" + (":" + mode if mode else ""))
        if name == "torch:compile":
            base = runs.get("torch")
        diff = ""
        if base is not None and base is not r:
            d = [abs(a - b) for a, b in zip(r["losses"], base["losses"])]
            diff = "%.4f / %.4f%s" % (max(d), statistics.mean(d),
                                      " (vs torch eager)" if name == "torch:compile" else "")
        lines.append("| %s | %.2f | %.0f | %.4f | %.4f | %s |" % (
            name, r["median_ms"], r["peak_mib"], r["last50_loss"], r["val_loss"], diff))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(HERE, "..", "configs",
                                                     "shakespeare_char.yaml"))
    ap.add_argument("--data", default=None, help="the text file (default: the config's data.path)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--runs", default="torch,fusegrad,torch:compile,fusegrad:compile")
    ap.add_argument("--json", default="norm_torch_gpt.json")
    ap.add_argument("--table", metavar="JSON", help="print the table of an earlier run and exit")
    ap.add_argument("--fusegrad", default=None,
                    help="the fusegrad binary that resolves the config (bench/fg_config.py)")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(summary(json.load(f)))
        return
    c = resolved_config(args.config, fusegrad=args.fusegrad, who="norm_torch_gpt.py")
    m, t = c["model"], c["train"]
    vocab, splits = load_text(args.data or c["data"]["path"], c["data"]["val_fraction"])
    cfg = GPTConfig(vocab_size=vocab, block_size=m["block_size"], n_layer=m["n_layer"],
                    n_head=m["n_head"], n_embd=m["n_embd"], norm=m["norm"], bias=m["bias"],
                    dropout=m["dropout"])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(t["seed"])
    init_state = {k: v.clone() for k, v in GPT(cfg).state_dict().items()}
    import fusegrad
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "fusegrad": fusegrad.__version__, "config": os.path.basename(args.config),
           "steps": args.steps, "batch": t["batch_size"], "block": m["block_size"],
           "norm": m["norm"], "runs": []}
    print("%s, torch %s: %s, %d steps of %d x %d tokens, %s, bf16 autocast"
          % (out["device"], out["torch"], out["config"], args.steps, t["batch_size"],
             m["block_size"], m["norm"]), flush=True)
    for run in args.runs.split(","):
        began = time.time()
        r = train(run.strip(), cfg, c, splits, args.steps, args.eval_iters, init_state)
        out["runs"].append(r)
        print("%-22s %7.2f ms/step  peak %6.0f MiB  loss %.4f (last 50)  val %.4f  (%.0f s)"
              % (r["run"], r["median_ms"], r["peak_mib"], r["last50_loss"], r["val_loss"],
                 time.time() - began), flush=True)
        with open(args.json, "w") as f:
            json.dump(out, f)
    print()
    print(summary(out))


if __name__ == "__main__":
    main()
