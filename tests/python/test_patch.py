"""tests/python/test_patch.py: fusegrad.patch on the models of models.py. Without a GPU (CI): which
norms it swaps (and that they keep their Parameter objects and state_dict keys), which blocks
fuse a residual add, what it leaves alone, a forward + backward of the patched models on meta
tensors (all but Llama, whose rotary embedding opens an autocast region meta tensors cannot
run), and what a compiled graph of a patched model holds: with compiled="torch" (the default)
the model's own norms, so that on the CPU (torch.compile with a backend that runs the captured
graph as it is) logits and gradients equal the unpatched model's bit for bit (also after a
state_dict loaded with assign=True, and after torch.save and torch.load), and with
compiled="fusegrad" fusegrad's ops (traced on meta tensors). With a GPU (marked `gpu`): logits
and every parameter's gradient of the patched model against the same model unpatched, in float32
(relative error, norm-wise, within 1e-5 for the logits and 1e-4 for the gradients: the same math
in another order of rounding) and under bf16 autocast (within 2e-2 and 5e-2: bf16 matmuls on
either side, whose roundings the fused add moves), and the same under torch.compile (Inductor)
with compiled="fusegrad".
"""
import copy

import pytest
import torch
from torch import nn

import fusegrad
import models

META = "meta"
BUILDERS = {"nanogpt": models.nanogpt_style, "llama": models.llama, "gpt2": models.gpt2}
# norms swapped, blocks fused: nanoGPT-style 2 blocks x 2 + ln_f; Llama 2 x 2 + final norm;
# GPT-2 2 x 2 + ln_f.
EXPECTED = {"nanogpt": (5, 2), "llama": (5, 0), "gpt2": (5, 0)}


def build(name, device):
    if name != "nanogpt":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    return BUILDERS[name](device)


