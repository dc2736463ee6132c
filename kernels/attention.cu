// kernels/attention.cu: see attention.h for the math. One warp per row of scores; lane l holds
// columns l, l + 32, l + 64, ..., so loads and stores are coalesced. Rows of up to 1024 columns
// live in registers (kPerLane values per lane, a template parameter): each element is read
// once, and the backward draws each dropout decision and each exponential once. Longer rows
// take the looping kernels, which re-read the row (from L1/L2) on each pass. Masked columns
// (j > i) are never read: their P, Pd and dS are written as 0.
#include <cfloat>
#include <type_traits>

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
        for (long long j = lane; j < visible; j += 32) m = fmaxf(m, __fmul_rn(scale, sr[j]));
        m = warp_max(m);
        float total = 0.0f;
        for (long long j = lane; j < visible; j += 32) total += expf(__fmul_rn(scale, sr[j]) - m);
        row_lse = m + logf(warp_sum(total));
        if (lane == 0) lse[row] = row_lse;
    } else {
        row_lse = lse[row];
    }
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    for (long long j = lane; j < t; j += 32) {
        float v = 0.0f;
        if (j < visible) {
            v = expf(__fmul_rn(scale, sr[j]) - row_lse);
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
        dot += dp * expf(__fmul_rn(scale, sr[j]) - row_lse);
    }
    dot = warp_sum(dot);
    for (long long j = lane; j < t; j += 32) {
        float ds = 0.0f;
        if (j < visible) {
            float dp = gr[j];
            if (p > 0.0f) dp = philox::keep(seed, base + j, p) ? dp * keep_scale : 0.0f;
            ds = scale * expf(__fmul_rn(scale, sr[j]) - row_lse) * (dp - dot);
        }
        sr[j] = ds;
    }
}

// The register versions of the two kernels above, for t <= 32 * kPerLane.
template <int kPerLane>
__global__ void attention_probs_reg_kernel(const float* s, float* pd, float* lse, bool compute_lse,
                                           long long rows, long long t, float scale, float p,
                                           float keep_scale, std::uint64_t seed,
                                           std::uint64_t offset) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    float v[kPerLane];
    float m = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const long long j = lane + 32 * k;
        v[k] = j < visible ? __fmul_rn(scale, sr[j]) : -FLT_MAX;
        m = fmaxf(m, v[k]);
    }
    float row_lse;
    if (compute_lse) {
        m = warp_max(m);
        float total = 0.0f;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k)
            if (lane + 32 * k < visible) total += expf(v[k] - m);
        row_lse = m + logf(warp_sum(total));
        if (lane == 0) lse[row] = row_lse;
    } else {
        row_lse = lse[row];
    }
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    float* pr = pd + row * t;  // may alias sr: every lane has read its values above
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const long long j = lane + 32 * k;
        if (j >= t) break;
        float out = 0.0f;
        if (j < visible) {
            out = expf(v[k] - row_lse);
            if (p > 0.0f) out = philox::keep(seed, base + j, p) ? out * keep_scale : 0.0f;
        }
        pr[j] = out;
    }
}

template <int kPerLane>
__global__ void attention_probs_backward_reg_kernel(float* s, const float* dpd, const float* lse,
                                                    long long rows, long long t, float scale,
                                                    float p, float keep_scale, std::uint64_t seed,
                                                    std::uint64_t offset) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    float* sr = s + row * t;
    const float* gr = dpd + row * t;
    const float row_lse = lse[row];
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    float prob[kPerLane], dp[kPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const long long j = lane + 32 * k;
        prob[k] = dp[k] = 0.0f;
        if (j < visible) {
            prob[k] = expf(__fmul_rn(scale, sr[j]) - row_lse);
            dp[k] = gr[j];
            if (p > 0.0f) dp[k] = philox::keep(seed, base + j, p) ? dp[k] * keep_scale : 0.0f;
            dot += dp[k] * prob[k];
        }
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const long long j = lane + 32 * k;
        if (j >= t) break;
        sr[j] = j < visible ? scale * prob[k] * (dp[k] - dot) : 0.0f;
    }
}

unsigned blocks_for(long long rows) {
    return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Calls launch(std::integral_constant<int, K>) with the smallest K in 1, 2, 4, ..., 32 such that
// 32 K >= t; returns false when t > 1024 (the looping kernels' case).
template <typename Launch>
bool with_per_lane(long long t, Launch&& launch) {
    if (t <= 32) launch(std::integral_constant<int, 1>{});
    else if (t <= 64) launch(std::integral_constant<int, 2>{});
    else if (t <= 128) launch(std::integral_constant<int, 4>{});
    else if (t <= 256) launch(std::integral_constant<int, 8>{});
    else if (t <= 512) launch(std::integral_constant<int, 16>{});
    else if (t <= 1024) launch(std::integral_constant<int, 32>{});
    else return false;
    return true;
}

}  // namespace

void attention_probs_f32(const float* s, float* pd, float* lse, bool compute_lse, long long rows,
                         long long t, float scale, float p, std::uint64_t seed,
                         std::uint64_t offset) {
    if (rows == 0) return;
    const float keep_scale = 1.0f / (1.0f - p);
    const bool in_registers = with_per_lane(t, [&](auto per_lane) {
        attention_probs_reg_kernel<decltype(per_lane)::value>
            <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                s, pd, lse, compute_lse, rows, t, scale, p, keep_scale, seed, offset);
    });
    if (!in_registers)
        attention_probs_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
            s, pd, lse, compute_lse, rows, t, scale, p, keep_scale, seed, offset);
    FG_LAUNCH_CHECK();
}

void attention_probs_backward_f32(float* s_to_ds, const float* dpd, const float* lse,
                                  long long rows, long long t, float scale, float p,
                                  std::uint64_t seed, std::uint64_t offset) {
    if (rows == 0) return;
    const float keep_scale = 1.0f / (1.0f - p);
    const bool in_registers = with_per_lane(t, [&](auto per_lane) {
        attention_probs_backward_reg_kernel<decltype(per_lane)::value>
            <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                s_to_ds, dpd, lse, rows, t, scale, p, keep_scale, seed, offset);
    });
    if (!in_registers)
        attention_probs_backward_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
            s_to_ds, dpd, lse, rows, t, scale, p, keep_scale, seed, offset);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
