// core/ops/matmul.cpp: C = op(A) @ op(B), batched, with op the transpose of the last two dims
// when asked. cuBLAS on the GPU (a single 16-bit product through cuBLASLt, kernels/linear_lt.h;
// kernels/matmul.cu holds the row-major note), CBLAS (OpenBLAS) on the CPU; no hand-written GEMM.
// Backward, for C = op(A) op(B) and upstream G:
//   d op(A) = G op(B)^T,  d op(B) = op(A)^T G, and transposing back where op was a transpose:
//   dA = G op(B)^T  (or op(B) G^T when trans_a);   dB = op(A)^T G  (or G^T op(A) when trans_b)
// When B is 2-D and A batched (a Linear layer), dB sums over the batch: one GEMM on A flattened.
#include <cblas.h>

#include <vector>

#include "kernels/half.h"

#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

struct GemmShape {
    std::int64_t batch, m, n, k;
    std::int64_t stride_a, stride_b;  // 0 for an operand shared by every batch entry
    Shape out_shape;
};

GemmShape gemm_shape(const Tensor& a, const Tensor& b, bool ta, bool tb) {
    const char* op = "matmul";
    FG_CHECK(a.dim() >= 2 && b.dim() >= 2, op, "inputs need at least 2 dims, got ",
             shape_str(a.shape()), " and ", shape_str(b.shape()));
    GemmShape s;
    std::int64_t a_rows = a.size(-2), a_cols = a.size(-1);
    std::int64_t b_rows = b.size(-2), b_cols = b.size(-1);
    s.m = ta ? a_cols : a_rows;
    s.k = ta ? a_rows : a_cols;
    std::int64_t kb = tb ? b_cols : b_rows;
    s.n = tb ? b_rows : b_cols;
    FG_CHECK(s.k == kb, op, "inner dimensions differ: ", shape_str(a.shape()),
             (ta ? "^T" : ""), " @ ", shape_str(b.shape()), (tb ? "^T" : ""), " (", s.k, " vs ",
             kb, ")");
    Shape lead_a(a.shape().begin(), a.shape().end() - 2);
    Shape lead_b(b.shape().begin(), b.shape().end() - 2);
    if (b.dim() == 2 && a.dim() > 2 && !ta) {
        // Shared B: fold A's leading dims into M (one GEMM).
        s.batch = 1;
        s.m = shape_numel(lead_a) * a_rows;
        s.stride_a = s.stride_b = 0;
    } else {
        FG_CHECK(lead_a == lead_b, op, "batch dimensions differ: ", shape_str(a.shape()), " and ",
                 shape_str(b.shape()));
        s.batch = shape_numel(lead_a);
        s.stride_a = a_rows * a_cols;
        s.stride_b = b_rows * b_cols;
    }
    s.out_shape = lead_a;
    s.out_shape.push_back(ta ? a_cols : a_rows);
    s.out_shape.push_back(s.n);
    return s;
}

template <typename T>
void gemm_cpu(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
              const T* b, T* c) {
    CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0f, a, lda, b, ldb, 0.0f, c,
                    (int)n);
    else
        cblas_dgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0, a, lda, b, ldb, 0.0, c,
                    (int)n);
}

// count 16-bit values from raw host memory, widened to float.
std::vector<float> widen_raw(const void* src, DType dtype, std::int64_t count) {
    const auto* bits = static_cast<const std::uint16_t*>(src);
    std::vector<float> out(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
        out[i] = dtype == DType::bf16 ? half::bf16_to_float(bits[i]) : half::f16_to_float(bits[i]);
    return out;
}

// op(a) @ op(b), not recorded.
Tensor gemm(const Tensor& a, const Tensor& b, bool ta, bool tb, const MatmulOptions& options) {
    GemmShape s = gemm_shape(a, b, ta, tb);
    if (s.k == 0) return Tensor::zeros(s.out_shape, a.dtype(), a.device());  // the sum of nothing
    Tensor c = Tensor::empty(s.out_shape, a.dtype(), a.device());
    gemm_raw(a.device(), a.dtype(), a.dtype(), ta, tb, s.m, s.n, s.k, a.raw_data(), s.stride_a,
             b.raw_data(), s.stride_b, c.raw_data(), s.m * s.n, s.batch, options);
    return c;
}

}  // namespace

