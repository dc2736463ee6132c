// kernels/reduce.h: sums of an f32 matrix x (R, C), row-major.
//   row_sum:    out[r] = alpha * sum_c x[r, c]          (sum / mean over the last dim)
//   column_sum: out[c] = sum_r x[r, c]                  (gradient of a broadcast bias)
//   total_sum:  out[0] = alpha * sum_i x[i]             (sum / mean of everything)
// Column and total sums reduce in two kernels through a fixed-size fp32 partial buffer the caller
// provides (size from *_workspace_bytes): the same shape always adds in the same order, so the
// results are deterministic.
#pragma once

#include <cstddef>

namespace fg::kernels {

void row_sum_f32(const float* x, long long rows, long long cols, float alpha, float* out);

std::size_t column_sum_workspace_bytes(long long rows, long long cols);
void column_sum_f32(const float* x, long long rows, long long cols, float* out, void* workspace);

std::size_t total_sum_workspace_bytes(long long n);
void total_sum_f32(const float* x, long long n, float alpha, float* out, void* workspace);

}  // namespace fg::kernels
