// layers/linear.h: Linear (y = x W^T + b, W stored (out, in) as nanoGPT and PyTorch do) and
// Embedding (rows of a (V, C) table picked by i32 ids). Both initialise from a seeded Generator:
// weights normal(0, init_std), biases zero. A Linear computes in its input's dtype: given bf16
// activations it multiplies by a bf16 copy of its (f32) weight, as PyTorch's autocast does.
#pragma once

#include "core/ops.h"
#include "core/random.h"
#include "module.h"

namespace fg {

class Linear final : public Module {
public:
    Linear(std::int64_t in_features, std::int64_t out_features, bool bias, float init_std,
           Generator& gen, Device device = Device::cpu);
    Tensor forward(const Tensor& x) const;  // x (..., in) -> (..., out)
    // How its products run (core/ops.h, MatmulOptions: TF32, autotuned algorithms): the defaults
    // until set (on a built model, with Module::apply).
    const MatmulOptions& matmul_options() const { return matmul_; }
    void set_matmul_options(const MatmulOptions& options) { matmul_ = options; }

    Tensor weight;  // (out, in)
    Tensor bias;    // (out) or undefined

private:
    MatmulOptions matmul_;
};

class Embedding final : public Module {
public:
    Embedding(std::int64_t num_embeddings, std::int64_t dim, float init_std, Generator& gen,
              Device device = Device::cpu);
    Tensor forward(const Tensor& ids) const;  // ids i32 (...) -> (..., dim)

    Tensor weight;  // (V, C)
};

}  // namespace fg
