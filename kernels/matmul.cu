// kernels/matmul.cu: see matmul.h. One cublasGemmStridedBatchedEx call per gemm (a single 16-bit
// product with alpha = 1 and beta = 0 goes to cuBLASLt's, linear_lt.h, where it can): A and B of
// ab_type, C of c_type, products accumulated in fp32 (CUBLAS_COMPUTE_32F, or its TF32 form for f32
// inputs when the call asks for it), so alpha and beta are floats for every combination.
//
// Row-major through a column-major library: a row-major (R, C) matrix is, byte for byte, the
// column-major (C, R) matrix, its transpose. So C = op(A) op(B) in row-major is
// C^T = op(B)^T op(A)^T in column-major, which is one cuBLAS call with the operands swapped:
// B first (N x K), then A (K x M), giving C^T (N x M) with leading dimension N. A row-major
// operand that is "not transposed" is passed as CUBLAS_OP_N with leading dimension = its columns.
#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "linear_lt.h"
#include "matmul.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

cublasHandle_t handle() {
    static cublasHandle_t h = [] {
        cublasHandle_t created = nullptr;
        FG_CUBLAS_CHECK(cublasCreate(&created));
        FG_CUBLAS_CHECK(cublasSetStream(created, stream()));
        // 16-bit C: cuBLAS may otherwise add split-K partial sums in C's type; keep them fp32.
        FG_CUBLAS_CHECK(cublasSetMathMode(
            created, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
        return created;
    }();
    return h;
}

const char* type_name(ScalarType type) {
    switch (type) {
        case ScalarType::f32: return "f32";
        case ScalarType::f64: return "f64";
        case ScalarType::bf16: return "bf16";
        case ScalarType::f16: return "f16";
        case ScalarType::i32: return "i32";
    }
    return "unknown";
}

// The storage combinations gemm takes: f32 x f32 -> f32, and bf16 or f16 inputs with C of their
// own type or f32.
bool supported(ScalarType ab_type, ScalarType c_type) {
    switch (ab_type) {
        case ScalarType::f32: return c_type == ScalarType::f32;
        case ScalarType::bf16:
        case ScalarType::f16: return c_type == ab_type || c_type == ScalarType::f32;
        default: return false;
    }
}

cudaDataType_t cuda_type(ScalarType type) {
    switch (type) {
        case ScalarType::bf16: return CUDA_R_16BF;
        case ScalarType::f16: return CUDA_R_16F;
        default: return CUDA_R_32F;  // only f32 is left after supported()
    }
}

}  // namespace

void gemm(ScalarType ab_type, ScalarType c_type, bool trans_a, bool trans_b, long long m,
          long long n, long long k, float alpha, const void* a, long long stride_a, const void* b,
          long long stride_b, float beta, void* c, long long stride_c, long long batch,
          bool tf32, bool autotune) {
    if (!supported(ab_type, c_type))
        throw std::invalid_argument(std::string("gemm: A and B of ") + type_name(ab_type) +
                                    " with C of " + type_name(c_type) +
                                    " is not supported (f32/f32, bf16/bf16, bf16/f32, f16/f16, "
                                    "f16/f32 are)");
    if (m == 0 || n == 0 || batch == 0) return;
    const bool half = ab_type == ScalarType::bf16 || ab_type == ScalarType::f16;
    if (half && batch == 1 && k > 0 && alpha == 1.0f && beta == 0.0f &&
        gemm_lt(ab_type, c_type == ScalarType::f32, trans_a, trans_b, m, n, k, a, b, c, autotune))
        return;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    long long ld_b = trans_b ? k : n;  // row length of B as stored
    long long ld_a = trans_a ? m : k;
    const cudaDataType_t ab = cuda_type(ab_type), ct = cuda_type(c_type);
    // TF32 rounds f32 inputs to tensor-core precision; 16-bit inputs take the tensor cores with
    // plain COMPUTE_32F.
    cublasComputeType_t compute =
        tf32 && ab_type == ScalarType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    FG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle(), op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, ab, (int)ld_b, stride_b, a, ab,
        (int)ld_a, stride_a, &beta, c, ct, (int)n, stride_c, (int)batch, compute,
        CUBLAS_GEMM_DEFAULT));
}

}  // namespace fg::kernels
