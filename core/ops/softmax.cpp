// core/ops/softmax.cpp: softmax over the last dim (optionally causal) and fused softmax
// cross-entropy from logits. The math is stated in kernels/softmax.h; the CPU references below
// follow it line by line.
#include <algorithm>
#include <cmath>
#include <limits>

#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

template <typename T>
void softmax_forward_cpu(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t q_len,
                         T* y) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        std::int64_t visible = q_len > 0 ? std::min(cols, r % q_len + (cols - q_len) + 1) : cols;
        T m = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = 0; j < visible; ++j) m = std::max(m, xr[j]);
        T s = 0;
        for (std::int64_t j = 0; j < visible; ++j) s += std::exp(xr[j] - m);
        for (std::int64_t j = 0; j < cols; ++j) yr[j] = j < visible ? std::exp(xr[j] - m) / s : T(0);
    }
}

template <typename T>
void softmax_backward_cpu(const T* y, const T* g, std::int64_t rows, std::int64_t cols, T* dx) {
    for (std::int64_t r = 0; r < rows; ++r) {
        T dot = 0;
        for (std::int64_t j = 0; j < cols; ++j) dot += y[r * cols + j] * g[r * cols + j];
        for (std::int64_t j = 0; j < cols; ++j)
            dx[r * cols + j] = y[r * cols + j] * (g[r * cols + j] - dot);
    }
}

Tensor softmax_backward(const Tensor& y, const Tensor& g) {
    Tensor dx = empty_like(y);
    std::int64_t cols = y.size(-1), rows = cols ? y.numel() / cols : 0;
    if (y.is_cuda()) {
        cuda_backend("softmax").softmax_backward(scalar_type(y.dtype()), y.raw_data(),
                                                 g.raw_data(), rows, cols, dx.raw_data());
    } else {
        cpu_reference(y, g, dx, [&](const auto* ys, const auto* gs, auto* out) {
            softmax_backward_cpu(ys, gs, rows, cols, out);
        });
    }
    return dx;
}

// What the cross-entropy forward keeps for its backward. The statistics (and the loss) are kept
// in the logits' accumulate dtype: f32 for f32 and 16-bit logits, f64 for f64.
struct CrossEntropySaved {
    Tensor logits, targets;
    Tensor row_lse;    // (R) log-sum-exp of each row
    Tensor inv_count;  // () 1 / number of counted rows
    int ignore_index;
};

template <typename T>
void cross_entropy_forward_cpu(const T* x, const std::int32_t* t, std::int64_t rows,
                               std::int64_t cols, int ignore, T* lse_out, T* loss, T* inv_count) {
    double total = 0.0;
    std::int64_t count = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * cols;
        T m = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, xr[j]);
        T s = 0;
        for (std::int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - m);
        T lse = m + std::log(s);
        lse_out[r] = lse;
        if (t[r] == ignore) continue;
        FG_CHECK(t[r] >= 0 && t[r] < cols, "cross_entropy", "target ", t[r], " at row ", r,
                 " is out of range [0, ", cols, ")");
        total += lse - xr[t[r]];
        ++count;
    }
    loss[0] = static_cast<T>(total / static_cast<double>(count));  // 0 rows: NaN, as in PyTorch
    inv_count[0] = count ? static_cast<T>(1.0 / count) : T(0);
}

template <typename T>
void cross_entropy_backward_cpu(const T* x, const std::int32_t* t, const T* lse, T inv_count,
                                T dloss, std::int64_t rows, std::int64_t cols, int ignore, T* dx) {
    for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < cols; ++j) {
            T p = std::exp(x[r * cols + j] - lse[r]);
            dx[r * cols + j] = t[r] == ignore ? T(0) : dloss * inv_count * (p - (j == t[r] ? 1 : 0));
        }
    }
}

Tensor cross_entropy_backward(const CrossEntropySaved& s, const Tensor& g) {
    // The logits' gradient overwrites the logits when nothing else holds them (the usual case: a
    // model's head output feeds the loss alone), so a large vocabulary needs one (rows, V)
    // buffer, not two. Safe: each element is read once, by the thread that then writes it.
    const bool in_place = s.logits.sole_holder();
    Tensor dx = in_place ? s.logits : empty_like(s.logits);
    std::int64_t cols = s.logits.size(-1), rows = s.targets.numel();
    if (dx.is_cuda()) {
        cuda_backend("cross_entropy").cross_entropy_backward(
            scalar_type(dx.dtype()), s.logits.raw_data(), s.targets.data<std::int32_t>(),
            s.row_lse.data<float>(), s.inv_count.data<float>(), g.data<float>(), rows, cols,
            s.ignore_index, dx.raw_data());
    } else {
        cpu_reference(s.logits, dx, [&](const auto* x, auto* out) {
            using T = std::remove_pointer_t<decltype(out)>;
            cross_entropy_backward_cpu(x, s.targets.data<std::int32_t>(),
                                       static_cast<const T*>(s.row_lse.raw_data()),
                                       static_cast<const T*>(s.inv_count.raw_data())[0],
                                       static_cast<const T*>(g.raw_data())[0], rows, cols,
                                       s.ignore_index, out);
        });
    }
    return dx;
}

