// kernels/attention.cu: see attention.h for the math. One warp per row of scores; each lane
// walks the row in steps of 32 columns, so loads and stores are coalesced. The forward makes two
// passes over the visible part of the row (max, then sum of exponentials) and one writing pass;
// the later passes hit L1 (a row of T = 256 floats is 1 KiB). Masked columns (j > i) are never
// read: their P, Pd and dS are written as 0.
#include <cfloat>

#include "attention.h"
#include "philox.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void attention_probs_kernel(const float* s, float* pd, float* lse, bool compute_lse,
                                       long long rows, long long t, float scale, float p,
                                       float keep_scale, std::uint64_t seed, std::uint64_t offset) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    float* pr = pd + row * t;
    float row_lse;
    if (compute_lse) {
        float m = -FLT_MAX;
        for (long long j = lane; j < visible; j += 32) m = fmaxf(m, scale * sr[j]);
        m = warp_max(m);
        float total = 0.0f;
        for (long long j = lane; j < visible; j += 32) total += expf(scale * sr[j] - m);
        row_lse = m + logf(warp_sum(total));
        if (lane == 0) lse[row] = row_lse;
    } else {
        row_lse = lse[row];
    }
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    for (long long j = lane; j < t; j += 32) {
        float v = 0.0f;
        if (j < visible) {
            v = expf(scale * sr[j] - row_lse);
            if (p > 0.0f) v = philox::keep(seed, base + j, p) ? v * keep_scale : 0.0f;
        }
        pr[j] = v;
    }
}

__global__ void attention_probs_backward_kernel(float* s, const float* dpd, const float* lse,
                                                long long rows, long long t, float scale, float p,
                                                float keep_scale, std::uint64_t seed,
                                                std::uint64_t offset) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    float* sr = s + row * t;
    const float* gr = dpd + row * t;
    const float row_lse = lse[row];
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    // dot = sum_j dP_j P_j over the visible columns.
    float dot = 0.0f;
    for (long long j = lane; j < visible; j += 32) {
        float dp = gr[j];
        if (p > 0.0f) dp = philox::keep(seed, base + j, p) ? dp * keep_scale : 0.0f;
        dot += dp * expf(scale * sr[j] - row_lse);
    }
    dot = warp_sum(dot);
    for (long long j = lane; j < t; j += 32) {
        float ds = 0.0f;
        if (j < visible) {
            float dp = gr[j];
            if (p > 0.0f) dp = philox::keep(seed, base + j, p) ? dp * keep_scale : 0.0f;
            ds = scale * expf(scale * sr[j] - row_lse) * (dp - dot);
        }
        sr[j] = ds;
    }
}

unsigned blocks_for(long long rows) {
    return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void attention_probs_f32(const float* s, float* pd, float* lse, bool compute_lse, long long rows,
                         long long t, float scale, float p, std::uint64_t seed,
                         std::uint64_t offset) {
    if (rows == 0) return;
    attention_probs_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
        s, pd, lse, compute_lse, rows, t, scale, p, 1.0f / (1.0f - p), seed, offset);
    FG_LAUNCH_CHECK();
}

void attention_probs_backward_f32(float* s_to_ds, const float* dpd, const float* lse,
                                  long long rows, long long t, float scale, float p,
                                  std::uint64_t seed, std::uint64_t offset) {
    if (rows == 0) return;
    attention_probs_backward_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
        s_to_ds, dpd, lse, rows, t, scale, p, 1.0f / (1.0f - p), seed, offset);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
