// kernels/elementwise.h: launchers for the elementwise kernels. Arithmetic ops are f32 (the
// training dtype); fill and cast cover every storage dtype. All launch on kernels::stream().
// Shapes: n is the element count of the output. A broadcast operand holds na elements and is read
// as a[(i / a_inner) % na]: a (C) bias over a (B, T, C) activation has inner 1, a per-row (R, 1)
// statistic over (R, C) has inner C.
#pragma once

#include <cstdint>

namespace fg::kernels {

// Storage dtypes as the kernels see them (core maps its DType onto this).
enum class ScalarType : int { f32 = 0, f64 = 1, bf16 = 2, f16 = 3, i32 = 4 };

enum class BinaryOp : int { add, sub, mul };

struct Broadcast {
    long long count;  // elements the operand holds
    long long inner;  // output elements per operand element along the fastest dims
};
// out[i] = a[(i / a.inner) % a.count] (op) b[(i / b.inner) % b.count]. out may alias a or b.
void binary_f32(BinaryOp op, const float* a, Broadcast a_shape, const float* b,
                Broadcast b_shape, float* out, long long n);
// y[i] = alpha * x[i]
void scale_f32(const float* x, float alpha, float* y, long long n);
// y[i] = 1 / sqrt(x[i])
void rsqrt_f32(const float* x, float* y, long long n);
// GELU, exact erf form: y = x * Phi(x), dx = dy * (Phi(x) + x * phi(x)).
void gelu_forward_f32(const float* x, float* y, long long n);
void gelu_backward_f32(const float* x, const float* dy, float* dx, long long n);
// Inverted dropout: out[i] = keep(i) ? in[i] / (1 - p) : 0, keep(i) = philox uniform >= p at
// counter offset + i. Forward and backward are the same map with the same (seed, offset).
void dropout_f32(const float* in, float* out, long long n, float p, unsigned long long seed,
                 unsigned long long offset);
// Every element set to value (converted to the dtype).
void fill(void* dst, ScalarType type, double value, long long n);
// dst[i] = convert(src[i]); float <-> bf16/f16 rounds to nearest even.
void cast(const void* src, ScalarType from, void* dst, ScalarType to, long long n);
// Philox draws (see philox.h): element i uses counter offset + i.
void random_uniform_f32(float* out, long long n, unsigned long long seed,
                        unsigned long long offset);
void random_normal_f32(float* out, long long n, float mean, float stddev, unsigned long long seed,
                       unsigned long long offset);
void random_bernoulli_f32(float* out, long long n, float p, unsigned long long seed,
                          unsigned long long offset);

}  // namespace fg::kernels
