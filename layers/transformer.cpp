// layers/transformer.cpp: see transformer.h.
#include "transformer.h"

#include <cmath>

#include "core/error.h"

namespace fg {
namespace {

// nanoGPT scales the init of every projection that writes into the residual stream by
// 1 / sqrt(2 n_layer), so the stream's variance does not grow with depth.
float residual_std(const TransformerConfig& cfg) {
    return cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
}

void check_config(const TransformerConfig& cfg) {
    FG_CHECK(cfg.n_embd > 0 && cfg.n_head > 0 && cfg.n_embd % cfg.n_head == 0, "transformer",
             "n_embd (", cfg.n_embd, ") must be a positive multiple of n_head (", cfg.n_head, ")");
    FG_CHECK(cfg.dropout >= 0.0 && cfg.dropout < 1.0, "transformer", "dropout must be in [0, 1), got ",
             cfg.dropout);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const TransformerConfig& cfg, Generator& gen)
    : c_attn((check_config(cfg), cfg.n_embd), 3 * cfg.n_embd, cfg.bias, cfg.init_std, gen,
             cfg.device),
      c_proj(cfg.n_embd, cfg.n_embd, cfg.bias, residual_std(cfg), gen, cfg.device),
      n_head_(cfg.n_head),
      dropout_(cfg.dropout) {
    register_module("c_attn", &c_attn);
    register_module("c_proj", &c_proj);
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
    FG_CHECK(x.defined() && x.dim() == 3, "attention", "expects (B, T, C), got ",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
    // softmax(q k^T / sqrt(D), causal) with dropout, times v, for every head: one op that keeps
    // no (T, T) tensor, from c_attn's (B, T, 3C) to the (B, T, C) c_proj reads.
    // The products between the layers' run as theirs (tf32).
    const AttentionOptions options{backend_, c_attn.matmul_options().tf32};
    Tensor y = causal_self_attention(c_attn.forward(x), n_head_, dropout_, training(), options);
    return dropout(c_proj.forward(y), dropout_, training());
}

MLP::MLP(const TransformerConfig& cfg, Generator& gen)
    : c_fc(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, cfg.init_std, gen, cfg.device),
      c_proj(4 * cfg.n_embd, cfg.n_embd, cfg.bias, residual_std(cfg), gen, cfg.device),
      dropout_(cfg.dropout),
      gelu_(cfg.gelu) {
    register_module("c_fc", &c_fc);
    register_module("c_proj", &c_proj);
}

Tensor MLP::forward(const Tensor& x) const {
    // c_proj(gelu(c_fc(x))) as one op, so that the GELU can ride in the products' epilogues; a
    // single row (1-D) is taken as Linear takes it.
    if (x.defined() && x.dim() == 1)
        return forward(x.reshape({1, x.size(0)})).reshape({c_proj.weight.size(0)});
    return dropout(mlp(x, c_fc.weight, c_fc.bias, c_proj.weight, c_proj.bias, gelu_,
                       c_fc.matmul_options()),
                   dropout_, training());
}

std::unique_ptr<NormBase> make_norm(const TransformerConfig& cfg) {
    NormConfig n;
    n.dim = cfg.n_embd;
    n.bias = cfg.bias;
    n.device = cfg.device;
    if (cfg.rmsnorm) return std::make_unique<RMSNorm>(n);
    return std::make_unique<LayerNorm>(n);
}

Block::Block(const TransformerConfig& cfg, Generator& gen)
    : ln_1(make_norm(cfg)), attn(cfg, gen), ln_2(make_norm(cfg)), mlp(cfg, gen) {
    register_module("ln_1", ln_1.get());
    register_module("attn", &attn);
    register_module("ln_2", ln_2.get());
    register_module("mlp", &mlp);
}

ResidualStream Block::forward(const ResidualStream& in) const {
    // ln_1 adds the stream's pending sum as it normalises it (the first block's has none); ln_2
    // adds the attention's output to x; the MLP's output is left for the next norm to add.
    NormResidualResult x = in.delta.defined() ? ln_1->forward(in.delta, in.h)
                                              : NormResidualResult{ln_1->forward(in.h), in.h};
    NormResidualResult r = ln_2->forward(attn.forward(x.y), x.h);
    return {r.h, mlp.forward(r.y)};
}

}  // namespace fg
