// core/ops/reduce.cpp: sum and mean over everything or over the last dim.
//   s = sum_i x_i:          dx_i = g              (g broadcast back to x's shape)
//   s_r = sum_c x[r, c]:    dx[r, c] = g_r
// Means scale by 1/N both ways. CPU references accumulate in double for f32 inputs; 16-bit inputs
// sum in fp32 on the GPU and in double on the CPU, and round once to their dtype.
#include <numeric>

#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

template <typename T>
void row_sum_cpu(const T* x, std::int64_t rows, std::int64_t cols, double alpha, T* out) {
    for (std::int64_t r = 0; r < rows; ++r)
        out[r] = static_cast<T>(alpha * std::accumulate(x + r * cols, x + (r + 1) * cols, 0.0));
}

// (rows, cols) -> (rows): alpha * row sums. Not recorded.
Tensor row_sum(const Tensor& x, std::int64_t rows, std::int64_t cols, double alpha,
               const Shape& out_shape) {
    Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
    if (x.is_cuda()) {
        const kernels::ScalarType type = scalar_type(x.dtype());
        if (cols == 0) {
            cuda_backend("sum").memset(out.raw_data(), 0, out.nbytes());
        } else if (rows == 1) {  // one long row: the two-stage total sum is far wider
            CudaBackend& cuda = cuda_backend("sum");
            Tensor ws = scratch_bytes(x.device(), cuda.total_sum_workspace_bytes(cols));
            cuda.total_sum(type, x.raw_data(), cols, static_cast<float>(alpha), out.raw_data(),
                           ws.raw_data());
        } else {
            cuda_backend("sum").row_sum(type, x.raw_data(), rows, cols, static_cast<float>(alpha),
                                        out.raw_data());
        }
    } else {
        cpu_reference(x, out, [&](const auto* src, auto* dst) {
            row_sum_cpu(src, rows, cols, alpha, dst);
        });
    }
    return out;
}

Tensor reduce_all(const char* op, const Tensor& x, bool is_mean) {
    check_arithmetic_dtype(op, x);
    std::int64_t n = x.numel();
    FG_CHECK(!is_mean || n > 0, op, "mean of an empty tensor");
    double alpha = is_mean ? 1.0 / n : 1.0;
    Tensor out = row_sum(x, 1, n, alpha, {});
    Shape shape = x.shape();
    return record(op, {x}, out, [shape, alpha](const Tensor& g) -> std::vector<Tensor> {
        return {broadcast_to(scale(g, alpha), shape)};
    });
}

Tensor reduce_last(const char* op, const Tensor& x, bool is_mean) {
    check_arithmetic_dtype(op, x);
    FG_CHECK(x.dim() >= 1, op, "needs at least one dimension, got a scalar");
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    std::int64_t cols = x.size(-1), rows = shape_numel(out_shape);
    FG_CHECK(!is_mean || cols > 0, op, "mean over an empty last dimension");
    double alpha = is_mean ? 1.0 / cols : 1.0;
    Tensor out = row_sum(x, rows, cols, alpha, out_shape);
    Shape shape = x.shape();
    return record(op, {x}, out, [shape, alpha, rows](const Tensor& g) -> std::vector<Tensor> {
        // g (rows) -> (rows, 1) broadcast over the last dim.
        return {broadcast_to(scale(g, alpha).reshape({rows, 1}), {rows, shape.back()})
                    .reshape(shape)};
    });
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_all("sum", x, false); }
Tensor mean(const Tensor& x) { return reduce_all("mean", x, true); }
Tensor sum_last(const Tensor& x) { return reduce_last("sum_last", x, false); }
Tensor mean_last(const Tensor& x) { return reduce_last("mean_last", x, true); }

}  // namespace fg
