// core/ops/attention.cpp: causal self-attention with no (T, T) tensor kept for the backward.
// The math of the row-wise parts is in kernels/attention.h; here are the matrix products and the
// CPU reference. Per head (batched over B * H with strided GEMMs), s = 1/sqrt(D):
//   forward:   S = Q K^T;  Pd, lse = probs(S);  O = Pd V            (S's buffer becomes Pd)
//   backward:  S = Q K^T again;  Pd = probs(S, lse)                 (the same bits as forward)
//              dV = Pd^T dO;  dPd = dO V^T                          (dPd reuses Pd's buffer)
//              dS = probs_backward(S, dPd, lse)                     (in S's buffer)
//              dQ = dS K;  dK = dS^T Q
// Saved between them: qkv (an input), lse (one value per row) and the dropout's (seed, offset).
// Two (T, T) scratch buffers per call live only inside the forward or the backward.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../random.h"
#include "kernels/philox.h"
#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

struct AttentionShape {
    std::int64_t heads_total, t, d;  // B * H, T, D
    float scale, p;
    std::uint64_t seed, offset;
    std::int64_t rows() const { return heads_total * t; }
    std::int64_t qkv_stride() const { return heads_total * t * d; }  // q -> k -> v
};

// CPU reference of kernels/attention.cu, the same operations in the same order per element.
template <typename T>
void probs_cpu(const T* s, T* pd, T* lse, bool compute_lse, const AttentionShape& a) {
    const T keep_scale = static_cast<T>(1.0f / (1.0f - a.p));
    for (std::int64_t r = 0; r < a.rows(); ++r) {
        const std::int64_t visible = r % a.t + 1;
        const T* sr = s + r * a.t;
        T* pr = pd + r * a.t;
        const T scale = static_cast<T>(a.scale);
        T row_lse;
        if (compute_lse) {
            T m = -std::numeric_limits<T>::max();
            for (std::int64_t j = 0; j < visible; ++j) m = std::max(m, scale * sr[j]);
            T total = 0;
            for (std::int64_t j = 0; j < visible; ++j) total += std::exp(scale * sr[j] - m);
            row_lse = m + std::log(total);
            lse[r] = row_lse;
        } else {
            row_lse = lse[r];
        }
        const std::uint64_t base = a.offset + static_cast<std::uint64_t>(r) * a.t;
        for (std::int64_t j = 0; j < a.t; ++j) {
            T v = 0;
            if (j < visible) {
                v = std::exp(scale * sr[j] - row_lse);
                if (a.p > 0.0f) v = philox::keep(a.seed, base + j, a.p) ? v * keep_scale : T(0);
            }
            pr[j] = v;
        }
    }
}

template <typename T>
void probs_backward_cpu(T* s, const T* dpd, const T* lse, const AttentionShape& a) {
    const T keep_scale = static_cast<T>(1.0f / (1.0f - a.p));
    const T scale = static_cast<T>(a.scale);
    for (std::int64_t r = 0; r < a.rows(); ++r) {
        const std::int64_t visible = r % a.t + 1;
        T* sr = s + r * a.t;
        const T* gr = dpd + r * a.t;
        const std::uint64_t base = a.offset + static_cast<std::uint64_t>(r) * a.t;
        auto dp = [&](std::int64_t j) {
            if (a.p == 0.0f) return gr[j];
            return philox::keep(a.seed, base + j, a.p) ? gr[j] * keep_scale : T(0);
        };
        T dot = 0;
        for (std::int64_t j = 0; j < visible; ++j) dot += dp(j) * std::exp(scale * sr[j] - lse[r]);
        for (std::int64_t j = 0; j < a.t; ++j)
            sr[j] = j < visible ? scale * std::exp(scale * sr[j] - lse[r]) * (dp(j) - dot) : T(0);
    }
}

void probs(const Tensor& s, Tensor& pd, Tensor& lse, bool compute_lse, const AttentionShape& a) {
    if (s.is_cuda()) {
        cuda_backend("causal_attention")
            .attention_probs_f32(s.data<float>(), pd.data<float>(), lse.data<float>(), compute_lse,
                                 a.rows(), a.t, a.scale, a.p, a.seed, a.offset);
        return;
    }
    dispatch_float(s.dtype(), [&](auto tag) {
        using T = decltype(tag);
        probs_cpu<T>(static_cast<const T*>(s.raw_data()), static_cast<T*>(pd.raw_data()),
                     static_cast<T*>(lse.raw_data()), compute_lse, a);
    });
}

