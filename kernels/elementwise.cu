// kernels/elementwise.cu: the kernels behind elementwise.h. The arithmetic ones (binary, scale,
// rsqrt, GELU, dropout) are templates over the storage type T (float, __nv_bfloat16 or __half,
// float_types.cuh): they widen to float, compute in float and round once when they store, so the
// f32 instance is the plain float kernel. A thread takes one 16-byte pack of W elements at a time
// (W = 4 floats or 8 16-bit values) when the pointers are 16-byte aligned, then the elements past
// the last whole pack (all of them when misaligned) one at a time. Every loop is grid-strided, so
// a grid of at most 32 blocks an SM covers any n. fill and cast cover every storage dtype (through
// half.h's integer conversions); the random draws are f32 (philox.h).
#include <cstdint>

#include "device_error.cuh"
#include "elementwise.h"
#include "float_types.cuh"
#include "half.h"
#include "philox.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

constexpr int kThreads = 256;

// Elements of T in one 16-byte pack, the unit of a vector load or store.
template <typename T> constexpr int kWidth = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) Pack {
    T v[kWidth<T>];
};

// Pack `pack` of x (elements pack * W .. pack * W + W - 1), widened to float.
template <typename T>
__device__ __forceinline__ void load_pack(const T* x, long long pack, float (&v)[kWidth<T>]) {
    const Pack<T> p = reinterpret_cast<const Pack<T>*>(x)[pack];
#pragma unroll
    for (int e = 0; e < kWidth<T>; ++e) v[e] = to_float(p.v[e]);
}

// v rounded to T, stored as pack `pack` of y.
template <typename T>
__device__ __forceinline__ void store_pack(T* y, long long pack, const float (&v)[kWidth<T>]) {
    Pack<T> p;
#pragma unroll
    for (int e = 0; e < kWidth<T>; ++e) p.v[e] = from_float<T>(v[e]);
    reinterpret_cast<Pack<T>*>(y)[pack] = p;
}

__device__ __forceinline__ long long thread_index() {
    return blockIdx.x * (long long)blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long thread_count() { return (long long)gridDim.x * blockDim.x; }

// y[i] = f(x[i]) for i < n: packs 0 .. packs - 1 a pack per thread, then the elements from
// packs * W on one per thread. y may be x.
template <typename T, typename F>
__device__ __forceinline__ void map_elements(const T* x, T* y, long long n, long long packs, F f) {
    for (long long i = thread_index(); i < packs; i += thread_count()) {
        float v[kWidth<T>];
        load_pack(x, i, v);
#pragma unroll
        for (int e = 0; e < kWidth<T>; ++e) v[e] = f(v[e]);
        store_pack(y, i, v);
    }
    for (long long i = packs * kWidth<T> + thread_index(); i < n; i += thread_count())
        y[i] = from_float<T>(f(to_float(x[i])));
}

// out[i] = f(x[i], z[i]), in the same order of work as map_elements. out may be x or z.
template <typename T, typename F>
__device__ __forceinline__ void map_pairs(const T* x, const T* z, T* out, long long n,
                                          long long packs, F f) {
    for (long long i = thread_index(); i < packs; i += thread_count()) {
        float vx[kWidth<T>], vz[kWidth<T>];
        load_pack(x, i, vx);
        load_pack(z, i, vz);
#pragma unroll
        for (int e = 0; e < kWidth<T>; ++e) vx[e] = f(vx[e], vz[e]);
        store_pack(out, i, vx);
    }
    for (long long i = packs * kWidth<T> + thread_index(); i < n; i += thread_count())
        out[i] = from_float<T>(f(to_float(x[i]), to_float(z[i])));
}

__device__ __forceinline__ float apply(BinaryOp op, float a, float b) {
    switch (op) {
        case BinaryOp::add: return a + b;
        case BinaryOp::sub: return a - b;
        default: return a * b;
    }
}

// How binary's vector loop reads one operand for a pack of W output elements (see pack_read).
struct PackRead {
    bool splat;       // false: a whole pack of the operand; true: one element for the whole pack
    long long count;  // packs the operand holds (false) or elements it holds (true)
    long long inner;  // true only: output packs per operand element
};

template <typename T>
__device__ __forceinline__ void read_operand(const T* x, PackRead r, long long pack,
                                             float (&v)[kWidth<T>]) {
    if (r.splat) {
        const float s = to_float(x[r.count == 1 ? 0 : pack / r.inner % r.count]);
#pragma unroll
        for (int e = 0; e < kWidth<T>; ++e) v[e] = s;
    } else {
        load_pack(x, pack < r.count ? pack : pack % r.count, v);
    }
}

__device__ __forceinline__ long long broadcast_index(long long i, Broadcast s, long long n) {
    if (s.count == n) return i;
    return (i / s.inner) % s.count;
}

// out = a (op) b: the first `packs` packs through ra / rb, the rest element by element through
// the broadcast shapes. out may be a or b (then that operand is full and read before written).
template <typename T>
__global__ void binary_kernel(BinaryOp op, const T* a, Broadcast sa, PackRead ra, const T* b,
                              Broadcast sb, PackRead rb, T* out, long long n, long long packs) {
    for (long long i = thread_index(); i < packs; i += thread_count()) {
        float va[kWidth<T>], vb[kWidth<T>];
        read_operand(a, ra, i, va);
        read_operand(b, rb, i, vb);
#pragma unroll
        for (int e = 0; e < kWidth<T>; ++e) va[e] = apply(op, va[e], vb[e]);
        store_pack(out, i, va);
    }
    for (long long i = packs * kWidth<T> + thread_index(); i < n; i += thread_count()) {
        const float va = to_float(a[broadcast_index(i, sa, n)]);
        const float vb = to_float(b[broadcast_index(i, sb, n)]);
        out[i] = from_float<T>(apply(op, va, vb));
    }
}

// y = alpha x
template <typename T>
__global__ void scale_kernel(const T* x, float alpha, T* y, long long n, long long packs) {
    map_elements(x, y, n, packs, [alpha](float v) { return alpha * v; });
}

// y = 1 / sqrt(x), IEEE sqrt and divide like the CPU
template <typename T>
__global__ void rsqrt_kernel(const T* x, T* y, long long n, long long packs) {
    map_elements(x, y, n, packs, [](float v) { return 1.0f / sqrtf(v); });
}

// Exact: y = x Phi(x), dy/dx = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)),
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }
__device__ __forceinline__ float gelu_grad(float x) {
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678f));
    float pdf = 0.39894228f * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

