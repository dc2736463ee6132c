// kernels/norm_common.cuh: pieces the norm kernels share (included from .cu files only):
// float <-> storage conversions, 16-byte vector packs, the launch geometry of a row, and sums over
// the threads that hold one row.
//
// Geometry. A row of N values is held by `tpr` threads (a power of two, 4 to 512). Thread `lane`
// of a row holds ITEMS vectors of VEC elements: vector i covers columns (i * tpr + lane) * VEC ..
// + VEC - 1, so neighbouring lanes read neighbouring 16 bytes (coalesced). With tpr <= 32 several
// rows share a block (rows_per_block = threads / tpr); with tpr > 32 a block holds one row.
// Rows too long to hold in registers go through the "looped" kernels, which stream the row in
// chunks and read it again (mostly from L2) instead of spilling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "norm.h"

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

// Host side: how a row of `cols` elements is laid over threads.
struct RowLayout {
    int vec = 1;       // elements per vector (16 bytes when sizes and alignment allow)
    int items = 1;     // vectors per thread
    int tpr = 32;      // threads per row
    int threads = 32;  // threads per block
    bool looped = false;
    int rows_per_block() const { return threads / tpr; }
};

// max_elems: register budget per thread (elements of x held at once).
inline RowLayout row_layout(long long cols, int elem_bytes, bool vector_ok, int max_elems) {
    RowLayout l;
    l.vec = vector_ok ? 16 / elem_bytes : 1;
    long long nvec = (cols + l.vec - 1) / l.vec;
    int max_items = max_elems / l.vec < 1 ? 1 : max_elems / l.vec;
    if (max_items > 8) max_items = 8;
    // Aim for about 4 vectors per thread (enough loads in flight, few idle lanes), then widen the
    // row to more threads while a thread would have to hold more than its register budget.
    long long want = (nvec + 3) / 4;
    int tpr = 4;
    while (tpr < want && tpr < 512) tpr *= 2;
    while ((nvec + tpr - 1) / tpr > max_items && tpr < 512) tpr *= 2;
    long long items = (nvec + tpr - 1) / tpr;
    if (items > max_items) {  // too long for registers even at 512 threads: stream it
        l.looped = true;
        l.tpr = l.threads = 512;
        l.items = 1;
        return l;
    }
    int it = 1;
    while (it < items) it *= 2;
    l.items = it;
    l.tpr = tpr;
    l.threads = tpr >= 128 ? tpr : 128;
    return l;
}

inline bool aligned_to(const void* p, int bytes) {
    return p == nullptr || (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}

inline int elem_bytes(ScalarType t) { return t == ScalarType::f32 ? 4 : 2; }

}  // namespace fg::kernels::norm_detail
