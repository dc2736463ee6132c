// core/ops/attention.cpp: causal self-attention with no (T, T) tensor kept for the backward.
// The math of the row-wise parts is in kernels/attention.h; here are the matrix products and the
// CPU reference. Per head (batched over B * H with strided GEMMs), s = 1/sqrt(D):
//   forward:   S = Q K^T;  Pd, lse = probs(S);  O = Pd V            (S's buffer becomes Pd)
//   backward:  S = Q K^T again;  Pd = probs(S, lse)                 (the same bits as forward)
//              dV = Pd^T dO;  dPd = dO V^T                          (dPd reuses Pd's buffer)
//              dS = probs_backward(S, dPd, lse)                     (in S's buffer)
//              dQ = dS K;  dK = dS^T Q
// Saved between them: qkv (an input), lse (one value per row) and the dropout's (seed, offset).
// Up to three (T, T) scratch buffers per call live only inside the forward or the backward.
// bf16 / f16 qkv: S, dPd and lse stay fp32 (the score GEMMs write fp32, as flash attention keeps
// its scores in registers), Pd and dS are rounded to qkv's dtype for the GEMMs that read them, so
// each of those two gets a buffer of its own: S, Pd (then dS) and, in the backward, dPd.
//
// Where cuDNN's fused attention can run (AttentionOptions, core/ops.h), the forward and the
// backward are each one cuDNN call instead (kernels/attention_cudnn.h): no (T, T) buffer at all.
// Saved between them: qkv, the output O and lse (cuDNN's "stats"), and the (seed, offset).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <tuple>

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
void probs_backward_cpu(const T* s, const T* dpd, const T* lse, T* ds, const AttentionShape& a) {
    const T keep_scale = static_cast<T>(1.0f / (1.0f - a.p));
    const T scale = static_cast<T>(a.scale);
    for (std::int64_t r = 0; r < a.rows(); ++r) {
        const std::int64_t visible = r % a.t + 1;
        const T* sr = s + r * a.t;
        T* dr = ds + r * a.t;  // may be sr: element j is read before it is written
        const T* gr = dpd + r * a.t;
        const std::uint64_t base = a.offset + static_cast<std::uint64_t>(r) * a.t;
        auto dp = [&](std::int64_t j) {
            if (a.p == 0.0f) return gr[j];
            return philox::keep(a.seed, base + j, a.p) ? gr[j] * keep_scale : T(0);
        };
        T dot = 0;
        for (std::int64_t j = 0; j < visible; ++j) dot += dp(j) * std::exp(scale * sr[j] - lse[r]);
        for (std::int64_t j = 0; j < a.t; ++j)
            dr[j] = j < visible ? scale * std::exp(scale * sr[j] - lse[r]) * (dp(j) - dot) : T(0);
    }
}

// Pd (of pd's dtype) from S (of the accumulate dtype); pd may be s itself when they share a dtype.
void probs(const Tensor& s, Tensor& pd, Tensor& lse, bool compute_lse, const AttentionShape& a) {
    if (s.is_cuda()) {
        cuda_backend("causal_attention")
            .attention_probs(s.data<float>(), scalar_type(pd.dtype()), pd.raw_data(),
                             lse.data<float>(), compute_lse, a.rows(), a.t, a.scale, a.p, a.seed,
                             a.offset);
        return;
    }
    cpu_reference(s, pd, [&](const auto* sp, auto* out) {  // s is f32 or f64: not widened
        using T = std::remove_pointer_t<decltype(out)>;
        probs_cpu(sp, out, static_cast<T*>(lse.raw_data()), compute_lse, a);
    });
}

// dS (of ds's dtype) from S and dPd (of the accumulate dtype); ds may be s itself.
void probs_backward(const Tensor& s, const Tensor& dpd, const Tensor& lse, Tensor& ds,
                    const AttentionShape& a) {
    if (s.is_cuda()) {
        cuda_backend("causal_attention")
            .attention_probs_backward(s.data<float>(), dpd.data<float>(), lse.data<float>(),
                                      scalar_type(ds.dtype()), ds.raw_data(), a.rows(), a.t,
                                      a.scale, a.p, a.seed, a.offset);
        return;
    }
    cpu_reference(s, dpd, ds, [&](const auto* sp, const auto* dp, auto* out) {
        using T = std::remove_pointer_t<decltype(out)>;
        probs_backward_cpu(sp, dp, static_cast<const T*>(lse.raw_data()), out, a);
    });
}