// tanh approximation: y = x s, s = (1 + tanh u) / 2, u = sqrt(2 / pi) (x + 0.044715 x^3);
// dy/dx = s + x (1 - tanh^2 u) / 2 * sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float gelu_tanh(float x) {
    float t = tanhf(0.79788456f * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
    float t = tanhf(0.79788456f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * 0.79788456f * (1.0f + 0.134145f * x * x);
}

template <typename T, bool Tanh>
__global__ void gelu_forward_kernel(const T* x, T* y, long long n, long long packs) {
    map_elements(x, y, n, packs, [](float v) { return Tanh ? gelu_tanh(v) : gelu(v); });
}

// dx = dy * dy/dx
template <typename T, bool Tanh>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, long long n, long long packs) {
    map_pairs(x, dy, dx, n, packs,
              [](float v, float g) { return g * (Tanh ? gelu_tanh_grad(v) : gelu_grad(v)); });
}

// out = keep ? in / (1 - p) : 0 (as in * (1 / (1 - p))). One philox::keep4 call decides four
// consecutive elements, so a pack takes W / 4 calls, and the elements after the last pack (all of
// them when misaligned) go four to a thread. A call costs one Philox block when its first counter
// is a multiple of 4: packs and groups start at multiples of 4, and the ops pass aligned offsets
// (and a captured step keeps its base a multiple of 4: runtime.h's philox_offset_base).
template <typename T>
__global__ void dropout_kernel(const T* in, T* out, long long n, long long packs, float p,
                               unsigned long long seed, unsigned long long offset,
                               const unsigned long long* offset_base) {
    static_assert(kWidth<T> % 4 == 0, "a pack holds whole groups of four decisions");
    if (offset_base) offset += *offset_base;
    const float scale = 1.0f / (1.0f - p);
    for (long long i = thread_index(); i < packs; i += thread_count()) {
        float v[kWidth<T>];
        load_pack(in, i, v);
#pragma unroll
        for (int q = 0; q < kWidth<T>; q += 4) {
            bool kept[4];
            philox::keep4(seed, offset + i * kWidth<T> + q, p, kept);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[q + e] = kept[e] ? v[q + e] * scale : 0.0f;
        }
        store_pack(out, i, v);
    }
    for (long long g = packs * (kWidth<T> / 4) + thread_index(); 4 * g < n; g += thread_count()) {
        bool kept[4];
        philox::keep4(seed, offset + 4 * g, p, kept);
        for (int e = 0; e < 4 && 4 * g + e < n; ++e) {
            const long long i = 4 * g + e;
            out[i] = from_float<T>(kept[e] ? to_float(in[i]) * scale : 0.0f);
        }
    }
}

