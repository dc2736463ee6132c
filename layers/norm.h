// layers/norm.h: RMSNorm and LayerNorm modules over the last dim, backed by the fused kernels on
// CUDA tensors and the CPU reference on CPU tensors (core/ops.h, rms_norm / layer_norm).
// Parameters: weight (N) initialised to ones (zeros when zero-centred, since the scale is 1 + w),
// and an optional bias (N) of zeros.
#pragma once

#include "core/ops.h"
#include "module.h"

namespace fg {

struct NormConfig {
    std::int64_t dim = 0;            // N, the normalised (last) dim
    double eps = 1e-5;
    bool bias = false;
    bool zero_centered = false;
    // For dw / db on CUDA: the layer's initial setting, which set_reduction changes later (the
    // owner of a built model may set it on every norm, with Module::apply).
    NormReduction reduction = NormReduction::automatic;
    Device device = Device::cpu;
};

class NormBase : public Module {
public:
    // y = norm(x); x (..., N)
    Tensor forward(const Tensor& x) const;
    // Fused residual add: y = norm(h), h = x + residual; returns (y, h).
    NormResidualResult forward(const Tensor& x, const Tensor& residual) const;
    const NormConfig& config() const { return config_; }
    // How the CUDA backward sums dw / db over the rows (a kernel strategy, docs/norms.md: the same
    // sums in another order, at another speed); CPU tensors ignore it.
    NormReduction reduction() const { return config_.reduction; }
    void set_reduction(NormReduction r) { config_.reduction = r; }

    Tensor weight, bias;

protected:
    NormBase(kernels::NormKind kind, const NormConfig& config);

private:
    NormOptions options() const;
    kernels::NormKind kind_;
    NormConfig config_;
};

class RMSNorm final : public NormBase {
public:
    explicit RMSNorm(const NormConfig& config) : NormBase(kernels::NormKind::rms, config) {}
};

class LayerNorm final : public NormBase {
public:
    explicit LayerNorm(const NormConfig& config) : NormBase(kernels::NormKind::layer, config) {}
};

}  // namespace fg
