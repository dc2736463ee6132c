// layers/norm.cpp: see norm.h.
#include "norm.h"

#include <cmath>

#include "core/error.h"

namespace fg {

NormBase::NormBase(kernels::NormKind kind, const NormConfig& config) : kind_(kind), config_(config) {
    const char* op = kind == kernels::NormKind::rms ? "rmsnorm" : "layernorm";
    FG_CHECK(config.dim >= 1, op, "dim must be >= 1, got ", config.dim);
    FG_CHECK(std::isfinite(config.eps) && config.eps > 0.0, op, "eps must be > 0, got ",
             config.eps);
    const double init = config.zero_centered ? 0.0 : 1.0;
    weight = Tensor::full({config.dim}, init, DType::f32, config.device).set_requires_grad(true);
    register_parameter("weight", &weight);
    if (config.bias) {
        bias = Tensor::zeros({config.dim}, DType::f32, config.device).set_requires_grad(true);
        register_parameter("bias", &bias);
    }
}

NormOptions NormBase::options() const {
    return {config_.eps, config_.zero_centered, config_.reduction};
}

Tensor NormBase::forward(const Tensor& x) const {
    return kind_ == kernels::NormKind::rms ? rms_norm(x, weight, bias, options())
                                           : layer_norm(x, weight, bias, options());
}

NormResidualResult NormBase::forward(const Tensor& x, const Tensor& residual) const {
    return kind_ == kernels::NormKind::rms
               ? rms_norm_residual(x, residual, weight, bias, options())
               : layer_norm_residual(x, residual, weight, bias, options());
}

}  // namespace fg
