// kernels/block_reduce.cuh: warp and block reductions by shuffles, used by the row and total sums
// (reduce.cu), softmax and cross-entropy (softmax.cu), the gradient norm (adamw.cu) and the norm
// ladder (norm/reference.cu). The order of additions is fixed by
// the block shape, so results are bitwise reproducible run to run.
#pragma once

#include <cfloat>

namespace fg::kernels {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over all threads of the block; every thread gets the result. `scratch` holds 32 floats.
// Contains __syncthreads(): call from every thread of the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -FLT_MAX;
    return warp_max(v);
}

}  // namespace fg::kernels