// The element at `index` of a raw buffer of t's dtype: pointer arithmetic in elements.
void* at(const Tensor& t, std::int64_t index) {
    return static_cast<char*>(t.raw_data()) + index * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

// S = Q K^T for every head into `s` (heads_total, T, T), of the accumulate dtype.
void scores(const Tensor& qkv, Tensor& s, const AttentionShape& a,
            const MatmulOptions& products) {
    const std::int64_t td = a.t * a.d;
    gemm_raw(qkv.device(), qkv.dtype(), s.dtype(), false, true, a.t, a.t, a.d, at(qkv, 0), td,
             at(qkv, a.qkv_stride()), td, s.raw_data(), a.t * a.t, a.heads_total, products);
}

// ---- cuDNN's fused attention ------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether this call runs cuDNN's kernels (attention_runs_cudnn; never on an empty qkv, which has
// nothing to compute); with the cudnn backend, a call cuDNN cannot run is an error saying why.
bool use_cudnn(const Tensor& qkv, std::int64_t t, std::int64_t d, AttentionBackend backend) {
    if (qkv.numel() == 0) return false;
    const AttentionCall call{qkv.device(), qkv.dtype(), d, t, needs_grad({qkv}),
                             aligned16(qkv.raw_data())};
    if (backend == AttentionBackend::cudnn) {
        const std::string why = cudnn_attention_unsupported(call);
        FG_CHECK(why.empty(), "causal_attention", "the cudnn backend cannot run this call: ", why);
    }
    return attention_runs_cudnn(call, backend);
}

// qkv (3, B, H, T, D) -> out (B, H, T, D), both contiguous.
AttentionLayout heads_layout(const Tensor& qkv, const AttentionShape& a) {
    const std::int64_t b = qkv.size(1), h = qkv.size(2);
    return {b, h, a.qkv_stride(), 2 * a.qkv_stride(), h * a.t * a.d, a.t * a.d, a.d,
            {b, h, a.t, a.d}};
}

// What both cuDNN calls share.
kernels::CudnnAttentionArgs cudnn_args(const Tensor& qkv, const AttentionShape& a,
                                       const AttentionLayout& l) {
    kernels::CudnnAttentionArgs k;
    k.type = scalar_type(qkv.dtype());
    k.b = l.b;
    k.h = l.h;
    k.t = a.t;
    k.d = a.d;
    k.stride_b = l.stride_b;
    k.stride_h = l.stride_h;
    k.stride_t = l.stride_t;
    k.out_stride_b = l.out_stride_b;
    k.out_stride_h = l.out_stride_h;
    k.out_stride_t = l.out_stride_t;
    k.scale = a.scale;
    k.p = a.p;
    k.seed = a.seed;
    k.offset = a.offset;
    k.q = at(qkv, 0);
    k.k = at(qkv, l.k_at);
    k.v = at(qkv, l.v_at);
    return k;
}

// The forward by cuDNN, recording its backward (also cuDNN's).
Tensor cudnn_attention(const Tensor& qkv, const AttentionShape& a, const AttentionLayout& l) {
    const char* op = "causal_attention";
    const Device dev = qkv.device();
    CudaBackend& cuda = cuda_backend(op);
    Tensor out = Tensor::empty(l.out_shape, qkv.dtype(), dev);
    // lse only when a backward can follow (the inference graph skips writing it).
    Tensor lse = needs_grad({qkv}) ? Tensor::empty({a.rows()}, DType::f32, dev) : Tensor();
    kernels::CudnnAttentionArgs k = cudnn_args(qkv, a, l);
    k.out = out.raw_data();
    k.stats = lse.defined() ? lse.data<float>() : nullptr;
    {
        Tensor workspace = scratch_bytes(dev, cuda.cudnn_attention_workspace_bytes(k, false));
        k.workspace = workspace.raw_data();
        cuda.cudnn_attention_forward(k);
    }
    Tensor saved = qkv.detach(), saved_out = out.detach();
    auto backward = [saved, saved_out, lse, a, l](const Tensor& g) -> std::vector<Tensor> {
        CudaBackend& cuda = cuda_backend("causal_attention");
        const Tensor dout = aligned16(g.raw_data()) ? g : g.clone();
        Tensor dqkv = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
        kernels::CudnnAttentionArgs k = cudnn_args(saved, a, l);
        k.out = saved_out.raw_data();
        k.stats = lse.data<float>();
        k.dout = dout.raw_data();
        k.dq = at(dqkv, 0);
        k.dk = at(dqkv, l.k_at);
        k.dv = at(dqkv, l.v_at);
        Tensor workspace =
            scratch_bytes(saved.device(), cuda.cudnn_attention_workspace_bytes(k, true));
        k.workspace = workspace.raw_data();
        cuda.cudnn_attention_backward(k);
        return {dqkv};
    };
    return record(op, {qkv}, out, backward);
}

// The packed layouts' calls whose cuDNN graph could not be built (they take the permutes from
// then on), by what makes their graphs differ, with cuDNN's reason; and the first reason.
struct PackedFailures {
    std::set<std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, bool>>
        calls;  // dtype, B, H, T, D, dropout p, backward
    std::string first;
};
PackedFailures& packed_failures() {
    static PackedFailures failures;
    return failures;
}

// The attention's shape and dropout draw: the generator's counters move as for every backend.
AttentionShape attention_shape(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d,
                               double dropout_p, bool training) {
    AttentionShape a{b * h, t, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                     training ? static_cast<float>(dropout_p) : 0.0f, 0, 0};
    if (a.p > 0.0f) {
        Generator& gen = default_generator();
        a.seed = gen.seed();
        a.offset = gen.advance_aligned(static_cast<std::uint64_t>(a.rows() * t));
    }
    return a;
}

}  // namespace

