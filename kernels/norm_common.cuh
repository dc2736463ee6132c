// kernels/norm_common.cuh: pieces the norm kernels share (included from .cu files only):
// float <-> storage conversions, 16-byte vector packs, the launch geometry of a row, and sums over
// the threads that hold one row.
//
// Geometry. A row of N values is held by `tpr` threads (a power of two, 4 to 1024). Thread `lane`
// of a row holds ITEMS vectors of VEC elements: vector i covers columns (i * tpr + lane) * VEC ..
// + VEC - 1, so neighbouring lanes read neighbouring 16 bytes (coalesced). With tpr <= 32 several
// rows share a block (rows_per_block = threads / tpr); with tpr > 32 a block holds one row.
// Rows too long to hold in registers go through the "looped" kernels, which stream the row in
// chunks and read it again (mostly from L2) instead of spilling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "norm.h"
#include "runtime.h"

namespace fg::kernels::norm_detail {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
    Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = to_float(pk.v[k]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
    Pack<T, VEC> pk;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pk.v[k] = from_float<T>(in[k]);
    *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// Weight and bias of one vector of columns: w' (1 + w when zero-centred, 1 without a weight), b
// (0 without a bias).
template <typename W, int VEC>
__device__ __forceinline__ void load_affine(const W* weight, const W* bias, bool zc, long long col,
                                            float (&w)[VEC], float (&b)[VEC]) {
    if (weight) {
        load_vec<W, VEC>(weight + col, w);
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] += zc ? 1.0f : 0.0f;
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = 1.0f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) b[k] = 0.0f;
    if (bias) load_vec<W, VEC>(bias + col, b);
}

// Sum of v over the tpr threads of this row group; every one of them gets the result.
// tpr <= 32: shuffles within the lanes of the group. tpr > 32: shuffles, then the group's per-warp
// sums through its own slice of `scratch` (32 floats per block), added in a fixed order.
// Contains barriers when tpr > 32: call from every thread of the block.
__device__ __forceinline__ float group_sum(float v, int tpr, float* scratch) {
    int width = tpr < 32 ? tpr : 32;
    for (int offset = width / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (tpr <= 32) return v;
    int warps = tpr >> 5;
    int first = (threadIdx.x / tpr) * warps;  // this row group's first warp
    __syncthreads();  // scratch may still be read by the previous call
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < warps; ++i) s += scratch[first + i];
    return s;
}

// Two sums at once (one set of shuffles and barriers for both); `scratch` holds 64 floats.
__device__ __forceinline__ float2 group_sum2(float2 v, int tpr, float* scratch) {
    int width = tpr < 32 ? tpr : 32;
    for (int offset = width / 2; offset > 0; offset >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
    }
    if (tpr <= 32) return v;
    int warps = tpr >> 5;
    int first = (threadIdx.x / tpr) * warps;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v.x;
        scratch[32 + (threadIdx.x >> 5)] = v.y;
    }
    __syncthreads();
    float2 s = make_float2(0.0f, 0.0f);
    for (int i = 0; i < warps; ++i) {
        s.x += scratch[first + i];
        s.y += scratch[32 + first + i];
    }
    return s;
}

// Asks the memory system to start bringing bytes [p, p + bytes) into L2 and returns at once: a
// hint that reads nothing into registers and makes no one wait, so a persistent block can have its
// next rows on the way while it works on this one. The range is shrunk inward to 16-byte
// boundaries (the bulk prefetch's unit); its 16 KiB chunks are shared out over the `n` calling
// threads, `i` being this one. Before Hopper: one 128-byte line per prefetch instruction.
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes, int i, int n) {
    std::uintptr_t lo = (reinterpret_cast<std::uintptr_t>(p) + 15) & ~std::uintptr_t(15);
    std::uintptr_t hi = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~std::uintptr_t(15);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr std::uintptr_t kChunk = 16384;
    for (std::uintptr_t c = lo + i * kChunk; c < hi; c += n * kChunk) {
        unsigned size = (unsigned)(hi - c < kChunk ? hi - c : kChunk);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                         __cvta_generic_to_global(reinterpret_cast<const void*>(c))),
                     "r"(size));
    }
#else
    for (std::uintptr_t c = lo + i * 128; c < hi; c += n * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(
            __cvta_generic_to_global(reinterpret_cast<const void*>(c))));
