// kernels/linear_lt.h: 16-bit products through cuBLASLt, plain or a linear layer's with its bias
// and GELU folded in by cuBLASLt's epilogues, row-major like matmul.h (x is (M, K), the weight
// (N, K), y and dy (M, N)):
//
//   plain:            C (m, n) = op(A) @ op(B) as kernels::gemm with alpha = 1, beta = 0, batch
//                                                     1; C of `type` or f32 (weight gradients)
//   forward:          y = x @ w^T + bias              (EPILOGUE_BIAS: bias added to the fp32
//                                                      accumulator, then rounded once to y)
//   with GELU (GPT-2's tanh form, the only one cuBLASLt has), for an MLP's two layers:
//   forward:          pre = x @ w^T + bias, y = gelu(pre)     (EPILOGUE_GELU_AUX_BIAS: y and pre,
//                                                      both (M, N), from one product)
//   input gradient:   dx = (dy @ w) * gelu'(pre)          (EPILOGUE_DGELU; dy (M, N), w (N, K),
//                                                      pre and dx (M, K): the gradient of the
//                                                      previous layer's pre-activation, for the
//                                                      layer that reads gelu(pre))
//
// x, w, bias, y, dy, pre and dx are of `type`, bf16 or f16. Products accumulate in fp32.
//
// Each function returns false, having done nothing, when cuBLASLt offers no algorithm for the
// call (a shape or alignment it does not take): the caller then computes the same with plain
// cuBLAS products and sums. The sizes must be positive and `type` bf16 or f16 (else an error).
// The first call of a shape asks cuBLASLt's heuristic and keeps the answer: its first algorithm,
// or with `autotune` the fastest of its first eight, timed then on the call's own operands (a
// synchronisation, once a shape; another process may time another one fastest, and round
// differently). cuBLASLt's workspace is one 32 MiB buffer allocated at the first call, outside the
// caching allocator (so that call must not be inside a CUDA graph capture: run a layer once
// before capturing it; a first call inside one takes the heuristic's first algorithm).
#pragma once

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

bool gemm_lt(ScalarType type, bool f32_out, bool trans_a, bool trans_b, long long m, long long n,
             long long k, const void* a, const void* b, void* c, bool autotune);

bool linear_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                       const void* w, const void* bias, void* y, bool autotune);

bool linear_gelu_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                            const void* w, const void* bias, void* y, void* pre, bool autotune);

bool linear_input_grad_dgelu_lt(ScalarType type, long long m, long long n, long long k,
                                const void* dy, const void* w, const void* pre, void* dx,
                                bool autotune);

}  // namespace fg::kernels
