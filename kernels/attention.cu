// kernels/attention.cu: see attention.h for the math. One warp per row of scores. Rows of up to
// 1024 columns live in registers, four consecutive columns per lane and group (kGroups groups,
// a template parameter): each element is read once, each exponential and each dropout decision
// is computed once per pass, and four decisions share one Philox call. Longer rows take the
// looping kernels (lane l walks columns l, l + 32, ...), which re-read the row from L1/L2 on each
// pass. Masked columns (j > i) are never read: their P, Pd and dS are written as 0.
// S, dPd and lse are fp32; every kernel is a template over the storage type T of its output (Pd
// or dS: float, __nv_bfloat16 or __half, float_types.cuh), which gets the float result rounded
// once, so the float instantiation stores exactly the value it computes. The output may be S
// itself only when T is float: every element is read and written by one lane, which reads it
// before it writes it (a 16-bit output laid over S would put one row's values on other rows).
#include <cfloat>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention.h"
#include "float_types.cuh"
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

template <typename T>
__global__ void attention_probs_kernel(const float* s, T* pd, float* lse, bool compute_lse,
                                       long long rows, long long t, float scale, float p,
                                       float keep_scale, std::uint64_t seed, std::uint64_t offset,
                                       const unsigned long long* offset_base) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    T* pr = pd + row * t;
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
    const std::uint64_t base =
        offset + (offset_base ? *offset_base : 0) + static_cast<std::uint64_t>(row) * t;
    for (long long j = lane; j < t; j += 32) {
        float v = 0.0f;
        if (j < visible) {
            v = expf(__fmul_rn(scale, sr[j]) - row_lse);
            if (p > 0.0f) v = philox::keep(seed, base + j, p) ? v * keep_scale : 0.0f;
        }
        pr[j] = from_float<T>(v);
    }
}

template <typename T>
__global__ void attention_probs_backward_kernel(const float* s, const float* dpd, const float* lse,
                                                T* ds, long long rows, long long t, float scale,
                                                float p, float keep_scale, std::uint64_t seed,
                                                std::uint64_t offset,
                                       const unsigned long long* offset_base) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    const float* gr = dpd + row * t;
    T* dr = ds + row * t;  // may alias sr (T float): lane l reads sr[j] before it writes dr[j]
    const float row_lse = lse[row];
    const std::uint64_t base =
        offset + (offset_base ? *offset_base : 0) + static_cast<std::uint64_t>(row) * t;
    // dot = sum_j dP_j P_j over the visible columns.
    float dot = 0.0f;
    for (long long j = lane; j < visible; j += 32) {
        float dp = gr[j];
        if (p > 0.0f) dp = philox::keep(seed, base + j, p) ? dp * keep_scale : 0.0f;
        dot += dp * expf(__fmul_rn(scale, sr[j]) - row_lse);
    }
    dot = warp_sum(dot);
    for (long long j = lane; j < t; j += 32) {
        float d = 0.0f;
        if (j < visible) {
            float dp = gr[j];
            if (p > 0.0f) dp = philox::keep(seed, base + j, p) ? dp * keep_scale : 0.0f;
            d = scale * expf(__fmul_rn(scale, sr[j]) - row_lse) * (dp - dot);
        }
        dr[j] = from_float<T>(d);
    }
}

// The register versions of the two kernels above, for t <= 128 * kGroups. Lane l holds kGroups
// groups of four consecutive columns, 128 g + 4 l .. 128 g + 4 l + 3, so each group's four
// dropout decisions come from one Philox call (kernels/philox.h) when its first counter is a
// multiple of 4 (always, when t is).
template <typename T, int kGroups>
__global__ void attention_probs_reg_kernel(const float* s, T* pd, float* lse, bool compute_lse,
                                           long long rows, long long t, float scale, float p,
                                           float keep_scale, std::uint64_t seed,
                                           std::uint64_t offset,
                                       const unsigned long long* offset_base) {
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
    const std::uint64_t base =
        offset + (offset_base ? *offset_base : 0) + static_cast<std::uint64_t>(row) * t;
    T* pr = pd + row * t;  // may alias sr (T float): every lane has read its values above
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
            pr[j] = from_float<T>(kept[e] ? prob * (p > 0.0f ? keep_scale : 1.0f) : 0.0f);
        }
    }
}