std::string cudnn_attention_unsupported(const AttentionCall& call) {
    if (call.device != Device::cuda)
        return "the tensors are on the CPU (cuDNN runs on CUDA tensors)";
    if (!is_half(call.dtype))
        return std::string("the tensors are ") + dtype_name(call.dtype) +
               " (cuDNN's fused attention takes bf16 or f16: train.precision bf16)";
    if (!call.aligned) return "qkv's data is not 16-byte aligned (a view at an odd offset)";
    if (call.records_backward && call.seq_len < 2)
        return "cuDNN's backward takes sequences of T >= 2, not " + std::to_string(call.seq_len);
    CudaBackend* cuda = cuda_backend_or_null();
    if (!cuda)
        return built_with_cuda() ? "no CUDA device is available"
                                 : "fusegrad was built without CUDA";
    return cuda->cudnn_attention_unsupported(scalar_type(call.dtype), call.head_dim);
}

// Under automatic a forward-only call (evaluation, sampling) keeps the fused kernels: sampling
// grows T by one token at a time, and cuDNN would build (and compile) a graph for every new T.
bool attention_runs_cudnn(const AttentionCall& call, AttentionBackend backend) {
    if (backend == AttentionBackend::fused) return false;
    if (backend == AttentionBackend::automatic && !call.records_backward) return false;
    return cudnn_attention_unsupported(call).empty();
}

Tensor causal_attention(const Tensor& qkv, double dropout_p, bool training,
                        const AttentionOptions& options) {
    const char* op = "causal_attention";
    check_defined(op, qkv, "qkv");
    check_arithmetic_dtype(op, qkv);
    FG_CHECK(qkv.dim() == 5 && qkv.size(0) == 3, op, "qkv must be (3, B, H, T, D), got ",
             shape_str(qkv.shape()));
    FG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, "dropout p must be in [0, 1), got ", dropout_p);
    const std::int64_t b = qkv.size(1), h = qkv.size(2), t = qkv.size(3), d = qkv.size(4);
    FG_CHECK(t > 0 && d > 0, op, "qkv needs T >= 1 and D >= 1, got ", shape_str(qkv.shape()));
    const bool cudnn = use_cudnn(qkv, t, d, options.backend);  // before the generator moves
    const AttentionShape a = attention_shape(b, h, t, d, dropout_p, training);
    if (cudnn) return cudnn_attention(qkv, a, heads_layout(qkv, a));
    const DType dt = qkv.dtype(), acc = accumulate_dtype(dt);
    const bool half = is_half(dt);
    const MatmulOptions products{options.tf32};
    Tensor out = Tensor::empty({b, h, t, d}, dt, qkv.device());
    Tensor lse = Tensor::empty({a.rows()}, acc, qkv.device());
    {
        Tensor s = Tensor::empty({a.heads_total, t, t}, acc, qkv.device());
        scores(qkv, s, a, products);
        Tensor pd = half ? Tensor::empty({a.heads_total, t, t}, dt, qkv.device()) : s;
        probs(s, pd, lse, true, a);  // in place when f32: S becomes Pd
        gemm_raw(qkv.device(), dt, dt, false, false, t, d, t, pd.raw_data(), t * t,
                 at(qkv, 2 * a.qkv_stride()), t * d, out.raw_data(), t * d, a.heads_total,
                 products);
    }
    Tensor saved = qkv.detach();
    return record(op, {qkv}, out, [saved, lse, a, products](const Tensor& g) -> std::vector<Tensor> {
        const std::int64_t t = a.t, d = a.d, tt = t * t, td = t * d, n = a.heads_total;
        const Device dev = saved.device();
        const DType dt = saved.dtype(), acc = accumulate_dtype(dt);
        const bool half = is_half(dt);
        Tensor dqkv = Tensor::empty(saved.shape(), dt, dev);
        Tensor s = Tensor::empty({n, t, t}, acc, dev);
        Tensor pd = Tensor::empty({n, t, t}, dt, dev);
        Tensor lse_copy = lse;  // the lambda's captures are const
        scores(saved, s, a, products);
        probs(s, pd, lse_copy, false, a);
        // dV = Pd^T dO
        gemm_raw(dev, dt, dt, true, false, t, d, t, pd.raw_data(), tt, g.raw_data(), td,
                 at(dqkv, 2 * a.qkv_stride()), td, n, products);
        // dPd = dO V^T, kept in the accumulate dtype: into Pd's buffer when that is the same
        Tensor dpd = half ? Tensor::empty({n, t, t}, acc, dev) : pd;
        gemm_raw(dev, dt, acc, false, true, t, t, d, g.raw_data(), td,
                 at(saved, 2 * a.qkv_stride()), td, dpd.raw_data(), tt, n, products);
        // dS (scale included), the next GEMMs' operand: in S's buffer when f32, else in Pd's
        Tensor ds = half ? pd : s;
        probs_backward(s, dpd, lse, ds, a);
        // dQ = dS K;  dK = dS^T Q
        gemm_raw(dev, dt, dt, false, false, t, d, t, ds.raw_data(), tt, at(saved, a.qkv_stride()),
                 td, at(dqkv, 0), td, n, products);
        gemm_raw(dev, dt, dt, true, false, t, d, t, ds.raw_data(), tt, at(saved, 0), td,
                 at(dqkv, a.qkv_stride()), td, n, products);
        return {dqkv};
    });
}