template <typename T>
__global__ void fill_kernel(T* dst, T value, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        dst[i] = value;
    }
}

// Loads and stores through float for the 16-bit types; integers and doubles convert directly.
template <typename T> struct Convert {
    __device__ static double load(T v) { return static_cast<double>(v); }
    __device__ static T store(double v) { return static_cast<T>(v); }
};
template <> struct Convert<float> {
    __device__ static float load(float v) { return v; }
    __device__ static float store(float v) { return v; }
};

struct Bf16 { std::uint16_t bits; };
struct F16 { std::uint16_t bits; };
template <> struct Convert<Bf16> {
    __device__ static float load(Bf16 v) { return half::bf16_to_float(v.bits); }
    __device__ static Bf16 store(float v) { return Bf16{half::float_to_bf16(v)}; }
};
template <> struct Convert<F16> {
    __device__ static float load(F16 v) { return half::f16_to_float(v.bits); }
    __device__ static F16 store(float v) { return F16{half::float_to_f16(v)}; }
};

// Four consecutive values, loaded or stored as one access (8 bytes for 16-bit types, 16 for
// 32-bit ones; f64's 32 bytes take two) where the address is a multiple of the group's size.
template <typename T>
struct alignas(4 * sizeof(T)) Quad {
    T v[4];
};

template <typename T>
bool quad_aligned(const T* p) {
    return reinterpret_cast<std::uintptr_t>(p) % sizeof(Quad<T>) == 0;
}

// dst[i] = src[i] converted. The first `quads` groups of four a thread each, through one load and
// one store (casts move weights and gradients every step: a wide access per thread keeps them at
// the memory's speed), then the remaining n - 4 quads values one at a time. Each value converts
// the same way on either path.
template <typename From, typename To>
__global__ void cast_kernel(const From* src, To* dst, long long n, long long quads) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long i = first; i < quads; i += stride) {
        Quad<From> in = reinterpret_cast<const Quad<From>*>(src)[i];
        Quad<To> out;
#pragma unroll
        for (int k = 0; k < 4; ++k) out.v[k] = Convert<To>::store(Convert<From>::load(in.v[k]));
        reinterpret_cast<Quad<To>*>(dst)[i] = out;
    }
    for (long long i = quads * 4 + first; i < n; i += stride)
        dst[i] = Convert<To>::store(Convert<From>::load(src[i]));
}

template <typename From, typename To>
void launch_cast(const From* src, To* dst, long long n) {
    long long quads = quad_aligned(src) && quad_aligned(dst) ? n / 4 : 0;
    cast_kernel<<<grid_for(quads + (n - quads * 4), kThreads), kThreads, 0, stream()>>>(
        src, dst, n, quads);
}

template <typename From>
void cast_from(const From* src, void* dst, ScalarType to, long long n) {
    switch (to) {
        case ScalarType::f32: launch_cast(src, (float*)dst, n); break;
        case ScalarType::f64: launch_cast(src, (double*)dst, n); break;
        case ScalarType::bf16: launch_cast(src, (Bf16*)dst, n); break;
        case ScalarType::f16: launch_cast(src, (F16*)dst, n); break;
        case ScalarType::i32: launch_cast(src, (int*)dst, n); break;
    }
    FG_LAUNCH_CHECK();
}

// dst = alpha * float(src), four elements a thread where both allow a four-element access
// (16 bytes of f32, 8 of bf16 or f16).
template <typename From>
__global__ void widen_scale_kernel(const From* src, float alpha, float* dst, long long n,
                                   long long quads) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long i = first; i < quads; i += stride) {
        Quad<From> in = reinterpret_cast<const Quad<From>*>(src)[i];
        Quad<float> out;
#pragma unroll
        for (int k = 0; k < 4; ++k) out.v[k] = alpha * Convert<From>::load(in.v[k]);
        reinterpret_cast<Quad<float>*>(dst)[i] = out;
    }
    for (long long i = quads * 4 + first; i < n; i += stride)
        dst[i] = alpha * Convert<From>::load(src[i]);
}