template <typename T, int kGroups>
__global__ void attention_probs_backward_reg_kernel(const float* s, const float* dpd,
                                                    const float* lse, T* ds, long long rows,
                                                    long long t, float scale, float p,
                                                    float keep_scale, std::uint64_t seed,
                                                    std::uint64_t offset,
                                       const unsigned long long* offset_base) {
    const long long row = blockIdx.x * (long long)kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const long long visible = row % t + 1;
    const float* sr = s + row * t;
    const float* gr = dpd + row * t;
    const float row_lse = lse[row];
    const std::uint64_t base =
        offset + (offset_base ? *offset_base : 0) + static_cast<std::uint64_t>(row) * t;
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
    // The warp_sum's shuffles wait for every lane: the whole row has been read when the stores
    // below start, so ds may alias s (T float).
    dot = warp_sum(dot);
    T* dr = ds + row * t;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long j = 128 * g + 4 * lane + e;
            if (j < t)
                dr[j] = from_float<T>(j < visible ? scale * prob[g][e] * (dp[g][e] - dot) : 0.0f);
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

// The aliasing rule of attention.h: out (n values of T) may be s (n floats) itself when T is
// float; any other overlap would have stores of one row land on another row not yet read.
template <typename T>
void check_aliasing(const char* what, const float* s, const void* out, long long n) {
    const auto s0 = reinterpret_cast<std::uintptr_t>(s);
    const auto o0 = reinterpret_cast<std::uintptr_t>(out);
    const auto count = static_cast<std::uintptr_t>(n);
    const bool overlap = s0 < o0 + count * sizeof(T) && o0 < s0 + count * sizeof(float);
    if (overlap && !(std::is_same_v<T, float> && s0 == o0))
        throw std::invalid_argument(std::string("internal error: ") + what +
                                    ": the output overlaps s (only s itself, with an f32 output, "
                                    "is allowed)");
}

}  // namespace

void attention_probs(const float* s, ScalarType out_type, void* pd, float* lse, bool compute_lse,
                     long long rows, long long t, float scale, float p, std::uint64_t seed,
                     std::uint64_t offset) {
    with_float_type(out_type, "attention_probs", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0) return;
        check_aliasing<T>("attention_probs", s, pd, rows * t);
        T* out = static_cast<T*>(pd);
        const float keep_scale = 1.0f / (1.0f - p);
        const bool in_registers = with_groups(t, [&](auto groups) {
            attention_probs_reg_kernel<T, decltype(groups)::value>
                <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                    s, out, lse, compute_lse, rows, t, scale, p, keep_scale, seed, offset,
                    philox_offset_base());
        });
        if (!in_registers)
            attention_probs_kernel<T><<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                s, out, lse, compute_lse, rows, t, scale, p, keep_scale, seed, offset,
                    philox_offset_base());
        FG_LAUNCH_CHECK();
    });
}

void attention_probs_backward(const float* s, const float* dpd, const float* lse,
                              ScalarType out_type, void* ds, long long rows, long long t,
                              float scale, float p, std::uint64_t seed, std::uint64_t offset) {
    with_float_type(out_type, "attention_probs_backward", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0) return;
        check_aliasing<T>("attention_probs_backward", s, ds, rows * t);
        T* out = static_cast<T*>(ds);
        const float keep_scale = 1.0f / (1.0f - p);
        const bool in_registers = with_groups(t, [&](auto groups) {
            attention_probs_backward_reg_kernel<T, decltype(groups)::value>
                <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                    s, dpd, lse, out, rows, t, scale, p, keep_scale, seed, offset,
                    philox_offset_base());
        });
        if (!in_registers)
            attention_probs_backward_kernel<T>
                <<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream()>>>(
                    s, dpd, lse, out, rows, t, scale, p, keep_scale, seed, offset,
                    philox_offset_base());
        FG_LAUNCH_CHECK();
    });
}

}  // namespace fg::kernels
