// models/gpt.h: a GPT in nanoGPT's shape, built from layers/: learned token (wte) and position
// (wpe) embeddings, n_layer pre-norm Blocks, a final norm (ln_f), and an LM head tied to wte.
// Parameter names follow nanoGPT's state_dict ("transformer.wte.weight",
// "transformer.h.0.attn.c_attn.weight" (3C, C), ..., "transformer.ln_f.weight"), Linear weights
// stored (out, in), so the weights map one to one onto nanoGPT's model.
// Shapes: B batch, T time (<= block_size), C = n_embd, V = vocab_size.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/transformer.h"

namespace fg {

// The model's shape and arithmetic. Kernel settings (the norms' reduction, the attention's
// kernels, TF32) are not here: they are set on the built model's layers (Module::apply).
struct GPTConfig {
    std::int64_t vocab_size = 0;
    std::int64_t block_size = 0;
    std::int64_t n_layer = 0, n_head = 0, n_embd = 0;
    bool rmsnorm = false;
    GeluForm gelu = GeluForm::exact;  // the MLP's GELU (core/ops.h)
    bool bias = true;
    double dropout = 0.0;
    // The activations' dtype. f32: the parameters' own dtype throughout. bf16 (or f16): mixed
    // precision, as PyTorch's autocast: the embeddings are summed in the parameters' dtype and
    // cast, every later activation and GEMM is 16-bit (Linear layers multiply by 16-bit copies of
    // their weights), the norms take their f32 weights as they are, and the loss is fp32.
    DType compute_dtype = DType::f32;
};

class GPT final : public Module {
public:
    // Initialised as nanoGPT does: normal(0, 0.02) for weights and embeddings, residual
    // projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 n_layer)), zero biases,
    // unit norm weights. The draws come from `gen`, so a seed fixes the model exactly.
    GPT(const GPTConfig& config, Generator& gen, Device device = Device::cpu);

    // ids i32 (B, T) -> logits (B, T, V)
    Tensor forward(const Tensor& ids) const;
    // Mean cross-entropy of the logits against targets i32 (B, T); ignore_index rows left out.
    // Logits handed over get the loss's gradient written over them (ops.h, cross_entropy).
    Tensor loss(Tensor logits, const Tensor& targets, int ignore_index = -1,
                float expected_dloss = 1.0f) const;

    // nanoGPT's state_dict: named_parameters() plus "lm_head.weight", the tied alias of wte.
    std::vector<std::pair<std::string, Tensor*>> state_dict();
    const GPTConfig& config() const { return config_; }
    std::int64_t num_parameters();  // counted once (the tied head is wte)
    // How the tied head's product runs (as Linear::set_matmul_options; the defaults until set).
    const MatmulOptions& matmul_options() const { return matmul_; }
    void set_matmul_options(const MatmulOptions& options) { matmul_ = options; }

    Embedding wte, wpe;
    std::vector<std::unique_ptr<Block>> h;
    std::unique_ptr<NormBase> ln_f;

private:
    GPTConfig config_;
    Module transformer_;  // only groups the "transformer." names
    Tensor positions_;    // i32 (block_size): 0, 1, ..., made once on the model's device
    MatmulOptions matmul_;
};

}  // namespace fg
