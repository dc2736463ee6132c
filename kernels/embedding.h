// kernels/embedding.h: embedding lookup, weight (V, C) of f32, bf16 or f16 storage (`type`),
// int32 ids (N).
//   forward:  out[n, c] = weight[ids[n], c]                      (out of `type`)
//   backward: dweight[v, c] = sum over n with ids[n] == v of dout[n, c]
//             (dout and dweight of `type`; the sums accumulate in fp32, rounded once)
// The backward is deterministic: ids are sorted (stable radix sort, CUB) with their positions, and
// each distinct id's rows are added by one block per 128 columns: 8 warps take every 8th row of
// the run, then their 8 partial sums are added in a fixed order. No atomics.
// An id outside [0, V) is reported through the device error word and its output row is NaN.
#pragma once

#include <cstddef>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

void embedding_forward(ScalarType type, const void* weight, const int* ids, long long n,
                       long long dim, long long vocab, void* out);

std::size_t embedding_backward_workspace_bytes(long long n);
void embedding_backward(ScalarType type, const void* dout, const int* ids, long long n,
                        long long dim, long long vocab, void* dweight, void* workspace);

}  // namespace fg::kernels
