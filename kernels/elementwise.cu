// kernels/elementwise.cu: one thread per element (four per thread through 16-byte float4 loads
// when sizes and alignment allow), grid-strided so a grid of a few blocks per SM covers any n.
#include <cstdint>

#include "device_error.cuh"
#include "elementwise.h"
#include "half.h"
#include "philox.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float apply(BinaryOp op, float a, float b) {
    switch (op) {
        case BinaryOp::add: return a + b;
        case BinaryOp::sub: return a - b;
        default: return a * b;
    }
}

__device__ __forceinline__ float4 apply4(BinaryOp op, float4 a, float4 b) {
    return make_float4(apply(op, a.x, b.x), apply(op, a.y, b.y), apply(op, a.z, b.z),
                       apply(op, a.w, b.w));
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Vector path: no operand repeats along the fastest dim (inner 1), every count a multiple of 4,
// 16-byte aligned pointers; indices in float4 units.
__global__ void binary_vec4_kernel(BinaryOp op, const float4* a, long long na4, const float4* b,
                                   long long nb4, float4* out, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 va = a[na4 == n4 ? i : i % na4];
        float4 vb = b[nb4 == n4 ? i : i % nb4];
        out[i] = apply4(op, va, vb);
    }
}

__device__ __forceinline__ long long broadcast_index(long long i, Broadcast s, long long n) {
    if (s.count == n) return i;
    return (i / s.inner) % s.count;
}

__global__ void binary_kernel(BinaryOp op, const float* a, Broadcast sa, const float* b,
                              Broadcast sb, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = apply(op, a[broadcast_index(i, sa, n)], b[broadcast_index(i, sb, n)]);
    }
}

__global__ void scale_vec4_kernel(const float4* x, float alpha, float4* y, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(alpha * v.x, alpha * v.y, alpha * v.z, alpha * v.w);
    }
}

__global__ void scale_kernel(const float* x, float alpha, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = alpha * x[i];
    }
}

__global__ void rsqrt_kernel(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = 1.0f / sqrtf(x[i]);  // IEEE sqrt and divide, like the CPU
    }
}

// Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }
__device__ __forceinline__ float gelu_grad(float x) {
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678f));
    float pdf = 0.39894228f * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

__global__ void gelu_forward_kernel(const float4* x, float4* y, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(gelu(v.x), gelu(v.y), gelu(v.z), gelu(v.w));
    }
}

__global__ void gelu_tail_kernel(const float* x, const float* dy, float* out, long long begin,
                                 long long n) {
    // Scalar path for what the float4 loop leaves (and the whole array when misaligned).
    for (long long i = begin + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = dy ? dy[i] * gelu_grad(x[i]) : gelu(x[i]);
    }
}

__global__ void gelu_backward_kernel(const float4* x, const float4* dy, float4* dx, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i], g = dy[i];
        dx[i] = make_float4(g.x * gelu_grad(v.x), g.y * gelu_grad(v.y), g.z * gelu_grad(v.z),
                            g.w * gelu_grad(v.w));
    }
}

