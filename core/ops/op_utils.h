// core/ops/op_utils.h: helpers shared by the op files: input checks with uniform messages,
// dtype dispatch for the CPU references, scratch buffers, and the broadcast helpers that the
// elementwise ops and their backwards share. Internal to core/ops.
#pragma once

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

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
    FG_CHECK(a.dtype() == b.dtype(), op, "inputs of different dtypes: ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()), " (cast one with .to(dtype))");
}

// Arithmetic ops: f32 or f64 on the CPU, f32 on CUDA.
inline void check_arithmetic_dtype(const char* op, const Tensor& t) {
    if (t.is_cuda())
        FG_CHECK(t.dtype() == DType::f32, op, "CUDA tensors must be f32, got ",
                 dtype_name(t.dtype()));
    else
        FG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op,
                 "CPU tensors must be f32 or f64, got ", dtype_name(t.dtype()));
}

// Calls f(T{}) with T = float or double, matching the tensor's dtype (checked before).
template <typename F>
void dispatch_float(DType t, F&& f) {
    if (t == DType::f64) f(double{});
    else f(float{});
}

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
// The output shape of broadcasting a with b (NumPy rules, plus the block restriction above).
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Not recorded: sums g (of shape out) down to shape `to` (the reverse of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& to);
// Not recorded: repeats x (shape `from`, broadcastable) to `shape`.
Tensor broadcast_to(const Tensor& x, const Shape& shape);

// Not recorded: C[i] = op(A[i]) @ op(B[i]) for i < batch on raw row-major buffers (strides in
// elements between batch entries): cuBLAS on CUDA (f32, TF32 when allowed), CBLAS on the CPU (f32
// or f64). The same conventions as kernels/matmul.h with alpha = 1, beta = 0.
void gemm_raw(Device device, DType dtype, bool ta, bool tb, std::int64_t m, std::int64_t n,
              std::int64_t k, const void* a, std::int64_t stride_a, const void* b,
              std::int64_t stride_b, void* c, std::int64_t stride_c, std::int64_t batch);

}  // namespace fg::ops_detail
