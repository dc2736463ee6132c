// layers/transformer.h: the pieces of a GPT block, in nanoGPT's shape and names.
//   CausalSelfAttention: c_attn (one fused QKV Linear, C -> 3C), causal softmax attention over H
//     heads of size D = C / H, c_proj (C -> C), dropout on the attention weights and the output.
//   MLP: c_fc (C -> 4C), GELU (exact, or GPT-2's tanh form: model.gelu), c_proj (4C -> C),
//     dropout; the three as one op (core/ops.h, mlp).
//   Block: x + attn(ln_1(x)), then + mlp(ln_2(.)), pre-norm; the first add runs inside ln_2 (a
//     fused residual norm), the second is left to the norm that reads the block's output
//     (ResidualStream).
// Shapes: B batch, T time, C channels, H heads, D head size.
#pragma once

#include <memory>

#include "linear.h"
#include "norm.h"

namespace fg {

// The blocks' shape. Kernel settings (the norms' dw/db reduction, the attention's kernels, TF32)
// are not here: they are set on the built layers (Module::apply, NormBase::set_reduction,
// CausalSelfAttention::set_backend, Linear::set_matmul_options).
struct TransformerConfig {
    std::int64_t n_embd = 0, n_head = 0, n_layer = 1;
    bool bias = true;
    double dropout = 0.0;
    bool rmsnorm = false;  // RMSNorm instead of LayerNorm
    GeluForm gelu = GeluForm::exact;  // the MLP's GELU (core/ops.h)
    float init_std = 0.02f;
    Device device = Device::cpu;
};

class CausalSelfAttention final : public Module {
public:
    CausalSelfAttention(const TransformerConfig& cfg, Generator& gen);
    Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
    // Which kernels the attention runs (core/ops.h, AttentionBackend): automatic until set (on a
    // built model, with Module::apply).
    AttentionBackend backend() const { return backend_; }
    void set_backend(AttentionBackend backend) { backend_ = backend; }

    Linear c_attn, c_proj;

private:
    std::int64_t n_head_;
    double dropout_;
    AttentionBackend backend_ = AttentionBackend::automatic;
};

class MLP final : public Module {
public:
    MLP(const TransformerConfig& cfg, Generator& gen);
    Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)

    Linear c_fc, c_proj;

private:
    double dropout_;
    GeluForm gelu_;
};

// A norm layer of either kind, chosen by the config.
std::unique_ptr<NormBase> make_norm(const TransformerConfig& cfg);

// The residual stream between blocks, (B, T, C), kept as a sum not yet added: x = h + delta
// (delta undefined: x = h). The norm that reads x adds the two in its own pass (the norms' fused
// residual option, which also returns x), so the adds between blocks cost no kernel of their own,
// forward or backward. (The first block's input, read by ln_1 and ln_2, still sums its two
// gradients in an add.)
struct ResidualStream {
    Tensor h, delta;
};

class Block final : public Module {
public:
    Block(const TransformerConfig& cfg, Generator& gen);
    // x = in.h + in.delta -> out.h = x + attn(ln_1(x)), out.delta = mlp(ln_2(out.h))
    ResidualStream forward(const ResidualStream& in) const;

    std::unique_ptr<NormBase> ln_1;
    CausalSelfAttention attn;
    std::unique_ptr<NormBase> ln_2;
    MLP mlp;
};

}  // namespace fg
