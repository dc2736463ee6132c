// core/ops/linear.cpp: linear(x, weight, bias), a Linear layer's y = x @ weight^T + bias computed
// in x's dtype. Everywhere it is the composition cast -> matmul -> add of the recorded ops (their
// backwards included), except for 16-bit CUDA inputs with f32 parameters and a bias, where
// cuBLASLt's epilogues carry the bias (kernels/linear_lt.h):
//   forward:  y = x @ w16^T + b16 in one product, the bias added to the fp32 accumulator before y
//             is rounded (w16, b16: the f32 parameters rounded to x's dtype, as the cast does);
//   backward: dx = dy @ w16 (16-bit, as matmul's), dw = dy^T @ x written in f32 by the product
//             itself, and db = sum over rows of dy summed in f32 from dy's 16-bit values.
// What that removes from a step: the bias add as a kernel of its own, and the 16-bit weight and
// bias gradients with their casts back to f32. The values differ from the composition's
// by roundings only (y's bias is added before y is rounded, dw is not rounded to 16 bits on the
// way), which the GPU tests bound. Where cuBLASLt has no algorithm for an epilogue, that call runs
// the composition, and linear_epilogue_failure() says why (the plain products fall back to cuBLAS
// inside kernels::gemm). Every product runs with training_products(options).
//
// mlp(x, w1, b1, w2, b2, form): an MLP's two layers, y = linear(gelu(linear(x, w1, b1)), w2, b2).
// With GPT-2's tanh GELU (the one cuBLASLt has) and the same conditions as above, the GELU rides
// in the products' epilogues too:
//   forward:  a = gelu(x @ w1^T + b1) and pre = x @ w1^T + b1 from one product
//             (EPILOGUE_GELU_AUX_BIAS), then y = a @ w2^T + b2 as linear's;
//   backward: dw2, db2 as linear's; dpre = (dy @ w2) * gelu'(pre) from one product
//             (EPILOGUE_DGELU); dw1, db1 from dpre as linear's; dx = dpre @ w1.
// So the GELU's forward and backward kernels, and a's gradient as a tensor, are gone. It keeps
// what the composition keeps (x, pre, a and the 16-bit weights).
#include <mutex>
#include <sstream>
#include <string>

#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

Tensor composed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                const MatmulOptions& options) {
    Tensor w = cast(weight, x.dtype());
    Tensor y = matmul(x, w, false, true, options);
    return bias.defined() ? add(y, cast(bias, x.dtype())) : y;
}

// The first refusal, kept for whoever logs it (linear_epilogue_failure).
struct Refusals {
    std::mutex guard;
    std::string first;
};
Refusals& refusals() {
    static Refusals r;
    return r;
}
void note_refusal(const char* what, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                  const char* instead = "a matmul and separate bias kernels") {
    Refusals& r = refusals();
    std::lock_guard<std::mutex> lock(r.guard);
    if (!r.first.empty()) return;
    std::ostringstream s;
    s << "cuBLASLt has no algorithm for the " << what << " of a " << dtype_name(dtype) << " (" << m
      << " x " << k << ") @ (" << n << " x " << k << ")^T linear layer; it runs as " << instead;
    r.first = s.str();
}

// Checks a layer's parameters: weight (n, k) 2-D, bias (n) or undefined, both on x's device.
void check_layer_params(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const char* weight_name, const char* bias_name) {
    check_defined(op, weight, weight_name);
    FG_CHECK(weight.dim() == 2, op, weight_name, " must be 2-D (out_features, in_features), got shape ",
             shape_str(weight.shape()));
    check_same_device(op, x, weight);
    if (bias.defined()) {
        FG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, bias_name, " of shape ",
                 shape_str(bias.shape()), " does not fit ", weight_name, " of shape ",
                 shape_str(weight.shape()), ": it needs shape (", weight.size(0), ")");
        check_same_device(op, x, bias);
    }
}

// Checks linear's arguments (x (..., k), weight (n, k), bias (n) or undefined).
void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const char* weight_name = "weight", const char* bias_name = "bias") {
    check_defined(op, x, "input");
    check_layer_params(op, x, weight, bias, weight_name, bias_name);
    FG_CHECK(x.dim() >= 2 && x.size(-1) == weight.size(1), op, "input of shape ",
             shape_str(x.shape()), " does not fit ", weight_name, " of shape ",
             shape_str(weight.shape()), ": it needs at least 2 dims, the last of ", weight.size(1));
}

// Whether cuBLASLt's epilogues may carry a layer: 16-bit CUDA input, f32 weight and bias, and
// no empty dimension.
bool epilogue_fits(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return x.is_cuda() && is_half(x.dtype()) && bias.defined() && weight.dtype() == DType::f32 &&
           bias.dtype() == DType::f32 && weight.size(0) > 0 && weight.size(1) > 0 && x.numel() > 0;
}

// The backward's products of a layer y (m, n) = x (m, k) @ w16^T + b, given g = dy:
// dx = g @ w16 in x's dtype, on raw buffers.
Tensor input_grad(const Tensor& g, const Tensor& w16, const Shape& x_shape, std::int64_t m,
                  std::int64_t n, std::int64_t k, DType dt, const MatmulOptions& options) {
    Tensor dx = Tensor::empty(x_shape, dt, Device::cuda);
    gemm_raw(Device::cuda, dt, dt, false, false, m, k, n, g.raw_data(), 0, w16.raw_data(), 0,
             dx.raw_data(), m * k, 1, options);
    return dx;
}

