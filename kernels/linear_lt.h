// kernels/linear_lt.h: a linear layer's products with their bias folded in, through cuBLASLt's
// epilogues, row-major like matmul.h (x is (M, K), the weight (N, K), y and dy (M, N)):
//
//   forward:          y = x @ w^T + bias              (EPILOGUE_BIAS: bias added to the fp32
//                                                      accumulator, then rounded once to y)
//   weight gradient:  dw = dy^T @ x                   (no epilogue: cuBLASLt's BGRADB, which
//                                                      sums dy's columns for the bias gradient,
//                                                      launches a kernel of its own that was
//                                                      slower than column_sum, reduce.h)
//   with GELU (GPT-2's tanh form, the only one cuBLASLt has), for an MLP's two layers:
//   forward:          pre = x @ w^T + bias, y = gelu(pre)     (EPILOGUE_GELU_AUX_BIAS: y and pre,
//                                                      both (M, N), from one product)
//   input gradient:   dx = (dy @ w) * gelu'(pre)          (EPILOGUE_DGELU; dy (M, N), w (N, K),
//                                                      pre and dx (M, K): the gradient of the
//                                                      previous layer's pre-activation, for the
//                                                      layer that reads gelu(pre))
//
// x, w, bias, y, dy, pre and dx are of `type`, bf16 or f16; dw is f32 (the layer's parameters'
// type, so no rounded 16-bit gradient and no cast back). Products accumulate in fp32.
//
// Each function returns false, having done nothing, when cuBLASLt offers no algorithm for the
// call (a shape or alignment it does not take): the caller then computes the same with plain
// products and sums. The sizes must be positive and `type` bf16 or f16 (else an error). The
// first call of a shape asks cuBLASLt's heuristic and keeps the answer; cuBLASLt's workspace is
// one 32 MiB buffer allocated at the first call, outside the caching allocator (so that call
// must not be inside a CUDA graph capture: run a layer once before capturing it).
#pragma once

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

bool linear_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                       const void* w, const void* bias, void* y);

bool linear_weight_grad_lt(ScalarType type, long long m, long long n, long long k,
                           const void* dy, const void* x, float* dw);

bool linear_gelu_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                            const void* w, const void* bias, void* y, void* pre);

bool linear_input_grad_dgelu_lt(ScalarType type, long long m, long long n, long long k,
                                const void* dy, const void* w, const void* pre, void* dx);

}  // namespace fg::kernels
