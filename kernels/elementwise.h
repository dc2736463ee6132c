// kernels/elementwise.h: launchers for the elementwise kernels. Arithmetic ops take f32, bf16 or
// f16 storage (`type`): 16-bit values are widened to float, computed in float, and rounded once
// when stored, as PyTorch's kernels do. fill and cast cover every storage dtype. All launch on
// kernels::stream(). Shapes: n is the element count of the output. A broadcast operand holds
// `count` elements and is read as a[(i / inner) % count]: a (C) bias over a (B, T, C) activation
// has inner 1, a per-row (R, 1) statistic over (R, C) has inner C.
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
// out[i] = a[(i / a.inner) % a.count] (op) b[(i / b.inner) % b.count]; a, b and out all of
// `type`. out may alias a or b.
void binary(BinaryOp op, ScalarType type, const void* a, Broadcast a_shape, const void* b,
            Broadcast b_shape, void* out, long long n);
// y[i] = alpha * x[i]
void scale(ScalarType type, const void* x, float alpha, void* y, long long n);
// y[i] = 1 / sqrt(x[i])
void rsqrt(ScalarType type, const void* x, void* y, long long n);
// GELU, the exact erf form y = x * Phi(x), dx = dy * (Phi(x) + x * phi(x)), or with tanh_form
// GPT-2's tanh approximation (core/ops.h, GeluForm::tanh, states it).
void gelu_forward(ScalarType type, const void* x, void* y, long long n, bool tanh_form);
void gelu_backward(ScalarType type, const void* x, const void* dy, void* dx, long long n,
                   bool tanh_form);
// Inverted dropout: out[i] = keep(i) ? in[i] / (1 - p) : 0, keep(i) = philox::keep(seed,
// offset + i, p) (a 24-bit uniform from one Philox word, >= p; the offset plus runtime.h's base
// when one is set). Forward and backward are the same map with the same (seed, offset).
void dropout(ScalarType type, const void* in, void* out, long long n, float p,
             unsigned long long seed, unsigned long long offset);
// Every element set to value (converted to the dtype).
void fill(void* dst, ScalarType type, double value, long long n);
// dst[i] = convert(src[i]); float <-> bf16/f16 rounds to nearest even.
void cast(const void* src, ScalarType from, void* dst, ScalarType to, long long n);
// dst[i] = alpha * float(src[i]) in one pass, src f32, bf16 or f16: the same float product as
// cast then scale (16-bit sums of several ranks' gradients averaged into f32, say).
void widen_scale(const void* src, ScalarType from, float alpha, float* dst, long long n);
// Philox draws (see philox.h): element i uses counter offset + i.
void random_uniform_f32(float* out, long long n, unsigned long long seed,
                        unsigned long long offset);
void random_normal_f32(float* out, long long n, float mean, float stddev, unsigned long long seed,
                       unsigned long long offset);
void random_bernoulli_f32(float* out, long long n, float p, unsigned long long seed,
                          unsigned long long offset);

}  // namespace fg::kernels
