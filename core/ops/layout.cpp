// core/ops/layout.cpp: ops that move or reinterpret elements without arithmetic.
//   reshape / slice: views sharing storage; backward reshapes back / writes g into a zero tensor.
//   permute:         a new contiguous tensor; backward is the inverse permutation.
//   cast / to_device: backward casts / moves the gradient back.
// split_heads and merge_heads are the (B, T, H*D) <-> (B, H, T, D) moves of attention.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/half.h"
#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

template <typename T>
void permute_cpu(const T* in, T* out, std::int64_t n, const kernels::PermuteParams& p) {
    // Walks the output row by row (rows of its last dim); an odometer over the leading dims
    // keeps the source offset of the row, so there is no division per element.
    const int last = p.ndim - 1;
    const std::int64_t row = p.out_shape[last], step = p.in_stride[last];
    if (n == 0 || row == 0) return;
    std::int64_t index[kernels::kMaxDims] = {};
    std::int64_t src = 0;
    for (std::int64_t start = 0; start < n; start += row) {
        const T* from = in + src;
        if (step == 1)
            std::copy(from, from + row, out + start);
        else
            for (std::int64_t j = 0; j < row; ++j) out[start + j] = from[j * step];
        for (int k = last - 1; k >= 0; --k) {  // next row: advance the odometer
            src += p.in_stride[k];
            if (++index[k] < p.out_shape[k]) break;
            src -= index[k] * p.in_stride[k];
            index[k] = 0;
        }
    }
}

// Not recorded: the permuted copy.
Tensor permute_raw(const Tensor& x, const std::vector<int>& order) {
    int nd = x.dim();
    std::vector<std::int64_t> in_stride(nd, 1);
    for (int d = nd - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * x.size(d + 1);
    kernels::PermuteParams p{};
    p.ndim = nd;
    Shape out_shape(nd);
    for (int k = 0; k < nd; ++k) {
        out_shape[k] = x.size(order[k]);
        p.out_shape[k] = out_shape[k];
        p.in_stride[k] = in_stride[order[k]];
    }
    Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
    std::int64_t n = x.numel();
    int bytes = static_cast<int>(dtype_size(x.dtype()));
    // On the CPU the elements are moved as unsigned words of their size.
    const auto on_cpu = [&](auto word) {
        using W = decltype(word);
        permute_cpu(static_cast<const W*>(x.raw_data()), static_cast<W*>(out.raw_data()), n, p);
    };
    if (x.is_cuda()) cuda_backend("permute").permute(x.raw_data(), out.raw_data(), bytes, n, p);
    else if (bytes == 2) on_cpu(std::uint16_t{});
    else if (bytes == 4) on_cpu(std::uint32_t{});
    else on_cpu(std::uint64_t{});
    return out;
}

// Not recorded: a copy on another device.
Tensor move_raw(const Tensor& x, Device device) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
    if (device == Device::cuda)
        cuda_backend("to").copy_host_to_device(out.raw_data(), x.raw_data(), x.nbytes());
    else
        cuda_backend("to").copy_device_to_host(out.raw_data(), x.raw_data(), x.nbytes());
    return out;
}

}  // namespace

namespace ops_detail {

Tensor view(const Tensor& x, std::int64_t offset, const Shape& shape) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = x.impl()->storage;
    impl->offset = x.impl()->offset + offset;
    impl->shape = shape;
    impl->dtype = x.dtype();
    impl->device = x.device();
    return Tensor(std::move(impl));
}

void copy_bytes(Device device, void* dst, const void* src, std::size_t bytes) {
    if (device == Device::cuda) cuda_backend("copy").copy_device_to_device(dst, src, bytes);
    else if (bytes) std::memcpy(dst, src, bytes);
}

Tensor cast_raw(const Tensor& x, DType dtype) {
    Tensor out = Tensor::empty(x.shape(), dtype, x.device());
    std::int64_t n = x.numel();
    if (x.is_cuda()) {
        cuda_backend("cast").cast(x.raw_data(), static_cast<kernels::ScalarType>(x.dtype()),
                                  out.raw_data(), static_cast<kernels::ScalarType>(dtype), n);
        return out;
    }
    if (n == 0) return out;  // nothing to convert (and memcpy must not see the empty buffers)
    // On the host: through to_vector's conversions (float for bf16/f16, exact otherwise).
    const auto copy_as = [&](auto type) {
        const std::vector<decltype(type)> v = x.to_vector<decltype(type)>();
        std::memcpy(out.raw_data(), v.data(), out.nbytes());
    };
    if (dtype == DType::f64) copy_as(double{});
    else if (dtype == DType::f32) copy_as(float{});
    else if (dtype == DType::i32) copy_as(std::int32_t{});
    else  // bf16 / f16: rounded from float
        round_raw(x.to_vector<float>().data(), dtype, static_cast<std::uint16_t*>(out.raw_data()),
                  n);
    return out;
}

void round_raw(const float* src, DType dtype, std::uint16_t* dst, std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i)
        dst[i] = dtype == DType::bf16 ? half::float_to_bf16(src[i]) : half::float_to_f16(src[i]);
}

Tensor widened(const Tensor& x) {
    return x.defined() && is_half(x.dtype()) ? cast_raw(x, DType::f32) : x;
}

Tensor computed_in(const Tensor& y) {
    return y.defined() && is_half(y.dtype()) ? Tensor::empty(y.shape(), DType::f32, y.device()) : y;
}

void round_into(const Tensor& work, const Tensor& y) {
    if (!y.defined() || work.impl() == y.impl()) return;
    FG_ASSERT(work.numel() == y.numel() && work.dtype() == DType::f32 && !y.is_cuda(),
              "round_into needs an f32 CPU tensor of y's size");
    round_raw(work.data<float>(), y.dtype(), static_cast<std::uint16_t*>(y.raw_data()), y.numel());
}

}  // namespace ops_detail

