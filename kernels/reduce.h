// kernels/reduce.h: sums of a matrix x (R, C), row-major, of f32, bf16 or f16 storage (`type`);
// every sum accumulates in fp32 and is rounded once to `type` when stored in `out` (column_sum
// with f32_out: stored in f32, as a bias gradient is kept).
//   row_sum:    out[r] = alpha * sum_c x[r, c]          (sum / mean over the last dim)
//   column_sum: out[c] = sum_r x[r, c]                  (gradient of a broadcast bias)
//   total_sum:  out[0] = alpha * sum_i x[i]             (sum / mean of everything)
// Column and total sums reduce in two kernels through a fixed-size fp32 partial buffer the caller
// provides (size from *_workspace_bytes): the same shape on the same GPU model always adds in the
// same order, so the results are deterministic.
#pragma once

#include <cstddef>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

void row_sum(ScalarType type, const void* x, long long rows, long long cols, float alpha,
             void* out);

std::size_t column_sum_workspace_bytes(long long rows, long long cols);
void column_sum(ScalarType type, const void* x, long long rows, long long cols, void* out,
                void* workspace, bool f32_out);

std::size_t total_sum_workspace_bytes(long long n);
void total_sum(ScalarType type, const void* x, long long n, float alpha, void* out,
               void* workspace);

}  // namespace fg::kernels
