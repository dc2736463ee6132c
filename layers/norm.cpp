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
    FG_CHECK(config.param_dtype == DType::f32 || config.param_dtype == DType::bf16 ||
                 config.param_dtype == DType::f16 || config.param_dtype == DType::f64,
             op, "parameters must be floating, got ", dtype_name(config.param_dtype));
    FG_CHECK(config.weight || !config.zero_centered, op, "a zero-centred weight needs weight on");
    if (config.weight) {
        double init = config.zero_centered ? 0.0 : 1.0;
        weight = Tensor::full({config.dim}, init, config.param_dtype, config.device);
        weight.set_requires_grad(true);
        register_parameter("weight", &weight);
    }
    if (config.bias) {
        bias = Tensor::zeros({config.dim}, config.param_dtype, config.device);
        bias.set_requires_grad(true);
        register_parameter("bias", &bias);
    }
}

NormOptions NormBase::options() const {
    NormOptions o;
    o.eps = config_.eps;
    o.zero_centered = config_.zero_centered;
    o.reduction = config_.reduction;
    return o;
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