#endif
}

// Prefetches row group `rg` (rows rg * rpb .. rg * rpb + rpb - 1, clipped to `rows`) of a
// rows x cols tensor into L2, shared over the block's threads. Nothing when `t` is null or the
// group lies past the end.
template <typename T>
__device__ __forceinline__ void prefetch_row_group(const T* t, long long rg, int rpb,
                                                   long long rows, long long cols) {
    const long long first = rg * rpb;
    if (t == nullptr || first >= rows) return;
    const long long count = (rows - first < rpb ? rows - first : rpb);
    prefetch_l2(t + first * cols, count * cols * (long long)sizeof(T), threadIdx.x, blockDim.x);
}

// Staging row groups in shared memory (Hopper, sm_90, and later). A persistent block keeps up to
// kMaxStages row groups on their way at once: one thread asks the copy engine (TMA) for a group's
// bytes with cp.async.bulk, one instruction per tensor, and records how many bytes to expect on
// that stage's mbarrier; the other threads issue nothing. They wait on the barrier's phase, work
// from shared memory, and once all of them are done the stage is refilled with a later group.
// Memory is kept busy by the copy engine while the threads reduce and compute, which a block
// holding its rows in registers cannot do (its loads stop at its first row sum).
// Phases: a stage's barrier completes once per fill; the k-th fill of a stage is waited on with
// parity k & 1. FG_NORM_STAGED marks the device passes that have these instructions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FG_NORM_STAGED 1
#endif
constexpr int kMaxStages = 4;

#ifdef FG_NORM_STAGED
// Thread 0 only: barriers with one arrival per phase (the thread that issues the copies), made
// visible to the copy engine before any copy signals them. Follow with __syncthreads().
__device__ __forceinline__ void stage_barriers_init(std::uint64_t* bars, int n) {
    for (int i = 0; i < n; ++i) cuda::ptx::mbarrier_init(&bars[i], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// Thread 0 only: this stage's next phase completes once `bytes` have landed.
__device__ __forceinline__ void stage_expect(std::uint64_t* bar, unsigned bytes) {
    (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                               cuda::ptx::space_shared, bar, bytes);
}

// Thread 0 only: copy `bytes` (a multiple of 16, both ends 16-byte aligned) global -> shared;
// the copy engine counts them off on `bar`.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, unsigned bytes,
                                           std::uint64_t* bar) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
}

// Every thread: returns once the phase with this parity has completed (its bytes are visible).
__device__ __forceinline__ void stage_wait(std::uint64_t* bar, unsigned parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}
#endif

// Host side: how a row of `cols` elements is laid over threads.
struct RowLayout {
    int vec = 1;       // elements per vector (16 bytes when sizes and alignment allow)
    int items = 1;     // vectors per thread
    int tpr = 32;      // threads per row
    int threads = 32;  // threads per block
    bool looped = false;
    int rows_per_block() const { return threads / tpr; }
};

// max_elems: register budget per thread (elements of x held at once). Rows take at most 512
// threads; when 512 threads cannot hold the row, 1024 if that brings a thread's share down to at
// most wide_items vectors and wide_bytes bytes (the kernels instantiated for so small a share are
// built for 1024 threads; 1024-thread blocks measured slower where 512 suffice).
inline RowLayout row_layout(long long cols, int elem_bytes, bool vector_ok, int max_elems,
                            int wide_bytes, int wide_items) {
    RowLayout l;
    l.vec = vector_ok ? 16 / elem_bytes : 1;
    long long nvec = (cols + l.vec - 1) / l.vec;
    int max_items = max_elems / l.vec < 1 ? 1 : max_elems / l.vec;
    if (max_items > 8) max_items = 8;
    auto pow2_items = [&](int tpr) {
        long long items = (nvec + tpr - 1) / tpr;
        int it = 1;
        while (it < items) it *= 2;
        return it;
    };
    // Aim for about 4 vectors per thread (enough loads in flight, few idle lanes), then widen the
    // row to more threads while a thread would have to hold more than its register budget.
    auto too_long = [&](int tpr) { return (nvec + tpr - 1) / tpr > max_items; };
    long long want = (nvec + 3) / 4;
    int tpr = 4;
    while (tpr < want && tpr < 512) tpr *= 2;
    while (too_long(tpr) && tpr < 512) tpr *= 2;
    const int wide = pow2_items(1024);  // 1024 threads, when 512 are too few and the share fits
    if (too_long(tpr) && !too_long(1024) && wide <= wide_items &&
        wide * l.vec * elem_bytes <= wide_bytes)
        tpr = 1024;
    if (too_long(tpr)) {  // too long for registers: stream it
        l.looped = true;
        l.tpr = l.threads = 512;
        l.items = 1;
        return l;
    }
    const int items = pow2_items(tpr);
    l.items = items;
    l.tpr = tpr;
    l.threads = tpr >= 128 ? tpr : 128;
    return l;
}

