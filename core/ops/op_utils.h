// core/ops/op_utils.h: helpers shared by the op files: input checks with uniform messages,
// dtype dispatch for the CPU references (and how they run on 16-bit floats), scratch buffers, and
// the broadcast helpers that the elementwise ops and their backwards share. Internal to core/ops.
#pragma once

#include <type_traits>
#include <utility>

#include "../autograd.h"
#include "../cuda_backend.h"
#include "../error.h"
#include "../ops.h"

namespace fg::ops_detail {

inline void check_defined(const char* op, const Tensor& t, const char* what) {
    FG_CHECK(t.defined(), op, what, " is an undefined tensor");
}

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
    FG_CHECK(a.device() == b.device(), op, "inputs on different devices: ",
             device_name(a.device()), " and ", device_name(b.device()));
}

// 16-bit floats: stored in 16 bits, computed in float on both devices.
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
// What sums and statistics of a dtype's values are kept in: f64 for f64, f32 for the rest.
inline DType accumulate_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }
inline kernels::ScalarType scalar_type(DType t) { return static_cast<kernels::ScalarType>(t); }

// Arithmetic ops: f32, bf16 or f16 on both devices, and f64 on the CPU (gradient checks); an
// undefined t is refused first, as the op's "input".
inline void check_arithmetic_dtype(const char* op, const Tensor& t) {
    check_defined(op, t, "input");
    if (t.is_cuda())
        FG_CHECK(t.dtype() == DType::f32 || is_half(t.dtype()), op,
                 "CUDA tensors must be f32, bf16 or f16, got ", dtype_name(t.dtype()));
    else
        FG_CHECK(is_floating(t.dtype()), op, "CPU tensors must be f32, f64, bf16 or f16, got ",
                 dtype_name(t.dtype()));
}

