// kernels/matmul.h: row-major batched GEMM through cuBLAS (one 16-bit product with alpha = 1 and
// beta = 0 through cuBLASLt, linear_lt.h, whose algorithm may be autotuned).
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b],  op(A) is (M, K), op(B) is (K, N), C (M, N)
// trans_a means A is stored (K, M) row-major; trans_b means B is stored (N, K). A stride of 0
// reuses one matrix for every batch entry. A and B share one storage type `ab_type`; C has
// `c_type`: f32 x f32 -> f32 (TF32 tensor-core math when `tf32` is asked), or bf16 / f16
// inputs on tensor cores with either their own type or f32 as C (attention's scores keep fp32).
// Products always accumulate in fp32. `autotune`: a 16-bit product that goes through cuBLASLt
// takes the fastest of its heuristic's first algorithms, timed at the shape's first call.
#pragma once

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

void gemm(ScalarType ab_type, ScalarType c_type, bool trans_a, bool trans_b, long long m,
          long long n, long long k, float alpha, const void* a, long long stride_a, const void* b,
          long long stride_b, float beta, void* c, long long stride_c, long long batch,
          bool tf32, bool autotune = false);

}  // namespace fg::kernels