// dw = g^T @ x written in f32 by the product; db = sum over rows of g (f32), by column_sum
// straight from g's 16-bit values.
std::pair<Tensor, Tensor> weight_and_bias_grad(const Tensor& g, const Tensor& x, std::int64_t m,
                                               std::int64_t n, std::int64_t k, DType dt,
                                               const MatmulOptions& options) {
    Tensor dw = Tensor::empty({n, k}, DType::f32, Device::cuda);
    gemm_raw(Device::cuda, dt, DType::f32, true, false, n, k, m, g.raw_data(), 0, x.raw_data(), 0,
             dw.raw_data(), n * k, 1, options);
    CudaBackend& cuda = cuda_backend("linear");
    Tensor db = Tensor::empty({n}, DType::f32, Device::cuda);
    Tensor ws = scratch_bytes(Device::cuda, cuda.column_sum_workspace_bytes(m, n));
    cuda.column_sum(scalar_type(dt), g.raw_data(), m, n, db.raw_data(), ws.raw_data(), true);
    return {dw, db};
}

Shape with_last(Shape s, std::int64_t last) {
    s.back() = last;
    return s;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const MatmulOptions& options) {
    const char* op = "linear";
    check_linear(op, x, weight, bias);
    if (!epilogue_fits(x, weight, bias)) return composed(x, weight, bias, options);
    const std::int64_t n = weight.size(0), k = weight.size(1), m = x.numel() / k;
    const MatmulOptions products = training_products(options, {x, weight, bias});

    const DType dt = x.dtype();
    Tensor w16 = cast_raw(weight, dt), b16 = cast_raw(bias, dt);
    Tensor y = Tensor::empty(with_last(x.shape(), n), dt, x.device());
    if (!cuda_backend(op).linear_forward_lt(scalar_type(dt), m, n, k, x.raw_data(), w16.raw_data(),
                                            b16.raw_data(), y.raw_data(), products.autotune)) {
        note_refusal("bias epilogue", m, n, k, dt);
        return composed(x, weight, bias, options);
    }
    Tensor sx = x.detach();
    return record(op, {x, weight, bias}, y,
                  [sx, w16, m, n, k, dt, products](const Tensor& g) -> std::vector<Tensor> {
        Tensor dx = input_grad(g, w16, sx.shape(), m, n, k, dt, products);
        auto [dw, db] = weight_and_bias_grad(g, sx, m, n, k, dt, products);
        return {dx, dw, db};
    });
}

Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
           const Tensor& b2, GeluForm form, const MatmulOptions& options) {
    const char* op = "mlp";
    check_linear(op, x, w1, b1, "first weight", "first bias");
    check_layer_params(op, x, w2, b2, "second weight", "second bias");
    FG_CHECK(w2.size(1) == w1.size(0), op, "second weight of shape ", shape_str(w2.shape()),
             " does not fit first weight of shape ", shape_str(w1.shape()),
             ": it needs shape (out_features, ", w1.size(0), ")");
    auto composition = [&] {
        return linear(gelu(linear(x, w1, b1, options), form), w2, b2, options);
    };
    if (form != GeluForm::tanh || !epilogue_fits(x, w1, b1) || !epilogue_fits(x, w2, b2))
        return composition();
    const std::int64_t c = w1.size(1), h = w1.size(0), out = w2.size(0), m = x.numel() / c;
    const MatmulOptions products = training_products(options, {x, w1, b1, w2, b2});

    const DType dt = x.dtype();
    Tensor w1_16 = cast_raw(w1, dt), b1_16 = cast_raw(b1, dt);
    Tensor w2_16 = cast_raw(w2, dt), b2_16 = cast_raw(b2, dt);
    Tensor a = Tensor::empty({m, h}, dt, x.device()), pre = Tensor::empty({m, h}, dt, x.device());
    Tensor y = Tensor::empty(with_last(x.shape(), out), dt, x.device());
    CudaBackend& cuda = cuda_backend(op);
    if (!cuda.linear_gelu_forward_lt(scalar_type(dt), m, h, c, x.raw_data(), w1_16.raw_data(),
                                     b1_16.raw_data(), a.raw_data(), pre.raw_data(),
                                     products.autotune)) {
        note_refusal("GELU epilogue", m, h, c, dt, "a matmul and separate bias and GELU kernels");
        return composition();
    }
    if (!cuda.linear_forward_lt(scalar_type(dt), m, out, h, a.raw_data(), w2_16.raw_data(),
                                b2_16.raw_data(), y.raw_data(), products.autotune)) {
        note_refusal("bias epilogue", m, out, h, dt);
        return composition();
    }
    Tensor sx = x.detach();
    return record(op, {x, w1, b1, w2, b2}, y,
                  [sx, a, pre, w1_16, w2_16, m, c, h, out, dt, products](const Tensor& g) -> std::vector<Tensor> {
        auto [dw2, db2] = weight_and_bias_grad(g, a, m, out, h, dt, products);
        Tensor dpre = Tensor::empty({m, h}, dt, Device::cuda);
        if (!cuda_backend("mlp").linear_input_grad_dgelu_lt(scalar_type(dt), m, out, h,
                                                            g.raw_data(), w2_16.raw_data(),
                                                            pre.raw_data(), dpre.raw_data(),
                                                            products.autotune)) {
            note_refusal("GELU-gradient epilogue", m, out, h, dt,
                         "a matmul and a separate GELU-gradient kernel");
            dpre = gelu_backward(pre, input_grad(g, w2_16, {m, h}, m, out, h, dt, products),
                                 GeluForm::tanh);
        }
        auto [dw1, db1] = weight_and_bias_grad(dpre, sx, m, h, c, dt, products);
        Tensor dx = input_grad(dpre, w1_16, sx.shape(), m, h, c, dt, products);
        return {dx, dw1, db1, dw2, db2};
    });
}

std::string linear_epilogue_failure() {
    Refusals& r = refusals();
    std::lock_guard<std::mutex> lock(r.guard);
    return r.first;
}

}  // namespace fg