namespace ops_detail {

// A row of qkv is one token's q, k and v, each with its heads side by side; a row of out is one
// token's heads side by side.
AttentionLayout packed_attention_layout(std::int64_t b, std::int64_t h, std::int64_t t,
                                        std::int64_t d) {
    const std::int64_t c = h * d;
    return {b, h, c, 2 * c, t * 3 * c, d, 3 * c, {b, t, c}, t * c, d, c};
}

}  // namespace ops_detail

Tensor causal_self_attention(const Tensor& qkv, std::int64_t heads, double dropout_p,
                             bool training, const AttentionOptions& options) {
    const char* op = "causal_self_attention";
    check_defined(op, qkv, "qkv");
    FG_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op, "qkv must be (B, T, 3 C), got ",
             shape_str(qkv.shape()));
    const std::int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
    FG_CHECK(heads > 0 && c % heads == 0, op, "C = ", c, " is not divisible by ", heads, " heads");
    const std::int64_t h = heads, d = c / h;
    // cuDNN on the layouts as they are, unless cuDNN refused this call's graph before.
    if (t > 0 && d > 0 && qkv.is_cuda() && (d * dtype_size(qkv.dtype())) % 16 == 0) {
        check_arithmetic_dtype(op, qkv);
        FG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, "dropout p must be in [0, 1), got ",
                 dropout_p);
        const bool backward = needs_grad({qkv});
        const float p = training ? static_cast<float>(dropout_p) : 0.0f;
        const auto call = std::make_tuple(static_cast<int>(qkv.dtype()), b, h, t, d, p, backward);
        if (!packed_failures().calls.count(call) && use_cudnn(qkv, t, d, options.backend)) {
            // The graph is built (and checked by cuDNN) before the generator moves. A capture
            // finds it built by the eager steps before it; it must not take a failure inside
            // the capture for the layout's.
            const AttentionShape probe = attention_shape(b, h, t, d, dropout_p, false);
            kernels::CudnnAttentionArgs k =
                cudnn_args(qkv, probe, packed_attention_layout(b, h, t, d));
            k.p = p;
            static float stats_probe;  // for the graph only whether stats is null matters
            k.stats = backward ? &stats_probe : nullptr;
            CudaBackend& cuda = cuda_backend(op);
            bool built = true;
            try {
                cuda.cudnn_attention_workspace_bytes(k, false);
                if (backward) cuda.cudnn_attention_workspace_bytes(k, true);
            } catch (const std::exception& e) {
                if (cuda.capturing()) throw;
                PackedFailures& f = packed_failures();
                f.calls.insert(call);
                if (f.first.empty()) f.first = e.what();
                built = false;
            }
            if (built) {
                const AttentionShape a = attention_shape(b, h, t, d, dropout_p, training);
                return cudnn_attention(qkv, a, packed_attention_layout(b, h, t, d));
            }
        }
    }
    return merge_heads(causal_attention(permute(qkv.reshape({b, t, 3, h, d}), {2, 0, 3, 1, 4}),
                                        dropout_p, training, options));
}

std::string packed_cudnn_attention_failure() { return packed_failures().first; }

}  // namespace fg
