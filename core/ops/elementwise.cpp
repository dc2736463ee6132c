// core/ops/elementwise.cpp: add, sub, mul with broadcasting, scale, and in-place accumulation
// and copy.
//   y = a + b:  da = sum_to(g, a.shape),      db = sum_to(g, b.shape)
//   y = a - b:  da = sum_to(g, a.shape),      db = -sum_to(g, b.shape)
//   y = a * b:  da = sum_to(g * b, a.shape),  db = sum_to(g * a, b.shape)
//   y = alpha x: dx = alpha g
//   y = 1 / sqrt(x): dx = -g y^3 / 2
// Broadcasting: shapes right-aligned, NumPy rules; the smaller operand's non-1 dims must be one
// contiguous block of the output's (bias (C) over (B, T, C); row statistic (R, 1) over (R, C)).
#include <algorithm>
#include <cmath>
#include <functional>

#include "op_utils.h"

namespace fg {
namespace ops_detail {

BroadcastLayout broadcast_layout(const char* op, const Shape& in, const Shape& out) {
    std::size_t n = out.size(), pad = n - in.size();
    auto dim_of = [&](std::size_t i) { return i < pad ? std::int64_t{1} : in[i - pad]; };
    // The block: from the first to the last dim where in matches a non-1 out dim.
    std::size_t first = n, last = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (out[i] != 1 && dim_of(i) == out[i]) {
            first = std::min(first, i);
            last = i;
        }
    }
    BroadcastLayout layout;
    if (first == n) {  // nothing but broadcast dims: a scalar-like operand (count, inner 1)
        layout.outer = shape_numel(out);
        return layout;
    }
    for (std::size_t i = 0; i < n; ++i) {
        bool inside = i >= first && i <= last;
        FG_CHECK(!inside || dim_of(i) == out[i], op, "broadcasting ", shape_str(in), " to ",
                 shape_str(out), " needs its non-1 dims to be one block; dim ", i,
                 " breaks it (make the operand contiguous in that layout first)");
        if (i < first) layout.outer *= out[i];
        else if (i > last) layout.inner *= out[i];
        else layout.count *= out[i];
    }
    return layout;
}

Tensor sum_to(const Tensor& g, const Shape& to) {
    if (g.shape() == to) return g;
    BroadcastLayout l = broadcast_layout("sum_to", to, g.shape());
    // g viewed as (outer, count, inner): sum the inner dim, then the outer one.
    Tensor x = g;
    if (l.inner > 1) x = sum_last(x.reshape({l.outer * l.count, l.inner}));
    x = x.reshape({l.outer, l.count});
    if (l.outer > 1) {
        Tensor out = Tensor::empty({l.count}, x.dtype(), x.device());
        if (x.is_cuda()) {
            CudaBackend& cuda = cuda_backend("sum_to");
            Tensor ws = scratch_bytes(x.device(), cuda.column_sum_workspace_bytes(l.outer, l.count));
            cuda.column_sum(scalar_type(x.dtype()), x.raw_data(), l.outer, l.count,
                            out.raw_data(), ws.raw_data(), false);
        } else {
            cpu_reference(x, out, [&](const auto* src, auto* dst) {
                for (std::int64_t c = 0; c < l.count; ++c) dst[c] = 0;
                for (std::int64_t r = 0; r < l.outer; ++r)
                    for (std::int64_t c = 0; c < l.count; ++c) dst[c] += src[r * l.count + c];
            });
        }
        x = out;
    }
    return x.reshape(to);
}

}  // namespace ops_detail

