// kernels/layout.h: permute (generalised transpose) of a contiguous tensor of up to 8 dims.
//   out[i_0, ..., i_{d-1}] = in[j] with j = sum_k i_k * in_stride[k], in_stride[k] being the
//   input's stride along the input dim that output dim k takes
// The caller passes the output shape and, for each output dim, the input stride it walks.
// Works on raw elements of 2, 4 or 8 bytes, so every dtype shares it.
#pragma once

namespace fg::kernels {

constexpr int kMaxDims = 8;

struct PermuteParams {
    int ndim;
    long long out_shape[kMaxDims];
    long long in_stride[kMaxDims];  // input stride (in elements) of output dim k
};

void permute(const void* in, void* out, int element_bytes, long long n, const PermuteParams& p);

}  // namespace fg::kernels