template <typename From>
void launch_widen_scale(const From* src, float alpha, float* dst, long long n) {
    long long quads = quad_aligned(src) && quad_aligned(dst) ? n / 4 : 0;
    widen_scale_kernel<<<grid_for(quads + (n - quads * 4), kThreads), kThreads, 0, stream()>>>(
        src, alpha, dst, n, quads);
    FG_LAUNCH_CHECK();
}

__global__ void uniform_kernel(float* out, long long n, unsigned long long seed,
                               unsigned long long offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = philox::uniform(seed, offset + i);
    }
}

__global__ void normal_kernel(float* out, long long n, float mean, float stddev,
                              unsigned long long seed, unsigned long long offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = philox::normal(seed, offset + i, mean, stddev);
    }
}

__global__ void bernoulli_kernel(float* out, long long n, float p, unsigned long long seed,
                                 unsigned long long offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = philox::uniform(seed, offset + i) < p ? 1.0f : 0.0f;
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Packs the vector loop takes: every whole pack when the pointers are 16-byte aligned, else none.
template <typename T>
long long packs_for(long long n, bool aligned) {
    return aligned ? n / kWidth<T> : 0;
}

// Blocks for `packs` packs plus `rest` work items after them (elements, or dropout's groups of
// four), a thread each.
int grid_for_items(long long packs, long long rest) { return grid_for(packs + rest, kThreads); }

// Whether binary's vector loop can read operand x of shape s, and how (r). Whole packs: x is the
// full array, or repeats along the leading dims (inner 1) with a count of whole packs; these need
// x 16-byte aligned. One element per pack: x is a scalar, or each of its elements covers whole
// packs (inner a multiple of W).
template <typename T>
bool pack_read(const void* x, Broadcast s, long long n, PackRead& r) {
    constexpr long long w = kWidth<T>;
    if (s.count == n || (s.inner == 1 && s.count % w == 0)) {
        r = {false, s.count / w, 1};
        return aligned16(x);
    }
    if (s.count == 1) {
        r = {true, 1, 1};
        return true;
    }
    if (s.inner % w == 0) {
        r = {true, s.count, s.inner / w};
        return true;
    }
    return false;
}

}  // namespace

void binary(BinaryOp op, ScalarType type, const void* a, Broadcast sa, const void* b,
            Broadcast sb, void* out, long long n) {
    if (n == 0) return;
    with_float_type(type, "binary", [&](auto tag) {
        using T = decltype(tag);
        PackRead ra{}, rb{};
        const bool vector =
            aligned16(out) && pack_read<T>(a, sa, n, ra) && pack_read<T>(b, sb, n, rb);
        const long long packs = packs_for<T>(n, vector);
        binary_kernel<T><<<grid_for_items(packs, n - packs * kWidth<T>), kThreads, 0, stream()>>>(
            op, static_cast<const T*>(a), sa, ra, static_cast<const T*>(b), sb, rb,
            static_cast<T*>(out), n, packs);
    });
    FG_LAUNCH_CHECK();
}

void scale(ScalarType type, const void* x, float alpha, void* y, long long n) {
    if (n == 0) return;
    with_float_type(type, "scale", [&](auto tag) {
        using T = decltype(tag);
        const long long packs = packs_for<T>(n, aligned16(x) && aligned16(y));
        scale_kernel<T><<<grid_for_items(packs, n - packs * kWidth<T>), kThreads, 0, stream()>>>(
            static_cast<const T*>(x), alpha, static_cast<T*>(y), n, packs);
    });
    FG_LAUNCH_CHECK();
}

void rsqrt(ScalarType type, const void* x, void* y, long long n) {
    if (n == 0) return;
    with_float_type(type, "rsqrt", [&](auto tag) {
        using T = decltype(tag);
        const long long packs = packs_for<T>(n, aligned16(x) && aligned16(y));
        rsqrt_kernel<T><<<grid_for_items(packs, n - packs * kWidth<T>), kThreads, 0, stream()>>>(
            static_cast<const T*>(x), static_cast<T*>(y), n, packs);
    });
    FG_LAUNCH_CHECK();
}

void gelu_forward(ScalarType type, const void* x, void* y, long long n, bool tanh_form) {
    if (n == 0) return;
    with_float_type(type, "gelu_forward", [&](auto tag) {
        using T = decltype(tag);
        const long long packs = packs_for<T>(n, aligned16(x) && aligned16(y));
        auto kernel = tanh_form ? gelu_forward_kernel<T, true> : gelu_forward_kernel<T, false>;
        kernel<<<grid_for_items(packs, n - packs * kWidth<T>), kThreads, 0, stream()>>>(
            static_cast<const T*>(x), static_cast<T*>(y), n, packs);
    });
    FG_LAUNCH_CHECK();
}

