// layers/linear.cpp: see linear.h.
#include "linear.h"

#include "core/error.h"

namespace fg {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias,
               float init_std, Generator& gen, Device device) {
    FG_CHECK(in_features > 0 && out_features > 0, "linear", "features must be positive, got ",
             in_features, " -> ", out_features);
    weight = randn({out_features, in_features}, device, &gen, 0.0f, init_std)
                 .set_requires_grad(true);
    register_parameter("weight", &weight);
    if (with_bias) {
        bias = Tensor::zeros({out_features}, DType::f32, device).set_requires_grad(true);
        register_parameter("bias", &bias);
    }
}

Tensor Linear::forward(const Tensor& x) const {
    FG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear",
             "input's last dim is ", x.defined() && x.dim() ? x.size(-1) : 0, ", the layer takes ",
             weight.size(1));
    // The layer computes in its input's dtype: f32 weights meet bf16 activations as bf16 copies,
    // and their gradients come back to the f32 weights (core/ops.h, linear).
    return x.dim() == 1 ? linear(x.reshape({1, x.size(0)}), weight, bias, matmul_)
                              .reshape({weight.size(0)})
                        : linear(x, weight, bias, matmul_);
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, float init_std,
                     Generator& gen, Device device) {
    FG_CHECK(num_embeddings > 0 && dim > 0, "embedding", "table must be non-empty, got ",
             num_embeddings, " x ", dim);
    weight = randn({num_embeddings, dim}, device, &gen, 0.0f, init_std).set_requires_grad(true);
    register_parameter("weight", &weight);
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

}  // namespace fg
