"""tests/parity/check_parity.py: fusegrad against PyTorch, on the same weights and batches.

For each variant (layernorm / rmsnorm, bias on / off, text data; and addition data, whose targets
use the ignore index) it runs fg_parity_dump, loads fusegrad's model.safetensors into the
nanoGPT-shaped reference with load_state_dict (strict, as a PyTorch user would), and compares:
  logits and loss of the first batch           relative error <= 1e-5
  every parameter's gradient                   relative error <= 1e-4
  every parameter after 3 AdamW steps          relative error <= 1e-4
    (with clipping and the warmup + cosine schedule)
Relative error of a tensor: ||ours - torch|| / ||torch|| (Frobenius norm). Also reported: the same
for the 3-step update (after - before), the per-step losses and gradient norms.

One exception, checked differently: the key part of attn.c_attn.bias. Adding a constant vector to
every key adds the same number to all of a query's scores, which softmax ignores, so that bias's
gradient is zero in exact arithmetic and both sides see only rounding noise (~1e-11). AdamW divides
by sqrt(v), which turns that noise into updates of random sign, so no two implementations agree on
it. The test checks instead that its gradient is noise on both sides (< 1e-6 of the value bias's)
and compares the query and value parts as usual.
Exit status 0 only when every variant passes.

usage: check_parity.py --dumper PATH [--device cpu|cuda] [--config tests/parity/parity.yaml]
                       [--work DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    sys.exit("error: [parity] %s has no PyTorch: install python3-torch (Debian/Ubuntu), or configure "
             "with -DFG_PYTHON=/path/to/a/python/with/torch" % sys.executable)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nanogpt_ref import GPT, GPTConfig, adamw, cosine_lr, load_safetensors  # noqa: E402

VARIANTS = [
    ("layernorm, bias", ["model.norm=layernorm", "model.bias=true"]),
    ("layernorm, no bias", ["model.norm=layernorm", "model.bias=false"]),
    ("rmsnorm, bias", ["model.norm=rmsnorm", "model.bias=true"]),
    ("rmsnorm, no bias", ["model.norm=rmsnorm", "model.bias=false"]),
    ("addition (ignore index)", ["data.kind=addition", "model.block_size=16"]),
]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL_OUTPUT, TOL_GRAD, TOL_PARAM = 1e-5, 1e-4, 1e-4


def rel(ours, ref):
    ours, ref = ours.double().cpu(), ref.double().cpu()
    denom = ref.norm().item()
    return (ours - ref).norm().item() / (denom if denom > 0 else 1.0)


def key_bias(name, t):
    """The key third of a c_attn bias (see the docstring), else None."""
    if not name.endswith("attn.c_attn.bias"):
        return None
    c = t.shape[0] // 3
    return t[c:2 * c]


def rel_param(name, ours, ref):
    """rel() over the parameter, leaving out a c_attn bias's key third."""
    if key_bias(name, ref) is None:
        return rel(ours, ref)
    c = ref.shape[0] // 3
    keep = lambda t: torch.cat([t[:c], t[2 * c:]])
    return rel(keep(ours), keep(ref))


def check_variant(dump_dir, device):
    """Returns (list of (what, error, tolerance)) for one dumped variant."""
    tensors, meta = load_safetensors(os.path.join(dump_dir, "parity.safetensors"))
    state, _ = load_safetensors(os.path.join(dump_dir, "model.safetensors"))
    cfg = GPTConfig(vocab_size=int(meta["vocab_size"]), block_size=int(meta["block_size"]),
                    n_layer=int(meta["n_layer"]), n_head=int(meta["n_head"]),
                    n_embd=int(meta["n_embd"]), norm=meta["norm"], bias=meta["bias"] == "true",
                    dropout=float(meta["dropout"]))
    model = GPT(cfg).to(device)
    model.load_state_dict(state, strict=True)  # exactly what a PyTorch user does
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = adamw(model, float(meta["lr"]), (float(meta["beta1"]), float(meta["beta2"])),
                float(meta["weight_decay"]))
    results = []
    for step in range(3):
        ids = tensors["inputs.%d" % step].to(device)
        targets = tensors["targets.%d" % step].to(device)
        lr = cosine_lr(step, float(meta["lr"]), float(meta["min_lr"]), int(meta["warmup_steps"]),
                       int(meta["steps"]))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        logits, loss = model(ids, targets)
        loss.backward()
        ours_loss = float(meta["loss.%d" % step])
        results.append(("loss, step %d" % step, abs(ours_loss - loss.item()) / abs(loss.item()), TOL_OUTPUT))
        if step == 0:
            results.append(("logits", rel(tensors["logits"], logits.detach()), TOL_OUTPUT))
            worst = max(((rel(tensors["grad." + n], p.grad), n) for n, p in model.named_parameters()))
            results.append(("worst gradient (%s)" % worst[1], worst[0], TOL_GRAD))
            for n, p in model.named_parameters():
                if key_bias(n, p) is not None:
                    c = p.shape[0] // 3
                    scale = p.grad[2 * c:].norm().item()  # the value bias's gradient
                    noise = max(key_bias(n, tensors["grad." + n]).norm().item(), key_bias(n, p.grad).norm().item())
                    results.append(("key-bias gradient / value-bias gradient (%s)" % n.split(".attn")[0],
                                    noise / scale, 1e-6))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(meta["grad_clip"]))
        ours_norm = float(meta["grad_norm.%d" % step])
        results.append(("grad norm, step %d" % step, abs(ours_norm - norm.item()) / norm.item(), TOL_GRAD))
        opt.step()
    params = dict(model.named_parameters())
    worst = max((rel_param(n, tensors["after." + n], p.detach()), n) for n, p in params.items())
    results.append(("worst parameter after 3 steps (%s)" % worst[1], worst[0], TOL_PARAM))
    update = max((rel_param(n, tensors["after." + n] - before[n].cpu(), (p.detach() - before[n]).cpu()), n)
                 for n, p in params.items())
    results.append(("worst 3-step update (%s), for information" % update[1], update[0], None))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dumper", required=True, help="path of the fg_parity_dump program")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "parity.yaml"))
    ap.add_argument("--work", default=None, help="keep the dumps here (default: a temporary directory)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    print("PyTorch %s on %s%s" % (torch.__version__, args.device,
                                   " (%s)" % torch.cuda.get_device_name() if args.device == "cuda" else ""))
    work = args.work or tempfile.mkdtemp(prefix="fg_parity_")
    failures = 0
    for name, overrides in VARIANTS:
        dump_dir = os.path.join(os.path.abspath(work), name.split(" (")[0].replace(", ", "-").replace(" ", "_"))
        cmd = [os.path.abspath(args.dumper), os.path.abspath(args.config), dump_dir, args.device] + overrides
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)  # data paths are repo-relative
        if run.returncode != 0:
            print("FAIL %s: fg_parity_dump exited %d\n%s%s" % (name, run.returncode, run.stdout, run.stderr))
            failures += 1
            continue
        print("== %s" % name)
        for what, err, tol in check_variant(dump_dir, args.device):
            ok = tol is None or err <= tol
            failures += not ok
            print("  %-4s %-58s %.2e%s" % ("ok" if ok else "FAIL", what, err,
                                          "" if tol is None else "  (<= %.0e)" % tol))
    print("parity: %s" % ("all variants match" if failures == 0 else "%d check(s) failed" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
