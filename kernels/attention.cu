// kernels/attention.cu: see attention.h for the math. One warp per row of scores. Rows of up to
// 1024 columns live in registers, four consecutive columns per lane and group (kGroups groups,
// a template parameter): each element is read once, each exponential and each dropout decision
// is computed once per pass, and four decisions share one Philox call. Longer rows take the
// looping kernels (lane l walks columns l, l + 32, ...), which re-read the row from L1/L2 on each
// pass. Masked columns (j > i) are never read: their P, Pd and dS are written as 0.
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

// The register versions of the two kernels above, for t <= 128 * kGroups. Lane l holds kGroups
// groups of four consecutive columns, 128 g + 4 l .. 128 g + 4 l + 3, so each group's four
// dropout decisions come from one Philox call (kernels/philox.h) when its first counter is a
// multiple of 4 (always, when t is).
template <int kGroups>
__global__ void attention_probs_reg_kernel(const float* s, float* pd, float* lse, bool compute_lse,
                                           long long rows, long long t, float scale, float p,
                                           float keep_scale, std::uint64_t seed,
                                           std::uint64_t offset) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    float v[kGroups][4];
    float m = -FLT_MAX;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long j = 128 * g + 4 * lane + e;
            v[g][e] = j < visible ? __fmul_rn(scale, sr[j]) : -FLT_MAX;
            m = fmaxf(m, v[g][e]);
        }
    float row_lse;
    if (compute_lse) {
        m = warp_max(m);
        float total = 0.0f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (128 * g + 4 * lane + e < visible) total += expf(v[g][e] - m);
        row_lse = m + logf(warp_sum(total));
        if (lane == 0) lse[row] = row_lse;
    } else {
        row_lse = lse[row];
    }
    const std::uint64_t base = offset + static_cast<std::uint64_t>(row) * t;
    float* pr = pd + row * t;  // may alias sr: every lane has read its values above
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
        const long long j0 = 128 * g + 4 * lane;
        if (j0 >= t) break;
        bool kept[4] = {true, true, true, true};
        if (p > 0.0f && j0 < visible) philox::keep4(seed, base + j0, p, kept);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long j = j0 + e;
            if (j >= t) break;
            const float prob = j < visible ? expf(v[g][e] - row_lse) : 0.0f;
            pr[j] = kept[e] ? prob * (p > 0.0f ? keep_scale : 1.0f) : 0.0f;
        }
    }
}

template <int kGroups>
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
    float prob[kGroups][4], dp[kGroups][4];
    float dot = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
        const long long j0 = 128 * g + 4 * lane;
        bool kept[4] = {true, true, true, true};
        if (p > 0.0f && j0 < visible) philox::keep4(seed, base + j0, p, kept);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long j = j0 + e;
            prob[g][e] = dp[g][e] = 0.0f;
            if (j < visible) {
                prob[g][e] = expf(__fmul_rn(scale, sr[j]) - row_lse);
                dp[g][e] = kept[e] ? gr[j] * (p > 0.0f ? keep_scale : 1.0f) : 0.0f;
                dot += dp[g][e] * prob[g][e];
            }
        }
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long j = 128 * g + 4 * lane + e;
            if (j < t) sr[j] = j < visible ? scale * prob[g][e] * (dp[g][e] - dot) : 0.0f;
        }
}

unsigned blocks_for(long long rows) {
    return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Calls launch(std::integral_constant<int, G>) with the smallest G in 1, 2, 4, 8 such that
// 128 G >= t; returns false when t > 1024 (the looping kernels' case).
template <typename Launch>
bool with_groups(long long t, Launch&& launch) {
    if (t <= 128) launch(std::integral_constant<int, 1>{});
    else if (t <= 256) launch(std::integral_constant<int, 2>{});
    else if (t <= 512) launch(std::integral_constant<int, 4>{});
    else if (t <= 1024) launch(std::integral_constant<int, 8>{});
    else return false;
    return true;
}

}  // namespace

void attention_probs_f32(const float* s, float* pd, float* lse, bool compute_lse, long long rows,
                         long long t, float scale, float p, std::uint64_t seed,
                         std::uint64_t offset) {
    if (rows == 0) return;
    const float keep_scale = 1.0f / (1.0f - p);
    const bool in_registers = with_groups(t, [&](auto groups) {
        attention_probs_reg_kernel<decltype(groups)::value>
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
    const bool in_registers = with_groups(t, [&](auto groups) {
        attention_probs_backward_reg_kernel<decltype(groups)::value>
            <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                s_to_ds, dpd, lse, rows, t, scale, p, keep_scale, seed, offset);
    });
    if (!in_registers)
        attention_probs_backward_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
            s_to_ds, dpd, lse, rows, t, scale, p, keep_scale, seed, offset);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
