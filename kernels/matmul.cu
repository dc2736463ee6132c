// kernels/matmul.cu: see matmul.h.
//
// Row-major through a column-major library: a row-major (R, C) matrix is, byte for byte, the
// column-major (C, R) matrix, its transpose. So C = op(A) op(B) in row-major is
// C^T = op(B)^T op(A)^T in column-major, which is one cuBLAS call with the operands swapped:
// B first (N x K), then A (K x M), giving C^T (N x M) with leading dimension N. A row-major
// operand that is "not transposed" is passed as CUBLAS_OP_N with leading dimension = its columns.
#include <cublas_v2.h>

#include "matmul.h"
#include "runtime.h"

#define FG_CUBLAS_CHECK(expr)                                                           \
    do {                                                                                \
        cublasStatus_t fg_status_ = (expr);                                             \
        if (fg_status_ != CUBLAS_STATUS_SUCCESS)                                        \
            ::fg::kernels::detail::throw_cublas_error(fg_status_, #expr, __FILE__, __LINE__); \
    } while (0)

namespace fg::kernels {
namespace {

bool g_tf32 = false;

cublasHandle_t handle() {
    static cublasHandle_t h = [] {
        cublasHandle_t created = nullptr;
        FG_CUBLAS_CHECK(cublasCreate(&created));
        FG_CUBLAS_CHECK(cublasSetStream(created, stream()));
        return created;
    }();
    return h;
}

}  // namespace

void set_tf32(bool enabled) { g_tf32 = enabled; }

void gemm_f32(bool trans_a, bool trans_b, long long m, long long n, long long k, float alpha,
              const float* a, long long stride_a, const float* b, long long stride_b, float beta,
              float* c, long long stride_c, long long batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    long long ld_b = trans_b ? k : n;  // row length of B as stored
    long long ld_a = trans_a ? m : k;
    cublasComputeType_t compute = g_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    FG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle(), op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, CUDA_R_32F, (int)ld_b, stride_b,
        a, CUDA_R_32F, (int)ld_a, stride_a, &beta, c, CUDA_R_32F, (int)n, stride_c, (int)batch,
        compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace fg::kernels
