// core/ops/linear.cpp: linear(x, weight, bias), a Linear layer's y = x @ weight^T + bias computed
// in x's dtype. Everywhere it is the composition cast -> matmul -> add of the recorded ops (their
// backwards included), except for 16-bit CUDA inputs with f32 parameters and a bias, where
// cuBLASLt's epilogues carry the bias (kernels/linear_lt.h):
//   forward:  y = x @ w16^T + b16 in one product, the bias added to the fp32 accumulator before y
//             is rounded (w16, b16: the f32 parameters rounded to x's dtype, as the cast does);
//   backward: dx = dy @ w16 (16-bit, as matmul's), and dw = dy^T @ x written in f32 by the product
//             itself, with db = sum over rows of dy from the same pass over dy.
// What that removes from a step: the bias add and the column sum as kernels of their own, and
// the 16-bit weight gradient with its cast back to f32. The values differ from the composition's
// by roundings only (y's bias is added before y is rounded, dw is not rounded to 16 bits on the
// way), which the GPU tests bound. Where cuBLASLt has no algorithm for a call, that call runs the
// composition, and linear_epilogue_failure() says why.
#include <mutex>
#include <sstream>
#include <string>

#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

Tensor composed(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    Tensor w = cast(weight, x.dtype());
    Tensor y = matmul(x, w, false, true);
    return bias.defined() ? add(y, cast(bias, x.dtype())) : y;
}

// The first refusal, kept for the trainer's log.
struct Refusals {
    std::mutex guard;
    std::string first;
};
Refusals& refusals() {
    static Refusals r;
    return r;
}
void note_refusal(const char* what, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype) {
    Refusals& r = refusals();
    std::lock_guard<std::mutex> lock(r.guard);
    if (!r.first.empty()) return;
    std::ostringstream s;
    s << "cuBLASLt has no algorithm for the " << what << " of a " << dtype_name(dtype) << " (" << m
      << " x " << k << ") @ (" << n << " x " << k << ")^T linear layer; it runs as a matmul and "
      << "separate bias kernels";
    r.first = s.str();
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const char* op = "linear";
    check_defined(op, x, "input");
    check_defined(op, weight, "weight");
    FG_CHECK(weight.dim() == 2, op, "weight must be 2-D (out_features, in_features), got shape ",
             shape_str(weight.shape()));
    FG_CHECK(x.dim() >= 2 && x.size(-1) == weight.size(1), op, "input of shape ",
             shape_str(x.shape()), " does not fit weight of shape ", shape_str(weight.shape()),
             ": it needs at least 2 dims, the last of ", weight.size(1));
    check_same_device(op, x, weight);
    if (bias.defined()) {
        FG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, "bias of shape ",
                 shape_str(bias.shape()), " does not fit weight of shape ",
                 shape_str(weight.shape()), ": it needs shape (", weight.size(0), ")");
        check_same_device(op, x, bias);
    }
    const std::int64_t n = weight.size(0), k = weight.size(1);
    const bool fused = x.is_cuda() && is_half(x.dtype()) && bias.defined() &&
                       weight.dtype() == DType::f32 && bias.dtype() == DType::f32 && n > 0 &&
                       k > 0 && x.numel() > 0;
    if (!fused) return composed(x, weight, bias);
    const std::int64_t m = x.numel() / k;

    const DType dt = x.dtype();
    Tensor w16 = cast_raw(weight, dt), b16 = cast_raw(bias, dt);
    Shape out_shape = x.shape();
    out_shape.back() = n;
    Tensor y = Tensor::empty(out_shape, dt, x.device());
    CudaBackend& cuda = cuda_backend(op);
    if (!cuda.linear_forward_lt(scalar_type(dt), m, n, k, x.raw_data(), w16.raw_data(),
                                b16.raw_data(), y.raw_data())) {
        note_refusal("bias epilogue", m, n, k, dt);
        return composed(x, weight, bias);
    }
    Tensor sx = x.detach();
    return record(op, {x, weight, bias}, y,
                  [sx, w16, m, n, k, dt](const Tensor& g) -> std::vector<Tensor> {
        CudaBackend& be = cuda_backend("linear");
        Tensor dx = Tensor::empty(sx.shape(), dt, sx.device());
        gemm_raw(Device::cuda, dt, dt, false, false, m, k, n, g.raw_data(), 0, w16.raw_data(), 0,
                 dx.raw_data(), m * k, 1);
        Tensor dw = Tensor::empty({n, k}, DType::f32, sx.device());
        Tensor db = Tensor::empty({n}, DType::f32, sx.device());
        if (!be.linear_weight_grad_lt(scalar_type(dt), m, n, k, g.raw_data(), sx.raw_data(),
                                      dw.data<float>(), db.data<float>())) {
            note_refusal("bias-gradient epilogue", m, n, k, dt);
            gemm_raw(Device::cuda, dt, DType::f32, true, false, n, k, m, g.raw_data(), 0,
                     sx.raw_data(), 0, dw.raw_data(), n * k, 1);
            db = sum_to(cast_raw(g.reshape({m, n}), DType::f32), {n});  // f32, as the epilogue's
        }
        return {dx, dw, db};
    });
}

std::string linear_epilogue_failure() {
    Refusals& r = refusals();
    std::lock_guard<std::mutex> lock(r.guard);
    return r.first;
}

}  // namespace fg
