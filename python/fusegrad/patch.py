"""python/fusegrad/patch.py: fusegrad.patch(model), which puts fusegrad's norms into a built PyTorch
model in place (the counterpart of Liger-Kernel's apply_liger_kernel_to_llama):

- every norm it recognises becomes fusegrad's module with the same Parameter objects (an
  optimizer built before the patch still updates them; state_dict keys do not change):
  torch.nn.LayerNorm and torch.nn.RMSNorm (exact types, as replace_norms: transformers' GPT-2 has
  these), nanoGPT's LayerNorm (its model.py's class: a weight, a bias or None, eps 1e-5) and
  transformers' LlamaRMSNorm (weight, variance_epsilon);
- in a block whose forward it knows to be nanoGPT's pre-norm pair of residual adds,

      x = x + self.attn(self.ln_1(x))
      x = x + self.mlp(self.ln_2(x))

  the first add moves into the second norm's kernel (its residual option returns y = norm(h) and
  h = x + attn(...)): in the backward the residual's gradient joins dx inside the kernel; in the
  forward the add is fused, but under autocast the 16-bit attention output is first cast to the
  float32 stream's dtype (the kernel adds tensors of one dtype), which costs about what it saves.
  Blocks whose forward differs (transformers' decoder layers among them: their signatures change
  between versions) keep their adds; their norms are swapped all the same.

Recognition is by class name and the attributes the swap reads, and for nanoGPT's modules by their
forward's source, so that a look-alike with other arithmetic is left alone.

Eager, all of this runs fusegrad's kernels. While torch.compile (or torch.export) traces the
model, with compiled="torch" (the default) the swapped norms run the replaced norms' forward on
their own parameters and the fused blocks their own forward: the compiled graph is the unpatched
model's, which Inductor fuses better than it can around fusegrad's opaque ops (modules.py).
"""
import functools
import inspect

import torch
from torch import nn

from .modules import LayerNorm, RMSNorm, _swap_for, check_compiled, sharing

# nanoGPT's model.py, as its forward methods read (white space aside).
_NANOGPT_LAYERNORM = "returnF.layer_norm(input,self.weight.shape,self.weight,self.bias,1e-5)"
_NANOGPT_BLOCK = "x=x+self.attn(self.ln_1(x))x=x+self.mlp(self.ln_2(x))returnx"


def _forward_code(module):
    """The statements of type(module).forward without its signature, comments or white space
    ("" when the source is not available); a docstring stays, so a forward with one never
    matches nanoGPT's, which have none."""
    try:
        lines = inspect.getsource(type(module).forward).splitlines()[1:]
    except (OSError, TypeError):
        return ""
    code = "".join(line.split("#")[0].strip() for line in lines)
    return "".join(code.split())


def _nanogpt_layer_norm(module, reduction, compiled):
    if (type(module).__name__ != "LayerNorm" or isinstance(module, nn.LayerNorm) or
            not isinstance(getattr(module, "weight", None), nn.Parameter) or
            not hasattr(module, "bias") or _forward_code(module) != _NANOGPT_LAYERNORM):
        return None
    return sharing(LayerNorm, module, module.weight.shape, 1e-5, module.weight, module.bias,
                   reduction, compiled)


def _llama_rms_norm(module, reduction, compiled):
    if (type(module).__name__ != "LlamaRMSNorm" or
            not isinstance(getattr(module, "weight", None), nn.Parameter) or
            not hasattr(module, "variance_epsilon")):
        return None
    return sharing(RMSNorm, module, module.weight.shape, module.variance_epsilon, module.weight,
                   None, reduction, compiled)


def _swap(module, reduction, compiled):
    """fusegrad's module for `module`, sharing its parameters, or None."""
    for swap in (_swap_for, _nanogpt_layer_norm, _llama_rms_norm):
        new = swap(module, reduction, compiled)
        if new is not None:
            return new
    return None


def _fused_block_forward(self, x):
    """nanoGPT's Block.forward with its first residual add inside ln_2's kernel. Under autocast the
    attention's output is 16-bit and the residual stream x float32: the add is made in the wider
    of the two dtypes, as PyTorch's type promotion makes it (the kernel adds tensors of one).
    Under torch.compile with compiled="torch", the block's own forward (its norms run theirs)."""
    if self.ln_2._model_forward is not None and torch.compiler.is_compiling():
        return type(self).forward(self, x)
    a = self.attn(self.ln_1(x))
    wide = torch.promote_types(x.dtype, a.dtype)
    y, h = self.ln_2(a.to(wide), residual=x.to(wide))
    return h + self.mlp(y)


def patch(model, *, fuse_residual=True, reduction="auto", compiled="torch"):
    """Puts fusegrad's norms into `model` in place (see the module's docstring) and returns
    {"norms": how many were swapped, "fused_blocks": how many blocks fuse a residual add}.
    The model's norms must then run on CUDA tensors (or meta ones, for tracing). compiled: what
    runs while torch.compile traces the model, "torch" (the model's own norms and blocks, which
    Inductor fuses with their neighbours) or "fusegrad" (fusegrad's ops, opaque to Inductor)."""
    check_compiled(compiled)
    counts = {"norms": 0, "fused_blocks": 0}
    for parent in list(model.modules()):
        # A nanoGPT block is recognised before its norms change (its source is what is checked).
        fuse = (fuse_residual and "forward" not in vars(parent) and  # not fused already
                all(hasattr(parent, a) for a in ("ln_1", "attn", "ln_2", "mlp")) and
                _forward_code(parent) == _NANOGPT_BLOCK)
        for name, child in list(parent.named_children()):
            new = _swap(child, reduction, compiled)
            if new is not None:
                setattr(parent, name, new)
                counts["norms"] += 1
        if fuse and isinstance(parent.ln_2, (LayerNorm, RMSNorm)):
            # A partial of a module-level function, not a bound method: a patched model pickles
            # (torch.save) and loads again.
            parent.forward = functools.partial(_fused_block_forward, parent)
            counts["fused_blocks"] += 1
    return counts