namespace {

using namespace ops_detail;
using kernels::BinaryOp;

// Element i of out reads a[(i / inner) % count] (a itself when count == n). The loops below walk
// out in runs over which each operand is either contiguous or constant, so the compiler can
// vectorise them; the op is a template parameter for the same reason.
template <typename T, typename Op>
void binary_runs_cpu(Op op, const T* a, BroadcastLayout la, const T* b, BroadcastLayout lb, T* out,
                     std::int64_t n) {
    const bool a_full = la.count == n, b_full = lb.count == n;
    if (a_full && b_full) {
        for (std::int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
        return;
    }
    if (a_full || b_full) {
        // One operand full, the other (x) broadcast: runs of x's inner, or of x's count when
        // its inner is 1 (x repeats along the leading dims, as a bias does).
        const BroadcastLayout& lx = a_full ? lb : la;
        const T* x = a_full ? b : a;
        const T* full = a_full ? a : b;
        auto apply = [&](T f, T v) { return a_full ? op(f, v) : op(v, f); };
        if (lx.inner == 1) {
            for (std::int64_t start = 0; start < n; start += lx.count)
                for (std::int64_t j = 0; j < lx.count; ++j)
                    out[start + j] = apply(full[start + j], x[j]);
        } else {
            for (std::int64_t run = 0, start = 0; start < n; ++run, start += lx.inner) {
                const T v = x[run % lx.count];
                for (std::int64_t j = 0; j < lx.inner; ++j) out[start + j] = apply(full[start + j], v);
            }
        }
        return;
    }
    for (std::int64_t i = 0; i < n; ++i)
        out[i] = op(a[(i / la.inner) % la.count], b[(i / lb.inner) % lb.count]);
}

template <typename T>
void binary_forward_cpu(BinaryOp op, const T* a, BroadcastLayout la, const T* b,
                        BroadcastLayout lb, T* out, std::int64_t n) {
    if (n == 0) return;
    switch (op) {
        case BinaryOp::add: return binary_runs_cpu(std::plus<T>(), a, la, b, lb, out, n);
        case BinaryOp::sub: return binary_runs_cpu(std::minus<T>(), a, la, b, lb, out, n);
        default: return binary_runs_cpu(std::multiplies<T>(), a, la, b, lb, out, n);
    }
}

// out = a (op) b on already-checked inputs, a and b broadcast to out's shape; not recorded.
void binary_into(const char* op_name, BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    BroadcastLayout la = broadcast_layout(op_name, a.shape(), out.shape());
    BroadcastLayout lb = broadcast_layout(op_name, b.shape(), out.shape());
    std::int64_t n = out.numel();
    if (a.is_cuda()) {
        cuda_backend(op_name).binary(op, scalar_type(a.dtype()), a.raw_data(),
                                     {la.count, la.inner}, b.raw_data(), {lb.count, lb.inner},
                                     out.raw_data(), n);
    } else {
        cpu_reference(a, b, out, [&](const auto* pa, const auto* pb, auto* dst) {
            binary_forward_cpu(op, pa, la, pb, lb, dst, n);
        });
    }
}

// The output shape of broadcasting a with b (NumPy rules, plus the block restriction of
// broadcast_layout).
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
    std::size_t n = std::max(a.size(), b.size());
    Shape out(n);
    for (std::size_t i = 0; i < n; ++i) {
        std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
        std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
        FG_CHECK(da == db || da == 1 || db == 1, op, "shapes ", shape_str(a), " and ",
                 shape_str(b), " do not broadcast (dim ", i, ": ", da, " vs ", db, ")");
        out[i] = da == 1 ? db : da;  // a 1 stretches to the other size, even to 0
    }
    broadcast_layout(op, a, out);
    broadcast_layout(op, b, out);
    return out;
}

Tensor binary_raw(const char* op_name, BinaryOp op, const Tensor& a, const Tensor& b) {
    Tensor out = Tensor::empty(broadcast_shapes(op_name, a.shape(), b.shape()), a.dtype(),
                               a.device());
    binary_into(op_name, op, a, b, out);
    return out;
}

}  // namespace

namespace ops_detail {
Tensor broadcast_to(const Tensor& x, const Shape& shape) {
    if (x.shape() == shape) return x;
    Tensor out = Tensor::empty(shape, x.dtype(), x.device());
    binary_into("broadcast_to", BinaryOp::add, x, Tensor::zeros({}, x.dtype(), x.device()), out);
    return out;
}
}  // namespace ops_detail