// The checks of an op on two tensors of one device and one arithmetic dtype (add, matmul, ...).
inline void check_binary(const char* op, const Tensor& a, const Tensor& b) {
    check_defined(op, a, "first input");
    check_defined(op, b, "second input");
    check_same_device(op, a, b);
    FG_CHECK(a.dtype() == b.dtype(), op, "inputs of different dtypes: ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()), " (cast one with .to(dtype))");
    check_arithmetic_dtype(op, a);
}

// Calls f(T{}) with T = float or double, matching the dtype (checked before; the CPU references
// see 16-bit tensors only through widened()).
template <typename F>
void dispatch_float(DType t, F&& f) {
    if (t == DType::f64) f(double{});
    else f(float{});
}

// The CPU references are written for f32 and f64. On a CPU tensor of 16-bit floats they run in
// float, as a kernel does: inputs widened once, outputs computed in f32 and rounded once.
//   widened(x):          x as f32 (a converted copy) when it is 16-bit, else x itself
//   computed_in(y):      where to compute output y: a new f32 tensor when y is 16-bit, else y
//   round_into(work, y): stores work into y, rounding (nothing when work is y)
Tensor widened(const Tensor& x);
Tensor computed_in(const Tensor& y);
void round_into(const Tensor& work, const Tensor& y);
// A CPU reference run so: f(in, out) (f(a, b, out) with two inputs) gets the inputs widened and
// where y is computed, as T pointers (T = float, or double for f64); then y is rounded from it.
template <typename F>
void cpu_reference(const Tensor& x, const Tensor& y, F&& f) {
    Tensor xw = widened(x), work = computed_in(y);
    dispatch_float(xw.dtype(), [&](auto tag) {
        using T = decltype(tag);
        f(static_cast<const T*>(xw.raw_data()), static_cast<T*>(work.raw_data()));
    });
    round_into(work, y);
}
template <typename F>
void cpu_reference(const Tensor& a, const Tensor& b, const Tensor& y, F&& f) {
    Tensor aw = widened(a), bw = widened(b), work = computed_in(y);
    dispatch_float(aw.dtype(), [&](auto tag) {
        using T = decltype(tag);
        f(static_cast<const T*>(aw.raw_data()), static_cast<const T*>(bw.raw_data()),
          static_cast<T*>(work.raw_data()));
    });
    round_into(work, y);
}
// Not recorded: elements [offset, offset + numel(shape)) of x's storage (from x's first) as a
// tensor of `shape`, sharing x's storage (reshape, slice, detach).
Tensor view(const Tensor& x, std::int64_t offset, const Shape& shape);
// bytes from src to dst, both on `device` (a device-to-device copy on CUDA).
void copy_bytes(Device device, void* dst, const void* src, std::size_t bytes);
// Not recorded: a converted copy of x on its device.
Tensor cast_raw(const Tensor& x, DType dtype);
// count floats rounded to nearest even into 16-bit (bf16 or f16 `dtype`) host memory.
void round_raw(const float* src, DType dtype, std::uint16_t* dst, std::int64_t count);

inline Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

// A scratch buffer of at least `bytes` on the device, freed with the returned tensor.
inline Tensor scratch_bytes(Device device, std::size_t bytes) {
    return Tensor::empty({static_cast<std::int64_t>((bytes + 3) / 4)}, DType::f32, device);
}

// How an operand of shape `in` is laid over an output of shape `out` (see kernels/elementwise.h):
// its non-broadcast dims must be one contiguous block of out's dims.
struct BroadcastLayout {
    std::int64_t count = 1;  // elements of the operand
    std::int64_t inner = 1;  // product of out's dims after the block
    std::int64_t outer = 1;  // product of out's dims before the block
};
BroadcastLayout broadcast_layout(const char* op, const Shape& in, const Shape& out);
// Not recorded: the gradient g * gelu'(x) of gelu's input (ops/activation.cpp).
Tensor gelu_backward(const Tensor& x, const Tensor& g, GeluForm form);
// Not recorded: sums g (of shape out) down to shape `to` (the reverse of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& to);
// Not recorded: repeats x (shape `from`, broadcastable) to `shape`.
Tensor broadcast_to(const Tensor& x, const Shape& shape);

// Not recorded: C[i] = op(A[i]) @ op(B[i]) for i < batch on raw row-major buffers (strides in
// elements between batch entries), A and B of ab_dtype, C of c_dtype (ab_dtype, or f32 for 16-bit
// inputs): on CUDA cuBLAS, or cuBLASLt for a single 16-bit product (`options` as matmul's; tensor
// cores for bf16/f16), CBLAS on the CPU
// (16-bit inputs widened to float). Products accumulate in fp32 (f64 for f64). The same
// conventions as kernels/matmul.h with alpha = 1, beta = 0.
void gemm_raw(Device device, DType ab_dtype, DType c_dtype, bool ta, bool tb, std::int64_t m,
              std::int64_t n, std::int64_t k, const void* a, std::int64_t stride_a, const void* b,
              std::int64_t stride_b, void* c, std::int64_t stride_c, std::int64_t batch,
              const MatmulOptions& options);
// The options an op's products run with: autotuning only for a call that records a backward (a
// training step, whose shapes repeat; evaluation and sampling, where T grows at every token, keep
// the heuristic's algorithms, as attention's automatic backend keeps cuDNN to training).
MatmulOptions training_products(MatmulOptions options, const std::vector<Tensor>& inputs);

// Where q, k and v sit in an attention's qkv tensor (and dq, dk, dv in its gradient, laid out the
// same), and how its output (and the output's gradient) is laid out: what cuDNN is told with
// strides (core/ops/attention.cpp). Element offsets and strides; output strides 0: contiguous
// (B, H, T, D).
struct AttentionLayout {
    std::int64_t b, h;
    std::int64_t k_at, v_at;                    // from q's first element (q at 0)
    std::int64_t stride_b, stride_h, stride_t;  // of q, k and v
    Shape out_shape;
    std::int64_t out_stride_b = 0, out_stride_h = 0, out_stride_t = 0;
};
// The packed layouts of causal_self_attention: qkv (B, T, 3, H, D) and out (B, T, H, D).
AttentionLayout packed_attention_layout(std::int64_t b, std::int64_t h, std::int64_t t,
                                        std::int64_t d);

}  // namespace fg::ops_detail
