// models/gpt.cpp: see gpt.h.
#include "gpt.h"

#include "core/error.h"

namespace fg {
namespace {

TransformerConfig block_config(const GPTConfig& c, Device device) {
    FG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0, "gpt",
             "vocab_size, block_size and n_layer must be positive, got ", c.vocab_size, ", ",
             c.block_size, ", ", c.n_layer);
    TransformerConfig t;
    t.n_embd = c.n_embd;
    t.n_head = c.n_head;
    t.n_layer = c.n_layer;
    t.bias = c.bias;
    t.dropout = c.dropout;
    t.rmsnorm = c.rmsnorm;
    t.gelu = c.gelu;
    t.device = device;
    FG_CHECK(c.compute_dtype == DType::f32 || c.compute_dtype == DType::bf16 ||
                 c.compute_dtype == DType::f16,
             "gpt", "compute dtype must be f32, bf16 or f16, got ", dtype_name(c.compute_dtype));
    return t;
}

}  // namespace

GPT::GPT(const GPTConfig& config, Generator& gen, Device device)
    : wte(config.vocab_size, (block_config(config, device), config.n_embd), 0.02f, gen, device),
      wpe(config.block_size, config.n_embd, 0.02f, gen, device),
      config_(config) {
    TransformerConfig t = block_config(config, device);
    for (std::int64_t i = 0; i < config.n_layer; ++i) h.push_back(std::make_unique<Block>(t, gen));
    ln_f = make_norm(t);
    transformer_.register_module("wte", &wte);
    transformer_.register_module("wpe", &wpe);
    for (std::size_t i = 0; i < h.size(); ++i)
        transformer_.register_module("h." + std::to_string(i), h[i].get());
    transformer_.register_module("ln_f", ln_f.get());
    register_module("transformer", &transformer_);
    std::vector<std::int32_t> positions(config.block_size);
    for (std::int64_t i = 0; i < config.block_size; ++i) positions[i] = static_cast<std::int32_t>(i);
    positions_ = Tensor::from_vector(positions, {config.block_size}, device);
}

Tensor GPT::forward(const Tensor& ids) const {
    FG_CHECK(ids.defined() && ids.dim() == 2 && ids.dtype() == DType::i32, "gpt",
             "ids must be i32 (B, T), got ",
             ids.defined() ? shape_str(ids.shape()) + " " + dtype_name(ids.dtype()) : "undefined");
    const std::int64_t t = ids.size(1);
    FG_CHECK(t >= 1 && t <= config_.block_size, "gpt", "sequence length ", t,
             " is outside [1, block_size = ", config_.block_size, "]");
    FG_CHECK(ids.device() == positions_.device(), "gpt", "ids are on ", device_name(ids.device()),
             ", the model is on ", device_name(positions_.device()));
    // Positions 0..T-1: a view of the cached ids, no host copy (which would synchronise).
    Tensor x = add(wte.forward(ids), wpe.forward(positions_.slice(0, t)));  // (B, T, C) + (T, C)
    if (config_.compute_dtype != DType::f32) x = cast(x, config_.compute_dtype);
    x = dropout(x, config_.dropout, training());
    ResidualStream stream{x, Tensor()};
    for (const auto& block : h) stream = block->forward(stream);
    x = ln_f->forward(stream.delta, stream.h).y;  // the last block's sum added as ln_f reads it
    // Tied head: (B, T, C) @ (V, C)^T -> (B, T, V), in the activations' dtype.
    return matmul(x, cast(wte.weight, x.dtype()), false, true, matmul_);
}

Tensor GPT::loss(Tensor logits, const Tensor& targets, int ignore_index,
                 float expected_dloss) const {
    return cross_entropy(std::move(logits), targets, ignore_index, expected_dloss);
}

std::vector<std::pair<std::string, Tensor*>> GPT::state_dict() {
    auto params = named_parameters();
    params.emplace_back("lm_head.weight", &wte.weight);
    return params;
}

std::int64_t GPT::num_parameters() {
    std::int64_t n = 0;
    for (Tensor* p : parameters()) n += p->numel();
    return n;
}

}  // namespace fg
