// kernels/adamw.cu: see adamw.h. Each launch takes up to kMaxTensorsPerLaunch tensors by value
// (a struct of pointers and sizes, well within a kernel's parameter space) and walks them one
// after the other, every block grid-striding over each tensor's elements. The AdamW arithmetic
// is a host reference's with the same factors, written with explicitly rounded operations (no
// FMA contraction) so that both produce the same bits.
#include <algorithm>
#include <cstdint>

#include "block_reduce.cuh"
#include "device_error.cuh"  // grid_for
#include "adamw.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

struct GradList {
    const float* g[kMaxTensorsPerLaunch];
    long long n[kMaxTensorsPerLaunch];
    int count;
};

struct AdamWList {
    AdamWTensor t[kMaxTensorsPerLaunch];
    int count;
};

// partials[blockIdx.x] = this block's share of sum g^2 over the list. A tensor whose start is
// 16-byte aligned (every gradient the allocator hands out) is read four floats a load, its last
// n % 4 one at a time; any other one float at a time.
__global__ void sum_squares_kernel(GradList list, float* partials) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (int t = 0; t < list.count; ++t) {
        const float* g = list.g[t];
        const long long n = list.n[t];
        const long long vectors = (reinterpret_cast<uintptr_t>(g) & 15) == 0 ? n / 4 : 0;
        const float4* g4 = reinterpret_cast<const float4*>(g);
        for (long long i = first; i < vectors; i += stride) {
            float4 v = g4[i];
            acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        for (long long i = vectors * 4 + first; i < n; i += stride) acc += g[i] * g[i];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: norm = sqrt(sum of the partials, in fp64), and the clip factor.
__global__ void finish_norm_kernel(const float* partials, int count, float max_norm, float* norm,
                                   float* coef) {
    __shared__ double scratch[256];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
    scratch[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const double total = sqrt(scratch[0]);
        *norm = (float)total;
        *coef = max_norm > 0.0f ? (float)fmin(1.0, (double)max_norm / (total + 1e-6)) : 1.0f;
    }
}

// The factors come by value (decayed, plain) or, when `current` is set, from the device
// (current[0], current[1]); nothing changes while *skip is set.
__global__ void adamw_kernel(AdamWList list, AdamWStep decayed, AdamWStep plain,
                             const AdamWStep* current, const float* coef, const int* skip) {
    if (skip && *skip) return;
    if (current) {
        decayed = current[0];
        plain = current[1];
    }
    const float scale = coef ? *coef : 1.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int t = 0; t < list.count; ++t) {
        const AdamWTensor& x = list.t[t];
        const AdamWStep& s = x.decay ? decayed : plain;
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < x.n; i += stride) {
            float grad = __fmul_rn(x.g[i], scale);
            float param = __fmul_rn(x.p[i], s.decay);
            float mi = __fadd_rn(x.m[i], __fmul_rn(s.one_minus_beta1, __fsub_rn(grad, x.m[i])));
            float vi = __fadd_rn(__fmul_rn(s.beta2, x.v[i]),
                                 __fmul_rn(__fmul_rn(s.one_minus_beta2, grad), grad));
            float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
            x.p[i] = __fsub_rn(param, __fmul_rn(s.step_size, __fdiv_rn(mi, denom)));
            x.m[i] = mi;
            x.v[i] = vi;
        }
    }
}

// Launches adamw_kernel over `tensors`, kMaxTensorsPerLaunch at a time.
void launch_adamw(const AdamWTensor* tensors, int count, const AdamWStep& decayed,
                  const AdamWStep& plain, const AdamWStep* current, const float* coef,
                  const int* skip) {
    for (int first = 0; first < count; first += kMaxTensorsPerLaunch) {
        AdamWList list{};
        list.count = std::min(kMaxTensorsPerLaunch, count - first);
        long long largest = 0;
        for (int i = 0; i < list.count; ++i) {
            list.t[i] = tensors[first + i];
            largest = std::max(largest, list.t[i].n);
        }
        if (largest == 0) continue;
        adamw_kernel<<<grid_for(largest, 256), 256, 0, stream()>>>(list, decayed, plain, current,
                                                                   coef, skip);
        FG_LAUNCH_CHECK();
    }
}

}  // namespace

void grad_norm_clip(const float* const* grads, const long long* sizes, int count, float* partials,
                    float max_norm, float* norm, float* coef) {
    const int launches = (count + kMaxTensorsPerLaunch - 1) / kMaxTensorsPerLaunch;
    for (int l = 0; l < launches; ++l) {
        GradList list{};
        list.count = std::min(kMaxTensorsPerLaunch, count - l * kMaxTensorsPerLaunch);
        for (int i = 0; i < list.count; ++i) {
            list.g[i] = grads[l * kMaxTensorsPerLaunch + i];
            list.n[i] = sizes[l * kMaxTensorsPerLaunch + i];
        }
        sum_squares_kernel<<<kSumSquaresBlocks, 256, 0, stream()>>>(
            list, partials + (long long)l * kSumSquaresBlocks);
        FG_LAUNCH_CHECK();
    }
    finish_norm_kernel<<<1, 256, 0, stream()>>>(partials, launches * kSumSquaresBlocks, max_norm,
                                                norm, coef);
    FG_LAUNCH_CHECK();
}

void adamw_multi_tensor(const AdamWTensor* tensors, int count, const AdamWStep& decayed,
                        const AdamWStep& plain, const float* coef) {
    launch_adamw(tensors, count, decayed, plain, nullptr, coef, nullptr);
}

void adamw_multi_tensor_on_device(const AdamWTensor* tensors, int count, const AdamWStep* current,
                                  const float* coef, const int* skip) {
    launch_adamw(tensors, count, AdamWStep{}, AdamWStep{}, current, coef, skip);
}

}  // namespace fg::kernels
