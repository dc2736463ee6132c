"""tests/python/models.py: small models for fusegrad.patch's tests, random-initialised: a GPT
built as nanoGPT's model.py builds its blocks (pre-norm, the two residual adds in Block.forward,
LayerNorm with an optional bias and eps 1e-5, written here for the tests), and transformers'
LlamaForCausalLM and GPT2LMHeadModel from tiny configs (transformers from pip; nothing is
downloaded). Each builder takes a device and returns (model, vocabulary size)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: an optional bias, eps 1e-5."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TinyGPT(nn.Module):
    def __init__(self, vocab=96, n_embd=64, n_head=4, n_layer=2, block=32, bias=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, bias) for _ in range(n_layer))
        self.ln_f = LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        for p in self.parameters():  # non-trivial norm weights, so that a lost one shows
            if p.dim() == 1:
                nn.init.normal_(p, 1.0 if p.abs().sum() > 0 else 0.0, 0.1)
            else:
                nn.init.normal_(p, 0.0, 1.0 / math.sqrt(p.shape[-1]))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def nanogpt_style(device, bias=True):
    return TinyGPT(bias=bias).to(device), 96


def llama(device):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for name, p in model.named_parameters():  # norm weights away from 1
        if "norm" in name:
            nn.init.normal_(p, 1.0, 0.1)
    return model.to(device), 96


def gpt2(device):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    for name, p in model.named_parameters():
        if ".ln_" in name or "ln_f" in name:
            nn.init.normal_(p, 1.0 if name.endswith("weight") else 0.0, 0.1)
    return model.to(device), 96


def logits(model, idx):
    out = model(idx)
    return out.logits if hasattr(out, "logits") else out
