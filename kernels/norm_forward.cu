// kernels/norm_forward.cu: RMSNorm / LayerNorm forward (math in norm.h).
// One pass over x in registers: load the row (adding the residual and writing h if fused), reduce
// the statistics over the row's threads, write y. Rows too long for registers take the looped
// kernel, which reads the row twice (the second time mostly from L2). Each block has the rows of
// a block one wave later brought into L2 while it works.
#include <algorithm>
#include <type_traits>

#include "norm_common.cuh"
#include "runtime.h"

namespace fg::kernels {
namespace {

using namespace norm_detail;

constexpr int kForwardElems = 32;  // the most a tuning may ask: elements of x per thread
NormTuning g_tuning;

template <typename T, typename W>
struct ForwardParams {
    long long rows, cols;
    float eps;
    bool zero_centered;
    const T* x;
    const T* residual;
    T* h_out;
    const W* weight;
    const W* bias;
    T* y;
    float* mean;
    float* rstd;
};

// Loads x (+ residual, rounded to T and stored as h) for one vector, kept in the storage type
// (a bf16 vector of 8 takes 4 registers, not 8): the register kernel converts as it goes.
template <typename T, typename W, int VEC>
__device__ __forceinline__ void load_input_pack(const ForwardParams<T, W>& p, long long offset,
                                                Pack<T, VEC>& v) {
    v = *reinterpret_cast<const Pack<T, VEC>*>(p.x + offset);
    if (p.residual) {
        Pack<T, VEC> r = *reinterpret_cast<const Pack<T, VEC>*>(p.residual + offset);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v.v[k] = from_float<T>(to_float(v.v[k]) + to_float(r.v[k]));
        *reinterpret_cast<Pack<T, VEC>*>(p.h_out + offset) = v;  // normalise exactly this h
    }
}

// The same, converted to fp32 (the looped kernel).
template <typename T, typename W, int VEC>
__device__ __forceinline__ void load_input(const ForwardParams<T, W>& p, long long offset,
                                           float (&v)[VEC]) {
    load_vec<T, VEC>(p.x + offset, v);
    if (p.residual) {
        float r[VEC];
        load_vec<T, VEC>(p.residual + offset, r);
        Pack<T, VEC> h;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            h.v[k] = from_float<T>(v[k] + r[k]);
            v[k] = to_float(h.v[k]);  // normalise exactly the h that is returned
        }
        *reinterpret_cast<Pack<T, VEC>*>(p.h_out + offset) = h;
    }
}

// The row's first value as normalised (h when the residual is fused), for the shifted sums.
template <typename T, typename W>
__device__ __forceinline__ float row_first(const ForwardParams<T, W>& p, long long base) {
    if (!p.residual) return to_float(p.x[base]);
    return to_float(from_float<T>(to_float(p.x[base]) + to_float(p.residual[base])));
}

// The row group `ahead` groups after this block's (0: none) is brought into L2 while the block
// works: blocks start in about index order, so with `ahead` = the blocks resident at once, it is
// the group the block taking this one's place will need.
template <typename T, typename W>
__device__ __forceinline__ void prefetch_forward(const ForwardParams<T, W>& p, long long ahead,
                                                 int rpb) {
    if (ahead == 0) return;
    prefetch_row_group(p.x, blockIdx.x + ahead, rpb, p.rows, p.cols);
    prefetch_row_group(p.residual, blockIdx.x + ahead, rpb, p.rows, p.cols);
}

// Threads holding at most 64 bytes of the row (16 f32 or 32 bf16 values) fit in 64 registers, so
// 1024-thread blocks (rows of up to 16384 f32 / 32768 bf16 values) work; larger holdings use
// 512-thread blocks rather than spill. f32 weights for a bf16 / f16 row count at their size
// (their loads for all the thread's columns are in flight together at the end).
template <typename T, typename W>
constexpr int forward_bytes_per_elem() {
    return sizeof(W) > sizeof(T) ? (int)sizeof(W) : (int)sizeof(T);
}
template <typename T, typename W, int VEC, int ITEMS>
constexpr int forward_max_threads() {
    return ITEMS * VEC * forward_bytes_per_elem<T, W>() <= 64 ? 1024 : 512;
}

template <typename T, typename W, int VEC, int ITEMS, bool LAYER>
__global__ void __launch_bounds__(forward_max_threads<T, W, VEC, ITEMS>(), 1)
    norm_forward_kernel(ForwardParams<T, W> p, int tpr, long long prefetch_ahead) {
    __shared__ float scratch[64];
    const int lane = threadIdx.x % tpr;
    prefetch_forward(p, prefetch_ahead, blockDim.x / tpr);
    const long long row = (long long)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    const bool active = row < p.rows;
    const long long base = row * p.cols;
    Pack<T, VEC> v[ITEMS];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        long long col = ((long long)i * tpr + lane) * VEC;
        if (active && col < p.cols) {
            load_input_pack<T, W, VEC>(p, base + col, v[i]);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[i].v[k] = from_float<T>(0.0f);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float x = to_float(v[i].v[k]);
            s += LAYER ? x : x * x;
        }
    }
    const float inv_n = 1.0f / (float)p.cols;
    float mu = 0.0f, var;
    if (LAYER) {
        // One reduction of shifted sums: with K the row's first value (any value near the mean
        // keeps this exact enough), var = E[(x - K)^2] - E[x - K]^2. Data in registers, K from L1.
        const float shift = active ? row_first(p, base) : 0.0f;
        float a = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            long long col = ((long long)i * tpr + lane) * VEC;
            if (active && col < p.cols) {
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = to_float(v[i].v[k]) - shift;
                    a += d;
                    q += d * d;
                }
            }
        }
        float2 sums = group_sum2(make_float2(a, q), tpr, scratch);
        float da = sums.x * inv_n;
        mu = shift + da;
        var = fmaxf(sums.y * inv_n - da * da, 0.0f);
    } else {
        var = group_sum(s, tpr, scratch) * inv_n;
    }
    const float rstd = 1.0f / sqrtf(var + p.eps);
    if (!active) return;
    if (lane == 0 && p.rstd) {
        p.rstd[row] = rstd;
        if (LAYER) p.mean[row] = mu;
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        long long col = ((long long)i * tpr + lane) * VEC;
        if (col >= p.cols) continue;
        float w[VEC], b[VEC], out[VEC];
        load_affine<W, VEC>(p.weight, p.bias, p.zero_centered, col, w, b);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = (to_float(v[i].v[k]) - mu) * rstd * w[k] + b[k];
        store_vec<T, VEC>(p.y + base + col, out);
    }
}