// The loss in the forward, its gradient in the backward: each reads the logits.
Tensor cross_entropy_two_pass(const Tensor& logits, const Tensor& targets, int ignore_index) {
    const char* op = "cross_entropy";
    std::int64_t cols = logits.size(-1), rows = targets.numel();
    const DType acc = accumulate_dtype(logits.dtype());  // of the loss and the statistics
    CrossEntropySaved s{logits.detach(), targets.detach(),
                        Tensor::empty({rows}, acc, logits.device()),
                        Tensor::empty({}, acc, logits.device()), ignore_index};
    Tensor loss = Tensor::empty({}, acc, logits.device());
    if (logits.is_cuda()) {
        Tensor row_loss = Tensor::empty({rows}, DType::f32, logits.device());
        cuda_backend(op).cross_entropy_forward(
            scalar_type(logits.dtype()), logits.raw_data(), targets.data<std::int32_t>(), rows,
            cols, ignore_index, s.row_lse.data<float>(), row_loss.data<float>(),
            loss.data<float>(), s.inv_count.data<float>());
    } else {
        Tensor xw = widened(logits);
        dispatch_float(xw.dtype(), [&](auto tag) {
            using T = decltype(tag);
            cross_entropy_forward_cpu<T>(static_cast<const T*>(xw.raw_data()),
                                         targets.data<std::int32_t>(), rows, cols, ignore_index,
                                         static_cast<T*>(s.row_lse.raw_data()),
                                         static_cast<T*>(loss.raw_data()),
                                         static_cast<T*>(s.inv_count.raw_data()));
        });
    }
    return record(op, {logits, targets}, loss, [s](const Tensor& g) -> std::vector<Tensor> {
        return {cross_entropy_backward(s, g), Tensor()};
    });
}

}  // namespace

Tensor softmax(const Tensor& x, bool causal) {
    check_arithmetic_dtype("softmax", x);
    FG_CHECK(x.dim() >= 1, "softmax", "needs at least one dimension, got a scalar");
    FG_CHECK(!causal || x.dim() >= 2, "softmax", "a causal softmax needs (..., Tq, Tk), got ",
             shape_str(x.shape()));
    std::int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
    std::int64_t q_len = causal ? x.size(-2) : 0;
    FG_CHECK(!causal || q_len <= cols, "softmax", "causal mask needs Tq <= Tk, got ",
             shape_str(x.shape()));
    Tensor y = empty_like(x);
    if (x.is_cuda()) {
        cuda_backend("softmax").softmax_forward(scalar_type(x.dtype()), x.raw_data(), rows, cols,
                                                q_len, y.raw_data());
    } else {
        cpu_reference(x, y, [&](const auto* src, auto* dst) {
            softmax_forward_cpu(src, rows, cols, q_len, dst);
        });
    }
    Tensor saved = y.detach();
    return record("softmax", {x}, y, [saved](const Tensor& g) -> std::vector<Tensor> {
        return {softmax_backward(saved, g)};
    });
}

Tensor cross_entropy(Tensor logits, const Tensor& targets, int ignore_index,
                     float expected_dloss) {
    const char* op = "cross_entropy";
    check_defined(op, logits, "logits");
    check_defined(op, targets, "targets");
    check_arithmetic_dtype(op, logits);
    check_same_device(op, logits, targets);
    FG_CHECK(targets.dtype() == DType::i32, op, "targets must be i32, got ",
             dtype_name(targets.dtype()));
    FG_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, op,
             "logits need a non-empty last (class) dim, got ", shape_str(logits.shape()));
    Shape lead(logits.shape().begin(), logits.shape().end() - 1);
    FG_CHECK(targets.shape() == lead, op, "targets have shape ", shape_str(targets.shape()),
             ", logits ", shape_str(logits.shape()), " need targets of shape ", shape_str(lead));
    FG_CHECK(std::isfinite(expected_dloss) && expected_dloss != 0.0f, op,
             "expected_dloss must be finite and non-zero, got ", expected_dloss);
    // One pass where a backward will follow and the logits were handed over (no one can read
    // them after this call).
    const std::int64_t cols = logits.size(-1), rows = targets.numel();
    const bool one_pass = logits.is_cuda() && grad_enabled() && logits.requires_grad() &&
                          logits.sole_holder() &&
                          cuda_backend(op).cross_entropy_one_pass_fits(
                              scalar_type(logits.dtype()), cols);
    if (!one_pass) return cross_entropy_two_pass(logits, targets, ignore_index);
    Tensor loss = Tensor::empty({}, DType::f32, logits.device());
    Tensor row_loss = Tensor::empty({rows}, DType::f32, logits.device());
    Tensor inv_count = Tensor::empty({}, DType::f32, logits.device());
    Tensor dx = logits.detach();  // the gradient, written over the logits
    cuda_backend(op).cross_entropy_one_pass(
        scalar_type(dx.dtype()), dx.raw_data(), targets.data<std::int32_t>(), rows, cols,
        ignore_index, expected_dloss, row_loss.data<float>(), loss.data<float>(),
        inv_count.data<float>(), dx.raw_data());
    return record(op, {logits, targets}, loss,
                  [dx, expected_dloss](const Tensor& g) -> std::vector<Tensor> {
                      cuda_backend("cross_entropy")
                          .cross_entropy_one_pass_backward(scalar_type(dx.dtype()),
                                                           g.data<float>(), expected_dloss,
                                                           dx.numel(), dx.raw_data());
                      return {dx, Tensor()};
                  });
}

}  // namespace fg