void probs_backward(Tensor& s, const Tensor& dpd, const Tensor& lse, const AttentionShape& a) {
    if (s.is_cuda()) {
        cuda_backend("causal_attention")
            .attention_probs_backward_f32(s.data<float>(), dpd.data<float>(), lse.data<float>(),
                                          a.rows(), a.t, a.scale, a.p, a.seed, a.offset);
        return;
    }
    dispatch_float(s.dtype(), [&](auto tag) {
        using T = decltype(tag);
        probs_backward_cpu<T>(static_cast<T*>(s.raw_data()), static_cast<const T*>(dpd.raw_data()),
                              static_cast<const T*>(lse.raw_data()), a);
    });
}

// The element at `index` of a raw buffer of t's dtype: pointer arithmetic in elements.
const void* at(const Tensor& t, std::int64_t index) {
    return static_cast<const char*>(t.raw_data()) + index * static_cast<std::int64_t>(dtype_size(t.dtype()));
}
void* at(Tensor& t, std::int64_t index) {
    return static_cast<char*>(t.raw_data()) + index * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

// S = Q K^T for every head into `s` (heads_total, T, T).
void scores(const Tensor& qkv, Tensor& s, const AttentionShape& a) {
    const std::int64_t td = a.t * a.d;
    gemm_raw(qkv.device(), qkv.dtype(), false, true, a.t, a.t, a.d, at(qkv, 0), td,
             at(qkv, a.qkv_stride()), td, s.raw_data(), a.t * a.t, a.heads_total);
}

}  // namespace

Tensor causal_attention(const Tensor& qkv, double dropout_p, bool training) {
    const char* op = "causal_attention";
    check_defined(op, qkv, "qkv");
    check_arithmetic_dtype(op, qkv);
    FG_CHECK(qkv.dim() == 5 && qkv.size(0) == 3, op, "qkv must be (3, B, H, T, D), got ",
             shape_str(qkv.shape()));
    FG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, "dropout p must be in [0, 1), got ", dropout_p);
    const std::int64_t b = qkv.size(1), h = qkv.size(2), t = qkv.size(3), d = qkv.size(4);
    FG_CHECK(t > 0 && d > 0, op, "qkv needs T >= 1 and D >= 1, got ", shape_str(qkv.shape()));
    AttentionShape a{b * h, t, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                     training ? static_cast<float>(dropout_p) : 0.0f, 0, 0};
    if (a.p > 0.0f) {
        Generator& gen = default_generator();
        a.seed = gen.seed();
        a.offset = gen.advance_aligned(static_cast<std::uint64_t>(a.rows() * t));
    }
    Tensor out = Tensor::empty({b, h, t, d}, qkv.dtype(), qkv.device());
    Tensor lse = Tensor::empty({a.rows()}, qkv.dtype(), qkv.device());
    {
        Tensor s = Tensor::empty({a.heads_total, t, t}, qkv.dtype(), qkv.device());
        scores(qkv, s, a);
        probs(s, s, lse, true, a);  // in place: S becomes Pd
        gemm_raw(qkv.device(), qkv.dtype(), false, false, t, d, t, s.raw_data(), t * t,
                 at(qkv, 2 * a.qkv_stride()), t * d, out.raw_data(), t * d, a.heads_total);
    }
    Tensor saved = qkv.detach();
    return record(op, {qkv}, out, [saved, lse, a](const Tensor& g) -> std::vector<Tensor> {
        const std::int64_t t = a.t, d = a.d, tt = t * t, td = t * d, n = a.heads_total;
        const Device dev = saved.device();
        const DType dt = saved.dtype();
        Tensor dqkv = Tensor::empty(saved.shape(), dt, dev);
        Tensor s = Tensor::empty({n, t, t}, dt, dev);
        Tensor pd = Tensor::empty({n, t, t}, dt, dev);
        Tensor lse_copy = lse;  // the lambda's captures are const
        scores(saved, s, a);
        probs(s, pd, lse_copy, false, a);
        // dV = Pd^T dO
        gemm_raw(dev, dt, true, false, t, d, t, pd.raw_data(), tt, g.raw_data(), td,
                 at(dqkv, 2 * a.qkv_stride()), td, n);
        // dPd = dO V^T, into Pd's buffer
        gemm_raw(dev, dt, false, true, t, t, d, g.raw_data(), td, at(saved, 2 * a.qkv_stride()), td,
                 pd.raw_data(), tt, n);
        probs_backward(s, pd, lse, a);  // S becomes dS (scale included)
        // dQ = dS K;  dK = dS^T Q
        gemm_raw(dev, dt, false, false, t, d, t, s.raw_data(), tt, at(saved, a.qkv_stride()), td,
                 at(dqkv, 0), td, n);
        gemm_raw(dev, dt, true, false, t, d, t, s.raw_data(), tt, at(saved, 0), td,
                 at(dqkv, a.qkv_stride()), td, n);
        return {dqkv};
    });
}

}  // namespace fg