namespace ops_detail {

void gemm_raw(Device device, DType ab_dtype, DType c_dtype, bool ta, bool tb, std::int64_t m,
              std::int64_t n, std::int64_t k, const void* a, std::int64_t stride_a, const void* b,
              std::int64_t stride_b, void* c, std::int64_t stride_c, std::int64_t batch,
              const MatmulOptions& options) {
    FG_ASSERT(c_dtype == ab_dtype || (is_half(ab_dtype) && c_dtype == DType::f32),
              "gemm_raw: ", dtype_name(ab_dtype), " inputs cannot write ", dtype_name(c_dtype));
    if (batch == 0 || m == 0 || n == 0) return;
    if (device == Device::cuda) {
        cuda_backend("matmul").gemm(scalar_type(ab_dtype), scalar_type(c_dtype), ta, tb, m, n, k,
                                    1.0f, a, stride_a, b, stride_b, 0.0f, c, stride_c, batch,
                                    options.tf32, options.autotune);
        return;
    }
    if (is_half(ab_dtype)) {
        // 16-bit inputs on the CPU: widened to float, multiplied in f32, rounded once if C is
        // 16-bit.
        auto extent = [batch](std::int64_t stride, std::int64_t size) {
            return stride == 0 ? size : (batch - 1) * stride + size;
        };
        std::vector<float> wa = widen_raw(a, ab_dtype, extent(stride_a, m * k));
        std::vector<float> wb = widen_raw(b, ab_dtype, extent(stride_b, k * n));
        std::vector<float> wc(static_cast<std::size_t>(extent(stride_c, m * n)));
        float* out = c_dtype == DType::f32 ? static_cast<float*>(c) : wc.data();
        for (std::int64_t i = 0; i < batch; ++i)
            gemm_cpu<float>(ta, tb, m, n, k, wa.data() + i * stride_a, wb.data() + i * stride_b,
                            out + i * stride_c);
        if (c_dtype != DType::f32)
            for (std::int64_t i = 0; i < batch; ++i)
                round_raw(wc.data() + i * stride_c, c_dtype,
                          static_cast<std::uint16_t*>(c) + i * stride_c, m * n);
        return;
    }
    dispatch_float(ab_dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* pa = static_cast<const T*>(a);
        const T* pb = static_cast<const T*>(b);
        T* pc = static_cast<T*>(c);
        for (std::int64_t i = 0; i < batch; ++i)
            gemm_cpu<T>(ta, tb, m, n, k, pa + i * stride_a, pb + i * stride_b, pc + i * stride_c);
    });
}

MatmulOptions training_products(MatmulOptions options, const std::vector<Tensor>& inputs) {
    options.autotune = options.autotune && needs_grad(inputs);
    return options;
}

}  // namespace ops_detail

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, const MatmulOptions& options) {
    check_binary("matmul", a, b);
    const MatmulOptions products = training_products(options, {a, b});
    Tensor c = gemm(a, b, ta, tb, products);
    Tensor sa = a.detach(), sb = b.detach();
    return record("matmul", {a, b}, c, [sa, sb, ta, tb, products](const Tensor& g) -> std::vector<Tensor> {
        bool shared_b = sb.dim() == 2 && sa.dim() > 2;
        Tensor da = ta ? gemm(sb, g, tb, true, products) : gemm(g, sb, false, !tb, products);
        Tensor db;
        if (shared_b) {
            // Fold the batch into the rows: A (P, K), G (P, N) with P = batch * M.
            Tensor a2 = sa.reshape({-1, sa.size(-1)});
            Tensor g2 = g.reshape({-1, g.size(-1)});
            db = tb ? gemm(g2, a2, true, false, products) : gemm(a2, g2, true, false, products);
        } else {
            db = tb ? gemm(g, sa, true, ta, products) : gemm(sa, g, !ta, false, products);
        }
        return {da.reshape(sa.shape()), db.reshape(sb.shape())};
    });
}

}  // namespace fg