// Each thread takes four consecutive elements, so one Philox call decides all four when the
// offset is a multiple of 4 (the ops claim aligned offsets).
__global__ void dropout_kernel(const float* in, float* out, long long n, float p,
                               unsigned long long seed, unsigned long long offset) {
    float scale = 1.0f / (1.0f - p);
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; 4 * g < n;
         g += (long long)gridDim.x * blockDim.x) {
        bool kept[4];
        philox::keep4(seed, offset + 4 * g, p, kept);
        for (int e = 0; e < 4 && 4 * g + e < n; ++e) {
            const long long i = 4 * g + e;
            out[i] = kept[e] ? in[i] * scale : 0.0f;
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

template <typename From, typename To>
__global__ void cast_kernel(const From* src, To* dst, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        dst[i] = Convert<To>::store(Convert<From>::load(src[i]));
    }
}

template <typename From>
void cast_from(const From* src, void* dst, ScalarType to, long long n) {
    int grid = grid_for(n, kThreads);
    switch (to) {
        case ScalarType::f32: cast_kernel<<<grid, kThreads, 0, stream()>>>(src, (float*)dst, n); break;
        case ScalarType::f64: cast_kernel<<<grid, kThreads, 0, stream()>>>(src, (double*)dst, n); break;
        case ScalarType::bf16: cast_kernel<<<grid, kThreads, 0, stream()>>>(src, (Bf16*)dst, n); break;
        case ScalarType::f16: cast_kernel<<<grid, kThreads, 0, stream()>>>(src, (F16*)dst, n); break;
        case ScalarType::i32: cast_kernel<<<grid, kThreads, 0, stream()>>>(src, (int*)dst, n); break;
    }
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

}  // namespace

void binary_f32(BinaryOp op, const float* a, Broadcast sa, const float* b, Broadcast sb,
                float* out, long long n) {
    if (n == 0) return;
    bool flat_a = sa.count == n || sa.inner == 1, flat_b = sb.count == n || sb.inner == 1;
    if (flat_a && flat_b && n % 4 == 0 && sa.count % 4 == 0 && sb.count % 4 == 0 &&
        aligned16(a) && aligned16(b) && aligned16(out)) {
        binary_vec4_kernel<<<grid_for(n / 4, kThreads), kThreads, 0, stream()>>>(
            op, (const float4*)a, sa.count / 4, (const float4*)b, sb.count / 4, (float4*)out,
            n / 4);
    } else {
        binary_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(op, a, sa, b, sb, out, n);
    }
    FG_LAUNCH_CHECK();
}

void scale_f32(const float* x, float alpha, float* y, long long n) {
    if (n == 0) return;
    if (n % 4 == 0 && aligned16(x) && aligned16(y)) {
        scale_vec4_kernel<<<grid_for(n / 4, kThreads), kThreads, 0, stream()>>>(
            (const float4*)x, alpha, (float4*)y, n / 4);
    } else {
        scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, alpha, y, n);
    }
    FG_LAUNCH_CHECK();
}

void rsqrt_f32(const float* x, float* y, long long n) {
    if (n == 0) return;
    rsqrt_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
    FG_LAUNCH_CHECK();
}

void gelu_forward_f32(const float* x, float* y, long long n) {
    if (n == 0) return;
    long long n4 = (aligned16(x) && aligned16(y)) ? n / 4 : 0;
    if (n4 > 0) {
        gelu_forward_kernel<<<grid_for(n4, kThreads), kThreads, 0, stream()>>>(
            (const float4*)x, (float4*)y, n4);
        FG_LAUNCH_CHECK();
    }
    if (4 * n4 < n) {
        gelu_tail_kernel<<<grid_for(n - 4 * n4, kThreads), kThreads, 0, stream()>>>(
            x, nullptr, y, 4 * n4, n);
        FG_LAUNCH_CHECK();
    }
}

void gelu_backward_f32(const float* x, const float* dy, float* dx, long long n) {
    if (n == 0) return;
    long long n4 = (aligned16(x) && aligned16(dy) && aligned16(dx)) ? n / 4 : 0;
    if (n4 > 0) {
        gelu_backward_kernel<<<grid_for(n4, kThreads), kThreads, 0, stream()>>>(
            (const float4*)x, (const float4*)dy, (float4*)dx, n4);
        FG_LAUNCH_CHECK();
    }
    if (4 * n4 < n) {
        gelu_tail_kernel<<<grid_for(n - 4 * n4, kThreads), kThreads, 0, stream()>>>(
            x, dy, dx, 4 * n4, n);
        FG_LAUNCH_CHECK();
    }
}

void dropout_f32(const float* in, float* out, long long n, float p, unsigned long long seed,
                 unsigned long long offset) {
    if (n == 0) return;
    dropout_kernel<<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream()>>>(in, out, n, p, seed,
                                                                            offset);
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
