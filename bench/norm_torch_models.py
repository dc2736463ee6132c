#!/usr/bin/env python3
"""bench/norm_torch_models.py: the training step of real PyTorch models as written, with
fusegrad's norms (fusegrad.patch) and with Liger-Kernel's, eager and under torch.compile, in one
process (one GPU call): does swapping the norms make the model faster?

Models (random initialisation, random tokens):
  baby   nanoGPT's own model.py (a carried checkout, --nanogpt), its baby GPT: 6 layers, 6 heads,
         384 channels, 256 tokens, vocabulary 65, dropout 0.2, no biases; 64 x 256 tokens a step
  llama  transformers' LlamaForCausalLM: 8 layers, hidden 1024, 16 heads, MLP 2816, vocabulary
         32000; 8 x 1024 tokens a step
  gpt2   transformers' GPT2LMHeadModel, GPT-2 small (12 x 768, vocabulary 50257), no dropout;
         16 x 1024 tokens a step
Variants: "torch" (as written), "fusegrad" (fusegrad.patch: the norms, and nanoGPT's blocks'
first residual add fused; under torch.compile the models' own norm code, as patch does by
default), "fusegrad-norms" (eager only, and only for nanoGPT, whose blocks patch fuses:
patch(fuse_residual=False), the norms alone), "fusegrad-kernels" (compiled only:
patch(compiled="fusegrad"), fusegrad's ops inside the compiled graph), "liger" (Liger-Kernel's norm modules in place of the models' norms, sharing their
weights: LigerRMSNorm for Llama's, LigerLayerNorm for the others; --liger names its src/ folder,
carried, never committed).
The step: bf16 autocast, fused AdamW (lr 6e-4, betas 0.9 / 0.95, weight decay 0.1 on the 2-D
weights, as nanoGPT's configure_optimizers), clip 1.0, the loss read every step (as nanoGPT's
train.py logs it). Every variant starts from the same weights and sees the same batches; the
last loss is printed so that a variant computing something else shows. Each variant's --warmup
steps (compilation) run one variant at a time and give its peak memory (what PyTorch allocated
above what the other variants hold at rest); then the --steps timed steps run interleaved, the
order rotating each step, so that a drift in the machine's speed falls on all variants alike:
the median step, and the 10th and 90th percentiles in the JSON.

usage: norm_torch_models.py --nanogpt DIR [--liger DIR] [--models baby,llama,gpt2]
                            [--modes eager,compile] [--steps 40] [--warmup 15] [--json OUT]
"""
import argparse
import copy
import json
import statistics
import sys
import time

import torch
from torch import nn


def build(name, nanogpt):
    torch.manual_seed(0)
    if name == "baby":
        sys.path.insert(0, nanogpt)
        from model import GPT, GPTConfig  # noqa: E402  (nanoGPT's own)
        model = GPT(GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65,
                              dropout=0.2, bias=False))
        return model, 64, 256, 65
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                             num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                             max_position_embeddings=1024)
        return LlamaForCausalLM(config), 8, 1024, 32000
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config), 16, 1024, 50257


def use_liger(model):
    """Liger-Kernel's norm modules in place of the model's norms, with the same weights (what its
    apply_liger_kernel_to_llama(rms_norm=True) does to Llama's, without its version pins on
    transformers): LigerRMSNorm (Llama's casting) for LlamaRMSNorm, LigerLayerNorm for nanoGPT's
    and torch.nn's LayerNorm (a frozen zero bias where the model has none: Liger's always has
    one)."""
    from liger_kernel.transformers.layer_norm import LigerLayerNorm
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            kind, n = type(child).__name__, getattr(getattr(child, "weight", None), "shape", [0])[0]
            if kind == "LlamaRMSNorm":
                new = LigerRMSNorm(n, eps=child.variance_epsilon)
            elif kind == "LayerNorm":
                new = LigerLayerNorm(n, eps=getattr(child, "eps", 1e-5), bias=False)
                if getattr(child, "bias", None) is not None:
                    new.bias = child.bias
                else:  # Liger's always has one: zeros beside the weight, not trained
                    new.bias = nn.Parameter(torch.zeros_like(child.weight), requires_grad=False)
            else:
                continue
            new.weight = child.weight
            setattr(parent, child_name, new)


def optimizer_for(model):
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=6e-4, betas=(0.9, 0.95), fused=True)


def loss_of(model, name, x, y):
    if name == "baby":
        return model(x, y)[1]
    return model(input_ids=x, labels=y).loss


