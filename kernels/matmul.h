// kernels/matmul.h: row-major batched GEMM through cuBLAS, f32 storage.
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b],  op(A) is (M, K), op(B) is (K, N), C (M, N)
// trans_a means A is stored (K, M) row-major; trans_b means B is stored (N, K). A stride of 0
// reuses one matrix for every batch entry. TF32 tensor-core math is opt-in (set_tf32).
#pragma once

namespace fg::kernels {

void set_tf32(bool enabled);

void gemm_f32(bool trans_a, bool trans_b, long long m, long long n, long long k, float alpha,
              const float* a, long long stride_a, const float* b, long long stride_b, float beta,
              float* c, long long stride_c, long long batch);

}  // namespace fg::kernels