void gelu_backward(ScalarType type, const void* x, const void* dy, void* dx, long long n,
                   bool tanh_form) {
    if (n == 0) return;
    with_float_type(type, "gelu_backward", [&](auto tag) {
        using T = decltype(tag);
        const long long packs = packs_for<T>(n, aligned16(x) && aligned16(dy) && aligned16(dx));
        auto kernel = tanh_form ? gelu_backward_kernel<T, true> : gelu_backward_kernel<T, false>;
        kernel<<<grid_for_items(packs, n - packs * kWidth<T>), kThreads, 0, stream()>>>(
            static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n, packs);
    });
    FG_LAUNCH_CHECK();
}

void dropout(ScalarType type, const void* in, void* out, long long n, float p,
             unsigned long long seed, unsigned long long offset) {
    if (n == 0) return;
    with_float_type(type, "dropout", [&](auto tag) {
        using T = decltype(tag);
        const long long packs = packs_for<T>(n, aligned16(in) && aligned16(out));
        const long long groups_after = (n - packs * kWidth<T> + 3) / 4;
        dropout_kernel<T><<<grid_for_items(packs, groups_after), kThreads, 0, stream()>>>(
            static_cast<const T*>(in), static_cast<T*>(out), n, packs, p, seed, offset,
            philox_offset_base());
    });
    FG_LAUNCH_CHECK();
}

void fill(void* dst, ScalarType type, double value, long long n) {
    if (n == 0) return;
    int grid = grid_for(n, kThreads);
    switch (type) {
        case ScalarType::f32:
            fill_kernel<<<grid, kThreads, 0, stream()>>>((float*)dst, (float)value, n);
            break;
        case ScalarType::f64:
            fill_kernel<<<grid, kThreads, 0, stream()>>>((double*)dst, value, n);
            break;
        case ScalarType::bf16:
            fill_kernel<<<grid, kThreads, 0, stream()>>>((std::uint16_t*)dst,
                                                         half::float_to_bf16((float)value), n);
            break;
        case ScalarType::f16:
            fill_kernel<<<grid, kThreads, 0, stream()>>>((std::uint16_t*)dst,
                                                         half::float_to_f16((float)value), n);
            break;
        case ScalarType::i32:
            fill_kernel<<<grid, kThreads, 0, stream()>>>((int*)dst, (int)value, n);
            break;
    }
    FG_LAUNCH_CHECK();
}

void cast(const void* src, ScalarType from, void* dst, ScalarType to, long long n) {
    if (n == 0) return;
    switch (from) {
        case ScalarType::f32: cast_from((const float*)src, dst, to, n); break;
        case ScalarType::f64: cast_from((const double*)src, dst, to, n); break;
        case ScalarType::bf16: cast_from((const Bf16*)src, dst, to, n); break;
        case ScalarType::f16: cast_from((const F16*)src, dst, to, n); break;
        case ScalarType::i32: cast_from((const int*)src, dst, to, n); break;
    }
}

void widen_scale(const void* src, ScalarType from, float alpha, float* dst, long long n) {
    if (n == 0) return;
    switch (from) {
        case ScalarType::f32: launch_widen_scale((const float*)src, alpha, dst, n); break;
        case ScalarType::bf16: launch_widen_scale((const Bf16*)src, alpha, dst, n); break;
        case ScalarType::f16: launch_widen_scale((const F16*)src, alpha, dst, n); break;
        default:
            throw std::invalid_argument("internal error: widen_scale takes f32, bf16 or f16 "
                                        "sources only");
    }
}

void random_uniform_f32(float* out, long long n, unsigned long long seed,
                        unsigned long long offset) {
    if (n == 0) return;
    uniform_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out, n, seed, offset);
    FG_LAUNCH_CHECK();
}

void random_normal_f32(float* out, long long n, float mean, float stddev, unsigned long long seed,
                       unsigned long long offset) {
    if (n == 0) return;
    normal_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out, n, mean, stddev, seed,
                                                                     offset);
    FG_LAUNCH_CHECK();
}

void random_bernoulli_f32(float* out, long long n, float p, unsigned long long seed,
                          unsigned long long offset) {
    if (n == 0) return;
    bernoulli_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out, n, p, seed, offset);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