// Long rows: one block per row, the row streamed in chunks of threads * VEC: one pass for the
// statistics, one to write y (reading x, or h, again: mostly from L2).
template <typename T, typename W, int VEC, bool LAYER>
__global__ void __launch_bounds__(512, 2)
    norm_forward_looped_kernel(ForwardParams<T, W> p, long long prefetch_ahead) {
    __shared__ float scratch[64];
    prefetch_forward(p, prefetch_ahead, 1);
    const long long row = blockIdx.x;
    const long long base = row * p.cols;
    const long long step = (long long)blockDim.x * VEC;
    const T* src = p.residual ? p.h_out : p.x;  // after the first pass, read h back
    const float shift = LAYER ? row_first(p, base) : 0.0f;
    float s = 0.0f, q = 0.0f;  // RMSNorm: s = sum x^2; LayerNorm: s, q = sums of d, d^2, d = x - shift
    for (long long col = (long long)threadIdx.x * VEC; col < p.cols; col += step) {
        float v[VEC];
        load_input<T, W, VEC>(p, base + col, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            float d = v[k] - shift;
            s += LAYER ? d : v[k] * v[k];
            q += d * d;
        }
    }
    const float inv_n = 1.0f / (float)p.cols;
    float mu = 0.0f, var;
    if (LAYER) {  // shifted sums, as in the register kernel: one pass for both statistics
        float2 sums = group_sum2(make_float2(s, q), blockDim.x, scratch);
        float da = sums.x * inv_n;
        mu = shift + da;
        var = fmaxf(sums.y * inv_n - da * da, 0.0f);
    } else {
        var = group_sum(s, blockDim.x, scratch) * inv_n;
    }
    const float rstd = 1.0f / sqrtf(var + p.eps);
    if (threadIdx.x == 0 && p.rstd) {
        p.rstd[row] = rstd;
        if (LAYER) p.mean[row] = mu;
    }
    for (long long col = (long long)threadIdx.x * VEC; col < p.cols; col += step) {
        float v[VEC], w[VEC], b[VEC], out[VEC];
        load_vec<T, VEC>(src + base + col, v);
        load_affine<W, VEC>(p.weight, p.bias, p.zero_centered, col, w, b);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = (v[k] - mu) * rstd * w[k] + b[k];
        store_vec<T, VEC>(p.y + base + col, out);
    }
}