Tensor reshape(const Tensor& x, const Shape& shape) {
    check_defined("reshape", x, "input");
    Shape resolved = shape;
    std::int64_t known = 1;
    int infer = -1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            FG_CHECK(infer < 0, "reshape", "only one dimension can be -1 in ", shape_str(shape));
            infer = static_cast<int>(i);
        } else {
            FG_CHECK(shape[i] >= 0, "reshape", "negative dimension in ", shape_str(shape));
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        FG_CHECK(known > 0 && x.numel() % known == 0, "reshape", "cannot infer -1 in ",
                 shape_str(shape), " for ", x.numel(), " elements");
        resolved[infer] = x.numel() / known;
    }
    FG_CHECK(shape_numel(resolved) == x.numel(), "reshape", "cannot view ", shape_str(x.shape()),
             " (", x.numel(), " elements) as ", shape_str(resolved), " (", shape_numel(resolved),
             " elements)");
    Tensor out = view(x, 0, resolved);
    Shape original = x.shape();
    return record("reshape", {x}, out, [original](const Tensor& g) -> std::vector<Tensor> {
        return {g.reshape(original)};
    });
}

Tensor slice(const Tensor& x, std::int64_t start, std::int64_t end) {
    check_defined("slice", x, "input");
    FG_CHECK(x.dim() >= 1, "slice", "cannot slice a scalar");
    std::int64_t rows = x.size(0);
    FG_CHECK(start >= 0 && start <= end && end <= rows, "slice", "rows [", start, ", ", end,
             ") are out of range for dim 0 of size ", rows);
    std::int64_t row_elems = rows ? x.numel() / rows : 0;
    Shape shape = x.shape();
    shape[0] = end - start;
    Tensor out = view(x, start * row_elems, shape);
    const Shape full = x.shape();
    const DType dtype = x.dtype();
    const Device device = x.device();
    const std::size_t offset = start * row_elems * dtype_size(dtype);  // where g's bytes go in dx
    return record("slice", {x}, out, [=](const Tensor& g) -> std::vector<Tensor> {
        Tensor dx = Tensor::zeros(full, dtype, device);
        copy_bytes(device, static_cast<char*>(dx.raw_data()) + offset, g.raw_data(), g.nbytes());
        return {dx};
    });
}

Tensor permute(const Tensor& x, const std::vector<int>& order) {
    check_defined("permute", x, "input");
    int nd = x.dim();
    FG_CHECK(static_cast<int>(order.size()) == nd, "permute", "order has ", order.size(),
             " entries for a tensor with ", nd, " dims");
    FG_CHECK(nd <= kernels::kMaxDims, "permute", "at most ", kernels::kMaxDims, " dims, got ", nd);
    std::vector<int> inverse(nd, -1);
    for (int k = 0; k < nd; ++k) {
        FG_CHECK(order[k] >= 0 && order[k] < nd && inverse[order[k]] < 0, "permute",
                 "order must be a permutation of 0..", nd - 1);
        inverse[order[k]] = k;
    }
    Tensor out = permute_raw(x, order);
    return record("permute", {x}, out, [inverse](const Tensor& g) -> std::vector<Tensor> {
        return {permute_raw(g, inverse)};
    });
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
    check_defined("transpose", x, "input");
    int nd = x.dim();
    if (dim0 < 0) dim0 += nd;
    if (dim1 < 0) dim1 += nd;
    FG_CHECK(dim0 >= 0 && dim0 < nd && dim1 >= 0 && dim1 < nd, "transpose", "dims out of range for ",
             shape_str(x.shape()));
    std::vector<int> order(nd);
    std::iota(order.begin(), order.end(), 0);
    std::swap(order[dim0], order[dim1]);
    return permute(x, order);
}

Tensor cast(const Tensor& x, DType dtype) {
    check_defined("cast", x, "input");
    if (x.dtype() == dtype) return x;
    FG_CHECK(!(x.is_cuda() && dtype == DType::f64), "cast",
             "f64 tensors live on the CPU only; move to cpu first");
    Tensor out = cast_raw(x, dtype);
    DType from = x.dtype();
    if (!is_floating(dtype)) return out;  // integers carry no gradient
    return record("cast", {x}, out, [from](const Tensor& g) -> std::vector<Tensor> {
        return {cast_raw(g, from)};
    });
}

Tensor to_device(const Tensor& x, Device device) {
    check_defined("to", x, "input");
    if (x.device() == device) return x;
    FG_CHECK(!(device == Device::cuda && x.dtype() == DType::f64), "to",
             "f64 tensors live on the CPU only; cast to f32 before moving to cuda");
    Tensor out = move_raw(x, device);
    Device from = x.device();
    return record("to", {x}, out, [from](const Tensor& g) -> std::vector<Tensor> {
        return {move_raw(g, from)};
    });
}

Tensor split_heads(const Tensor& x, std::int64_t heads) {
    FG_CHECK(x.defined() && x.dim() == 3, "split_heads", "expects (B, T, C), got ",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
    std::int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    FG_CHECK(heads > 0 && c % heads == 0, "split_heads", "C = ", c, " is not divisible by ", heads,
             " heads");
    return permute(x.reshape({b, t, heads, c / heads}), {0, 2, 1, 3});  // (B, H, T, D)
}

Tensor merge_heads(const Tensor& x) {
    FG_CHECK(x.defined() && x.dim() == 4, "merge_heads", "expects (B, H, T, D), got ",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
    std::int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
    return permute(x, {0, 2, 1, 3}).reshape({b, t, h * d});  // (B, T, C)
}

}  // namespace fg