// Rows staged in shared memory (see above): threads hold no row, only what they accumulate, so
// a thread can take more of the row. Rows of tpr threads, items vectors each, rows_per_block()
// rows per stage; `streams` tensors per row (x, and dy / dh in the backward).
struct StagedLayout {
    RowLayout rows;
    int stages = 0;              // 0: the row does not fit (use the register kernels)
    std::size_t stage_bytes = 0;
};

inline long long pow2_ceil(long long v) {
    long long p = 1;
    while (p < v) p *= 2;
    return p;
}

// Needs 16-byte vectors (cols * elem_bytes a multiple of 16, pointers aligned). Blocks of up to
// 512 threads; a stage aims at `stage_target` bytes (whole rows), at least two stages must fit in
// `smem_budget`, and a thread holds at most max_elems columns in at most 4 vectors (8 f32
// vectors, 64 sums, spill).
inline StagedLayout staged_layout(long long cols, int elem_bytes, int streams, int max_elems,
                                  std::size_t stage_target, std::size_t smem_budget) {
    StagedLayout s;
    const int vec = 16 / elem_bytes;
    const long long nvec = cols / vec;
    const int max_items = std::max(1, std::min(4, max_elems / vec));
    int tpr = 4;  // the fewest threads that can hold the row...
    while (tpr < 512 && (nvec + tpr - 1) / tpr > max_items) tpr *= 2;
    if ((nvec + tpr - 1) / tpr > max_items) return s;
    // ... then more, while the stage could not hold enough rows to fill 512 threads.
    const std::size_t row_bytes = (std::size_t)cols * elem_bytes * streams;
    long long rows_fit = 1;
    while ((std::size_t)(rows_fit * 2) * row_bytes <= stage_target) rows_fit *= 2;
    long long wide = std::max<long long>(tpr, 512 / rows_fit);
    tpr = (int)std::min<long long>(std::max<long long>(tpr, std::min(wide, pow2_ceil(nvec))), 512);
    const int rpb = (int)std::min<long long>(512 / tpr, rows_fit);
    s.rows.vec = vec;
    s.rows.tpr = tpr;
    s.rows.threads = tpr * rpb;
    s.rows.items = (int)pow2_ceil((nvec + tpr - 1) / tpr);
    s.stage_bytes = (std::size_t)rpb * row_bytes;
    s.stages = (int)std::min<std::size_t>(kMaxStages, smem_budget / s.stage_bytes);
    if (s.stages < 2) s.stages = 0;
    return s;
}

// Calls f(std::integral_constant<int, items>{}) for a layout's items (1, 2, 4 or 8): the kernels
// are templates on it, and each launcher instantiates only the counts it can be given.
template <typename F>
void with_items(int items, F&& f) {
    switch (items) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

// Blocks of a persistent grid: as many as fit on the device at once (at most the tuning's threads
// per SM), never more than there are row groups.
inline unsigned persistent_blocks(const void* kernel, int threads, std::size_t smem,
                                  long long groups) {
    int per_sm = std::min(resident_blocks_per_sm(kernel, threads, smem),
                          std::max(1, norm_tuning().grid_threads_per_sm / threads));
    return (unsigned)std::max(1LL, std::min(groups, (long long)per_sm * device_info().sm_count));
}

inline bool aligned_to(const void* p, int bytes) {
    return p == nullptr || (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}

inline int elem_bytes(ScalarType t) { return t == ScalarType::f32 ? 4 : 2; }

}  // namespace fg::kernels::norm_detail