class Variant:
    """One variant of one model in one mode: its own copy of the weights, optimizer and (compiled)
    step."""

    def __init__(self, name, variant, mode, args, base):
        self.row = {"model": name, "variant": variant, "mode": mode}
        before = torch.cuda.memory_allocated()
        self.model = copy.deepcopy(base).cuda().train()
        if variant == "fusegrad":
            import fusegrad
            fusegrad.patch(self.model)
        elif variant == "fusegrad-kernels":
            import fusegrad
            fusegrad.patch(self.model, compiled="fusegrad")
        elif variant == "fusegrad-norms":
            import fusegrad
            fusegrad.patch(self.model, fuse_residual=False)
        elif variant == "liger":
            use_liger(self.model)
        self.opt = optimizer_for(self.model)
        self.step_model = torch.compile(self.model) if mode == "compile" else self.model
        self.name, self.before, self.times = name, before, []

    def step(self, x, y):
        """One training step; its wall time in ms, the loss read as train.py's log line reads it
        (so the time includes the host's)."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16):
            loss = loss_of(self.step_model, self.name, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.row["last_loss"] = loss.item()
        return (time.perf_counter() - start) * 1e3


def measure(name, mode, variants, args, base):
    """Every variant's warm-up steps (compilation) one variant at a time, its peak memory above
    what the earlier variants hold at rest; then the timed steps interleaved, the order rotating
    each step, so that a drift in the host's or the GPU's speed falls on every variant alike."""
    runs, rows = [], []

    def failed(row, e):  # say what failed and go on without it
        rows.append(dict(row, error=str(e).splitlines()[0][:200] if str(e) else type(e).__name__))
        print(json.dumps(rows[-1]), flush=True)

    for variant in variants:
        try:
            v = Variant(name, variant, mode, args, base)
            torch.cuda.reset_peak_memory_stats()
            for i in range(args.warmup):
                v.step(*batch(name, args, i))
            v.row["peak_mib"] = (torch.cuda.max_memory_allocated() - v.before) / 2**20
            runs.append(v)
        except Exception as e:
            failed({"model": name, "variant": variant, "mode": mode}, e)
    for i in range(args.steps):
        x, y = batch(name, args, args.warmup + i)
        for k in range(len(runs)):
            v = runs[(i + k) % len(runs)]
            if v.times is None:
                continue
            try:
                v.times.append(v.step(x, y))
            except Exception as e:
                failed(v.row, e)
                v.times = None
    for v in runs:
        if v.times is None:
            continue
        deciles = statistics.quantiles(v.times, n=10)
        rows.append(dict(v.row, ms=statistics.median(v.times), ms_p10=deciles[0],
                         ms_p90=deciles[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def batch(name, args, i):
    """Step i's random tokens (the same for every variant)."""
    _, b, t, vocab = args.shapes[name]
    gen = torch.Generator(device="cuda").manual_seed(1000 + i)
    return (torch.randint(vocab, (b, t), device="cuda", generator=gen),
            torch.randint(vocab, (b, t), device="cuda", generator=gen))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", required=True, help="a nanoGPT checkout (its model.py)")
    ap.add_argument("--liger", default=None, help="Liger-Kernel's src/ folder")
    ap.add_argument("--models", default="baby,llama,gpt2")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.steps < 2 or args.warmup < 1:
        ap.error("--steps must be at least 2 and --warmup at least 1")
    if args.liger:
        sys.path.insert(0, args.liger)
    variants = (["torch", "fusegrad", "fusegrad-norms", "fusegrad-kernels"] +
                (["liger"] if args.liger else []))

    def wanted(name, mode, variant):
        if variant == "fusegrad-norms":
            return mode == "eager" and name == "baby"
        return variant != "fusegrad-kernels" or mode == "compile"
    torch.backends.cuda.matmul.allow_tf32 = True
    print("%s, torch %s" % (torch.cuda.get_device_name(0), torch.__version__), flush=True)
    rows, args.shapes = [], {}
    for name in args.models.split(","):
        built = build(name, args.nanogpt)
        args.shapes[name] = built
        for mode in args.modes.split(","):
            torch._dynamo.reset()
            rows += measure(name, mode, [v for v in variants if wanted(name, mode, v)], args,
                            built[0])
            torch.cuda.empty_cache()
    print("\n| model | mode | as written ms | fusegrad ms (x) | fusegrad's norms alone ms (x) | "
          "fusegrad's kernels compiled ms (x) | Liger ms (x) | peak MiB: written / fusegrad / "
          "Liger |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            got = {r["variant"]: r for r in rows if r["model"] == name and r["mode"] == mode}
            base = got.get("torch", {}).get("ms")

            def cell(v):
                r = got.get(v)
                if r is None or "ms" not in r:
                    return "-" if r is None else "error"
                return "%.2f (%.2fx)" % (r["ms"], r["ms"] / base) if base else "%.2f" % r["ms"]
            peaks = " / ".join("%.0f" % got[v]["peak_mib"] if "ms" in got.get(v, {}) else "-"
                               for v in ("torch", "fusegrad", "liger"))
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, mode, "%.2f" % base if base else "-", cell("fusegrad"),
                cell("fusegrad-norms"), cell("fusegrad-kernels"), cell("liger"), peaks))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
