// core/ops/activation.cpp: GELU (exact or GPT-2's tanh form) and dropout.
//   gelu:    y = x * Phi(x),   dx = g * (Phi(x) + x * phi(x))
//            Phi(x) = (1 + erf(x / sqrt 2)) / 2,  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//   tanh:    y = x * s,  s = (1 + tanh u) / 2,  u = sqrt(2 / pi) (x + 0.044715 x^3)
//            dx = g * (s + x (1 - tanh^2 u) / 2 * sqrt(2 / pi) (1 + 3 * 0.044715 x^2))
//   dropout: y = m * x / (1 - p), dx = m * g / (1 - p), m_i = philox::keep(seed, offset + i, p)
//            (24 bits of one Philox word as a uniform in [0, 1), >= p: kernels/philox.h)
// Dropout saves no mask: the backward regenerates it from the same (seed, offset).
#include <cmath>

#include "../random.h"
#include "kernels/philox.h"
#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

template <typename T>
T gelu_tanh_arg(T x) {  // u = sqrt(2 / pi) (x + 0.044715 x^3)
    return static_cast<T>(0.79788456080286535588) * (x + static_cast<T>(0.044715) * x * x * x);
}

template <typename T>
void gelu_forward_cpu(const T* x, T* y, std::int64_t n, GeluForm form) {
    for (std::int64_t i = 0; i < n; ++i) {
        if (form == GeluForm::tanh)
            y[i] = static_cast<T>(0.5) * x[i] * (1 + std::tanh(gelu_tanh_arg(x[i])));
        else
            y[i] = static_cast<T>(0.5) * x[i] * (1 + std::erf(x[i] / std::sqrt(static_cast<T>(2))));
    }
}

template <typename T>
void gelu_backward_cpu(const T* x, const T* g, T* dx, std::int64_t n, GeluForm form) {
    const T inv_sqrt_2pi = static_cast<T>(0.39894228040143267794);
    const T sqrt_2_over_pi = static_cast<T>(0.79788456080286535588);
    for (std::int64_t i = 0; i < n; ++i) {
        if (form == GeluForm::tanh) {
            T t = std::tanh(gelu_tanh_arg(x[i]));
            T du = sqrt_2_over_pi * (1 + static_cast<T>(3 * 0.044715) * x[i] * x[i]);
            dx[i] = g[i] * (static_cast<T>(0.5) * (1 + t) +
                            static_cast<T>(0.5) * x[i] * (1 - t * t) * du);
        } else {
            T cdf = static_cast<T>(0.5) * (1 + std::erf(x[i] / std::sqrt(static_cast<T>(2))));
            T pdf = inv_sqrt_2pi * std::exp(static_cast<T>(-0.5) * x[i] * x[i]);
            dx[i] = g[i] * (cdf + x[i] * pdf);
        }
    }
}

}  // namespace

Tensor ops_detail::gelu_backward(const Tensor& x, const Tensor& g, GeluForm form) {
    Tensor dx = empty_like(x);
    std::int64_t n = x.numel();
    if (x.is_cuda()) {
        cuda_backend("gelu").gelu_backward(scalar_type(x.dtype()), x.raw_data(), g.raw_data(),
                                           dx.raw_data(), n, form == GeluForm::tanh);
    } else {
        cpu_reference(x, g, dx, [&](const auto* xs, const auto* gs, auto* out) {
            gelu_backward_cpu(xs, gs, out, n, form);
        });
    }
    return dx;
}

namespace {

template <typename T>
void dropout_cpu(const T* in, T* out, std::int64_t n, float p, std::uint64_t seed,
                 std::uint64_t offset) {
    // The same float scale as the kernel, so f32 results match the GPU bit for bit.
    const T scale = static_cast<T>(1.0f / (1.0f - p));
    for (std::int64_t i = 0; i < n; ++i)
        out[i] = philox::keep(seed, offset + i, p) ? in[i] * scale : T(0);
}

Tensor dropout_apply(const Tensor& in, float p, std::uint64_t seed, std::uint64_t offset) {
    Tensor out = empty_like(in);
    std::int64_t n = in.numel();
    if (in.is_cuda()) {
        cuda_backend("dropout").dropout(scalar_type(in.dtype()), in.raw_data(), out.raw_data(), n,
                                        p, seed, offset);
    } else {
        cpu_reference(in, out, [&](const auto* src, auto* dst) {
            dropout_cpu(src, dst, n, p, seed, offset);
        });
    }
    return out;
}

}  // namespace

Tensor gelu(const Tensor& x, GeluForm form) {
    check_arithmetic_dtype("gelu", x);
    Tensor y = empty_like(x);
    std::int64_t n = x.numel();
    if (x.is_cuda()) {
        cuda_backend("gelu").gelu_forward(scalar_type(x.dtype()), x.raw_data(), y.raw_data(), n,
                                          form == GeluForm::tanh);
    } else {
        cpu_reference(x, y, [&](const auto* src, auto* dst) {
            gelu_forward_cpu(src, dst, n, form);
        });
    }
    Tensor saved = x.detach();
    return record("gelu", {x}, y, [saved, form](const Tensor& g) -> std::vector<Tensor> {
        return {gelu_backward(saved, g, form)};
    });
}

Tensor dropout(const Tensor& x, double p, bool training) {
    check_arithmetic_dtype("dropout", x);
    FG_CHECK(p >= 0.0 && p < 1.0, "dropout", "p must be in [0, 1), got ", p);
    if (!training || p == 0.0) return x;
    Generator& gen = default_generator();
    std::uint64_t seed = gen.seed();
    std::uint64_t offset = gen.advance_aligned(static_cast<std::uint64_t>(x.numel()));
    float pf = static_cast<float>(p);
    Tensor y = dropout_apply(x, pf, seed, offset);
    return record("dropout", {x}, y, [pf, seed, offset](const Tensor& g) -> std::vector<Tensor> {
        return {dropout_apply(g, pf, seed, offset)};
    });
}

}  // namespace fg