// Waves ahead to prefetch. Measured on an H200 (bench_norm --sweep): one wave ahead helps bf16
// rows held in registers (+1 to +4 points of copy bandwidth at N = 1024 to 16384), costs f32
// rows of 1024 to 8192 values a point or three, and costs the looped kernel up to 7 points.
int forward_prefetch(const RowLayout& l, int elem_bytes, long long cols) {
    if (g_tuning.prefetch_distance != NormTuning::kAuto) return g_tuning.prefetch_distance;
    return !l.looped && (elem_bytes == 2 || cols >= 16384) ? 1 : 0;
}

// One block per row group (blocks come and go; that measured faster here than a persistent
// grid). Each block prefetches the group some waves ahead of its own (forward_prefetch).
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward(const ForwardParams<T, W>& p, const RowLayout& l) {
    const int waves = forward_prefetch(l, (int)sizeof(T), p.cols);
    auto ahead = [&](const void* kernel) {
        if (waves == 0) return 0LL;
        return (long long)waves * resident_blocks_per_sm(kernel, l.threads, 0) *
               device_info().sm_count;
    };
    if (l.looped) {
        auto kernel = norm_forward_looped_kernel<T, W, VEC, LAYER>;
        kernel<<<(unsigned)p.rows, l.threads, 0, stream()>>>(p, ahead((const void*)kernel));
    } else {
        unsigned blocks = (unsigned)((p.rows + l.rows_per_block() - 1) / l.rows_per_block());
        auto launch = [&](auto items_tag) {  // only what row_layout can choose is instantiated
            constexpr int kItems = decltype(items_tag)::value;
            if constexpr (kItems * VEC <= kForwardElems) {
                auto kernel = norm_forward_kernel<T, W, VEC, kItems, LAYER>;
                kernel<<<blocks, l.threads, 0, stream()>>>(p, l.tpr, ahead((const void*)kernel));
            }
        };
        with_items(l.items, launch);
    }
    FG_LAUNCH_CHECK();
}

template <typename T, typename W>
void forward_typed(const NormForwardArgs& a) {
    ForwardParams<T, W> p{a.rows, a.cols, a.eps, a.zero_centered,
                          static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                          static_cast<T*>(a.h_out), static_cast<const W*>(a.weight),
                          static_cast<const W*>(a.bias), static_cast<T*>(a.y), a.mean, a.rstd};
    constexpr int kVec = 16 / sizeof(T);
    bool vector_ok = a.cols % kVec == 0;
    for (const void* ptr : {a.x, a.residual, (const void*)a.h_out, (const void*)a.y})
        vector_ok = vector_ok && aligned_to(ptr, 16);
    for (const void* ptr : {a.weight, a.bias}) vector_ok = vector_ok && aligned_to(ptr, sizeof(W) * kVec);
    RowLayout l = row_layout(a.cols, sizeof(T), vector_ok,
                             std::min(kForwardElems, g_tuning.forward_elems),
                             64 * (int)sizeof(T) / forward_bytes_per_elem<T, W>(),
                             8);  // see forward_max_threads
    bool layer = a.kind == NormKind::layer;
    if (vector_ok) {
        if (layer) launch_forward<T, W, kVec, true>(p, l);
        else launch_forward<T, W, kVec, false>(p, l);
    } else {
        if (layer) launch_forward<T, W, 1, true>(p, l);
        else launch_forward<T, W, 1, false>(p, l);
    }
}

template <typename T>
void forward_weight(const NormForwardArgs& a) {
    if (a.w_type == ScalarType::f32) forward_typed<T, float>(a);
    else forward_typed<T, T>(a);
}

}  // namespace

void set_norm_tuning(const NormTuning& t) { g_tuning = t; }
NormTuning norm_tuning() { return g_tuning; }

void norm_forward(const NormForwardArgs& a) {
    if (a.rows == 0 || a.cols == 0) return;
    switch (a.x_type) {
        case ScalarType::f32: forward_typed<float, float>(a); break;
        case ScalarType::bf16: forward_weight<__nv_bfloat16>(a); break;
        case ScalarType::f16: forward_weight<__half>(a); break;
        default: throw CudaError("[norm] unsupported dtype for the norm kernels");
    }
}

}  // namespace fg::kernels