def rel(a, b):
    """Norm-wise relative error of a against b."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_patch_swaps_norms_and_keeps_parameters(name):
    model, vocab = build(name, META)
    params = dict(model.named_parameters())
    keys = list(model.state_dict().keys())
    counts = fusegrad.patch(model)
    assert (counts["norms"], counts["fused_blocks"]) == EXPECTED[name]
    assert list(model.state_dict().keys()) == keys
    for k, p in model.named_parameters():
        assert p is params[k], k  # the same Parameter objects: an optimizer keeps working
    swapped = [m for m in model.modules() if isinstance(m, (fusegrad.LayerNorm, fusegrad.RMSNorm))]
    assert len(swapped) == EXPECTED[name][0]
    assert fusegrad.patch(model) == {"norms": 0, "fused_blocks": 0}  # nothing left to patch
    if name == "llama":
        return  # its rotary embedding opens an autocast region for the device type: none for meta
    idx = torch.randint(vocab, (2, 16), device=META)
    out = models.logits(model, idx)
    assert out.shape == (2, 16, vocab)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_patch_without_fusing_and_what_it_leaves_alone():
    model, _ = build("nanogpt", META)
    assert fusegrad.patch(model, fuse_residual=False) == {"norms": 5, "fused_blocks": 0}
    assert "forward" not in vars(model.h[0])

    class OtherBlock(models.Block):  # the same parts, another forward: not fused
        def forward(self, x):
            return x + self.mlp(self.ln_2(x + self.attn(self.ln_1(x))))

    class LayerNorm(models.LayerNorm):  # nanoGPT's name and parts, another eps: not swapped
        def forward(self, input):
            return torch.nn.functional.layer_norm(input, self.weight.shape, self.weight,
                                                  self.bias, 1e-6)

    block = OtherBlock(32, 4, True)
    norm = LayerNorm(32, True)
    holder = nn.ModuleList([block, norm])
    counts = fusegrad.patch(holder)
    assert counts == {"norms": 2, "fused_blocks": 0}  # the block's own two norms only
    assert holder[1] is norm and "forward" not in vars(block)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_patched_model_matches_unpatched(name, precision):
    ref, vocab = build(name, "cuda")
    ref.train()
    model = copy.deepcopy(ref)
    counts = fusegrad.patch(model)
    assert counts["norms"] == EXPECTED[name][0]
    torch.manual_seed(1)
    idx = torch.randint(vocab, (4, 32), device="cuda")
    target = torch.randint(vocab, (4, 32), device="cuda")
    results = []
    for m in (ref, model):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            out = models.logits(m, idx)
            loss = nn.functional.cross_entropy(out.float().flatten(0, 1), target.flatten())
        loss.backward()
        results.append((out.float(), {k: p.grad.float() for k, p in m.named_parameters()}))
    (ref_out, ref_grads), (out, grads) = results
    tol_out, tol_grad = (1e-5, 1e-4) if precision == "fp32" else (2e-2, 5e-2)

    assert rel(out, ref_out) <= tol_out
    for k, g in ref_grads.items():
        assert rel(grads[k], g) <= tol_grad, k


def _graph_targets(model, idx):
    """The call targets of the graphs torch.compile captures from a forward + backward of model
    (fullgraph: a graph break fails), with the captured graphs run as they are."""
    seen = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def record(g, inputs):
            seen.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g)
        return aot_autograd(fw_compiler=record, bw_compiler=record)(gm, example_inputs)

    torch._dynamo.reset()
    out = models.logits(torch.compile(model, backend=backend, fullgraph=True), idx)
    out.float().square().sum().backward()
    return out, seen


def _compiles_as(model, ref, idx):
    """model compiled captures no fusegrad op, and its logits and gradients equal ref's compiled
    (run first), bit for bit."""
    ref_out, _ = _graph_targets(ref, idx)
    out, seen = _graph_targets(model, idx)
    assert not any("fusegrad" in s for s in seen), seen
    assert torch.equal(out, ref_out)
    grads = dict(model.named_parameters())
    for k, p in ref.named_parameters():
        assert torch.equal(grads[k].grad, p.grad), k


@pytest.mark.parametrize("name", list(BUILDERS))
def test_compiled_patched_model_runs_its_own_norms(name):
    ref, vocab = build(name, "cpu")
    model = copy.deepcopy(ref)
    assert fusegrad.patch(model)["norms"] == EXPECTED[name][0]
    _compiles_as(model, ref, torch.randint(vocab, (2, 16)))


def test_compiled_patched_model_follows_its_parameters_and_pickles():
    """Under compile the swapped norms read the model's tree, not what it held when patched: a
    state_dict loaded with assign=True (new Parameter objects) reaches them; a patched model
    saved with torch.save loads again, its blocks still fused."""
    import io
    ref, vocab = build("nanogpt", "cpu")
    model = copy.deepcopy(ref)
    fusegrad.patch(model)
    torch.manual_seed(5)
    fresh = {k: torch.randn_like(v) for k, v in ref.state_dict().items()}
    ref.load_state_dict(fresh, assign=True)
    model.load_state_dict(fresh, assign=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert "forward" in vars(loaded.h[0]) and isinstance(loaded.ln_f, fusegrad.LayerNorm)
    idx = torch.randint(vocab, (2, 16))
    for m in (model, loaded):
        ref.zero_grad(set_to_none=True)
        _compiles_as(m, ref, idx)


def test_swapped_norm_with_a_residual_under_compile():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(16)

        def forward(self, x, r):
            return self.norm(x, residual=r)

    holder = Holder()
    assert fusegrad.replace_norms(holder) == 1
    x, r = torch.randn(4, 16), torch.randn(4, 16, dtype=torch.float64)
    torch._dynamo.reset()
    y, h = torch.compile(holder, backend="eager", fullgraph=True)(x, r)
    assert h.dtype == x.dtype and torch.equal(h, (x + r).float())  # rounded as the kernel rounds
    assert torch.equal(y, nn.functional.layer_norm(h, (16,), holder.norm.weight,
                                                   holder.norm.bias, 1e-5))


def test_compiled_patched_model_with_fusegrads_ops():
    model, vocab = build("nanogpt", META)
    fusegrad.patch(model, compiled="fusegrad")
    _, seen = _graph_targets(model, torch.randint(vocab, (2, 16), device=META))
    assert sum("fusegrad.norm_forward" in s for s in seen) == 5, seen
    assert sum("fusegrad.norm_backward" in s for s in seen) == 5, seen
    for call in (fusegrad.patch, fusegrad.replace_norms):  # refused before anything is swapped
        with pytest.raises(ValueError, match="compiled must be one of 'torch', 'fusegrad', got 'x'"):
            call(nn.Sequential(nn.Linear(2, 2)), compiled="x")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_model_with_fusegrads_ops_matches_unpatched(precision):
    ref, vocab = build("nanogpt", "cuda")
    model = copy.deepcopy(ref)
    fusegrad.patch(model, compiled="fusegrad")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.manual_seed(1)
    idx = torch.randint(vocab, (4, 32), device="cuda")
    outs = []
    for m in (ref, compiled):
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            out = models.logits(m, idx).float()
        out.square().mean().backward()
        outs.append(out)
    tol_out, tol_grad = (1e-5, 1e-4) if precision == "fp32" else (2e-2, 5e-2)
    assert rel(outs[1], outs[0]) <= tol_out
    grads = dict(model.named_parameters())
    for k, p in ref.named_parameters():
        assert rel(grads[k].grad, p.grad) <= tol_grad, k


@pytest.mark.parametrize("flags", [["--steps", "1"], ["--warmup", "0"]])
def test_models_benchmark_refuses_too_few_steps(flags):
    """bench/norm_torch_models.py needs two timed steps (for its percentiles) and one warm-up
    step (for the peak memory): it says so before it builds anything."""
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "norm_torch_models.py"
    done = subprocess.run([sys.executable, str(script), "--nanogpt", "/nonexistent"] + flags,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--steps must be at least 2 and --warmup at least 1" in done.stderr