Tensor add(const Tensor& a, const Tensor& b) {
    check_binary("add", a, b);
    Tensor out = binary_raw("add", BinaryOp::add, a, b);
    Shape sa = a.shape(), sb = b.shape();
    return record("add", {a, b}, out, [sa, sb](const Tensor& g) -> std::vector<Tensor> {
        return {sum_to(g, sa), sum_to(g, sb)};
    });
}

Tensor sub(const Tensor& a, const Tensor& b) {
    check_binary("sub", a, b);
    Tensor out = binary_raw("sub", BinaryOp::sub, a, b);
    Shape sa = a.shape(), sb = b.shape();
    return record("sub", {a, b}, out, [sa, sb](const Tensor& g) -> std::vector<Tensor> {
        return {sum_to(g, sa), scale(sum_to(g, sb), -1.0)};
    });
}

Tensor mul(const Tensor& a, const Tensor& b) {
    check_binary("mul", a, b);
    Tensor out = binary_raw("mul", BinaryOp::mul, a, b);
    Tensor sa = a.detach(), sb = b.detach();
    return record("mul", {a, b}, out, [sa, sb](const Tensor& g) -> std::vector<Tensor> {
        return {sum_to(binary_raw("mul", BinaryOp::mul, g, sb), sa.shape()),
                sum_to(binary_raw("mul", BinaryOp::mul, g, sa), sb.shape())};
    });
}

Tensor scale(const Tensor& x, double alpha) {
    check_arithmetic_dtype("scale", x);
    Tensor out = empty_like(x);
    std::int64_t n = x.numel();
    if (x.is_cuda()) {
        cuda_backend("scale").scale(scalar_type(x.dtype()), x.raw_data(),
                                    static_cast<float>(alpha), out.raw_data(), n);
    } else {
        cpu_reference(x, out, [&](const auto* src, auto* dst) {
            const auto a = static_cast<std::remove_pointer_t<decltype(dst)>>(alpha);
            for (std::int64_t i = 0; i < n; ++i) dst[i] = a * src[i];
        });
    }
    return record("scale", {x}, out, [alpha](const Tensor& g) -> std::vector<Tensor> {
        return {scale(g, alpha)};
    });
}

Tensor rsqrt(const Tensor& x) {
    check_arithmetic_dtype("rsqrt", x);
    Tensor y = empty_like(x);
    std::int64_t n = x.numel();
    if (x.is_cuda()) {
        cuda_backend("rsqrt").rsqrt(scalar_type(x.dtype()), x.raw_data(), y.raw_data(), n);
    } else {
        cpu_reference(x, y, [&](const auto* src, auto* dst) {
            for (std::int64_t i = 0; i < n; ++i) dst[i] = 1 / std::sqrt(src[i]);
        });
    }
    Tensor saved = y.detach();
    return record("rsqrt", {x}, y, [saved](const Tensor& g) -> std::vector<Tensor> {
        Tensor y3 = binary_raw("rsqrt", BinaryOp::mul, binary_raw("rsqrt", BinaryOp::mul, saved, saved), saved);
        return {scale(binary_raw("rsqrt", BinaryOp::mul, g, y3), -0.5)};
    });
}

void add_(Tensor& dst, const Tensor& src) {
    check_binary("add_", dst, src);
    FG_CHECK(dst.shape() == src.shape(), "add_", "shapes differ: ", shape_str(dst.shape()),
             " += ", shape_str(src.shape()));
    binary_into("add_", BinaryOp::add, dst, src, dst);  // element i reads and writes i alone
}

void copy_(Tensor& dst, const Tensor& src) {
    FG_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() &&
                 dst.device() == src.device(),
             "copy_", "the tensors differ: ", shape_str(dst.shape()), " ", dtype_name(dst.dtype()),
             " on ", device_name(dst.device()), " = ", shape_str(src.shape()), " ",
             dtype_name(src.dtype()), " on ", device_name(src.device()));
    if (dst.raw_data() == src.raw_data()) return;
    copy_bytes(dst.device(), dst.raw_data(), src.raw_data(), dst.nbytes());
}

}  // namespace fg
