// core/tensor.cpp: Tensor construction, inspection, host copies and printing (see tensor.h).
// The differentiable parts (to, reshape, slice) forward to core/ops/layout.cpp.
#include "tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "allocator.h"
#include "autograd.h"
#include "cuda_backend.h"
#include "error.h"
#include "kernels/half.h"
#include "ops.h"
#include "ops/op_utils.h"

namespace fg {
namespace {

bool g_poison = false;

// Element i of a host buffer of dtype t, as double.
double load_as_double(const void* base, DType t, std::int64_t i) {
    switch (t) {
        case DType::f32: return static_cast<const float*>(base)[i];
        case DType::f64: return static_cast<const double*>(base)[i];
        case DType::bf16: return half::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
        case DType::f16: return half::f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
        default: return static_cast<const std::int32_t*>(base)[i];
    }
}

}  // namespace

Storage::Storage(Device d, std::size_t n) : bytes(n), device(d) { data = allocate_bytes(d, n); }
Storage::~Storage() { free_bytes(device, data, bytes); }

void set_poison_new_tensors(bool on) { g_poison = on; }

std::int64_t shape_numel(const Shape& shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) {
        FG_CHECK(d >= 0, "tensor", "shape ", shape_str(shape), " has a negative dim");
        FG_CHECK(!__builtin_mul_overflow(n, d, &n), "tensor", "shape ", shape_str(shape),
                 " has more elements than a 64-bit count holds");
    }
    return n;
}

std::string shape_str(const Shape& shape) {
    std::ostringstream out;
    out << "(";
    for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
    out << ")";
    return out.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
    for (std::int64_t d : shape)
        FG_CHECK(d >= 0, "empty", "negative dimension in shape ", shape_str(shape));
    FG_CHECK(!(device == Device::cuda && dtype == DType::f64), "empty",
             "f64 tensors live on the CPU only (gradient checks); use f32 on cuda");
    if (device == Device::cuda) cuda_backend("empty");  // clear error before allocating
    auto impl = std::make_shared<TensorImpl>();
    std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    impl->storage = std::make_shared<Storage>(device, bytes);
    impl->shape = shape;
    impl->dtype = dtype;
    impl->device = device;
    if (g_poison && bytes > 0) {
        if (device == Device::cpu) std::memset(impl->storage->data, 0xff, bytes);
        else cuda_backend("empty").memset(impl->storage->data, 0xff, bytes);
    }
    return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
    Tensor t = empty(shape, dtype, device);
    const std::int64_t n = t.numel();
    void* p = t.raw_data();
    const float f = static_cast<float>(value);  // what 16-bit values are rounded from
    if (device == Device::cuda)
        cuda_backend("full").fill(p, ops_detail::scalar_type(dtype), value, n);
    else if (dtype == DType::f32) std::fill_n(static_cast<float*>(p), n, f);
    else if (dtype == DType::f64) std::fill_n(static_cast<double*>(p), n, value);
    else if (dtype == DType::bf16)
        std::fill_n(static_cast<std::uint16_t*>(p), n, half::float_to_bf16(f));
    else if (dtype == DType::f16)
        std::fill_n(static_cast<std::uint16_t*>(p), n, half::float_to_f16(f));
    else std::fill_n(static_cast<std::int32_t*>(p), n, static_cast<std::int32_t>(value));
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
    Tensor t = empty(shape, dtype, device);
    if (device == Device::cuda) cuda_backend("zeros").memset(t.raw_data(), 0, t.nbytes());
    else if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
    return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
    return full(shape, 1.0, dtype, device);
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
    FG_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector",
             "shape ", shape_str(shape), " holds ", shape_numel(shape), " elements, got ",
             values.size(), " values");
    Tensor t = empty(shape, DTypeOf<T>::value, device);
    if (device == Device::cuda)
        cuda_backend("from_vector").copy_host_to_device(t.raw_data(), values.data(), t.nbytes());
    else if (!values.empty())
        std::memcpy(t.raw_data(), values.data(), t.nbytes());
    return t;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector<std::int32_t>(const std::vector<std::int32_t>&, const Shape&,
                                                  Device);

const Shape& Tensor::shape() const {
    FG_ASSERT(impl_, "shape() of an undefined tensor");
    return impl_->shape;
}
int Tensor::dim() const { return static_cast<int>(shape().size()); }
std::int64_t Tensor::size(int d) const {
    int n = dim();
    int i = d < 0 ? d + n : d;
    FG_CHECK(i >= 0 && i < n, "size", "dimension ", d, " out of range for shape ",
             shape_str(shape()));
    return impl_->shape[i];
}
std::int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const {
    FG_ASSERT(impl_, "dtype() of an undefined tensor");
    return impl_->dtype;
}
Device Tensor::device() const {
    FG_ASSERT(impl_, "device() of an undefined tensor");
    return impl_->device;
}
std::size_t Tensor::nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
void* Tensor::raw_data() const {
    FG_ASSERT(impl_, "data of an undefined tensor");
    return static_cast<char*>(impl_->storage->data) + impl_->offset * dtype_size(impl_->dtype);
}

template <typename T>
T* Tensor::data() const {
    FG_CHECK(dtype() == DTypeOf<T>::value, "data", "tensor holds ", dtype_name(dtype()),
             ", asked for ", dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template std::int32_t* Tensor::data<std::int32_t>() const;

template <typename T>
std::vector<T> Tensor::to_vector() const {
    std::int64_t n = numel();
    std::vector<unsigned char> bytes(nbytes());
    if (is_cuda())
        cuda_backend("to_vector").copy_device_to_host(bytes.data(), raw_data(), bytes.size());
    else if (!bytes.empty())
        std::memcpy(bytes.data(), raw_data(), bytes.size());
    std::vector<T> out(static_cast<std::size_t>(n));
    if (dtype() == DTypeOf<T>::value) {
        if (n > 0) std::memcpy(out.data(), bytes.data(), bytes.size());
    } else {
        for (std::int64_t i = 0; i < n; ++i)
            out[i] = static_cast<T>(load_as_double(bytes.data(), dtype(), i));
    }
    return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;

double Tensor::item() const {
    FG_CHECK(numel() == 1, "item", "needs a tensor with one element, got shape ",
             shape_str(shape()));
    return to_vector<double>()[0];
}

Tensor Tensor::to(Device d) const { return to_device(*this, d); }
Tensor Tensor::to(DType t) const { return cast(*this, t); }

Tensor Tensor::clone() const {
    Tensor out = empty(shape(), dtype(), device());
    ops_detail::copy_bytes(device(), out.raw_data(), raw_data(), nbytes());
    return out;
}

Tensor Tensor::reshape(const Shape& s) const { return fg::reshape(*this, s); }
Tensor Tensor::slice(std::int64_t start, std::int64_t end) const {
    return fg::slice(*this, start, end);
}

Tensor Tensor::detach() const { return ops_detail::view(*this, 0, shape()); }

bool Tensor::sole_holder() const {
    return impl_ && impl_.use_count() == 1 && impl_->storage.use_count() == 1;
}

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
bool Tensor::is_leaf() const { return !impl_->grad_fn; }

Tensor& Tensor::set_requires_grad(bool on) {
    FG_CHECK(is_leaf(), "requires_grad", "only leaf tensors can change requires_grad; this one "
             "was produced by '", impl_->grad_fn->name(), "' (use detach() first)");
    FG_CHECK(!on || is_floating(dtype()), "requires_grad", "only floating tensors can require "
             "grad, got ", dtype_name(dtype()));
    impl_->requires_grad = on;
    return *this;
}

Tensor Tensor::grad() const { return impl_->grad; }
void Tensor::zero_grad() {
    impl_->grad = Tensor();
    impl_->grad_unwritten = false;
}
void Tensor::set_post_accumulate_grad_hook(std::function<void()> hook) {
    FG_CHECK(is_leaf(), "set_post_accumulate_grad_hook", "the tensor of shape ", shape_str(shape()),
             " is not a leaf (it was made by ", grad_fn()->name(), "): only leaves accumulate");
    impl_->post_accumulate_grad_hook = std::move(hook);
}
void Tensor::set_grad(const Tensor& g) {
    FG_CHECK(!g.defined() || g.shape() == shape(), "set_grad", "gradient has shape ",
             shape_str(g.shape()), ", tensor has shape ", shape_str(shape()));
    impl_->grad = g;
    impl_->grad_unwritten = false;
}
void Tensor::set_grad_storage(const Tensor& storage) {
    FG_CHECK(storage.defined() && storage.shape() == shape() && storage.dtype() == dtype() &&
                 storage.device() == device(),
             "set_grad_storage", "the storage must match the tensor: ",
             storage.defined() ? shape_str(storage.shape()) + " " + dtype_name(storage.dtype()) +
                                     " on " + device_name(storage.device())
                               : std::string("undefined"),
             " for ", shape_str(shape()), " ", dtype_name(dtype()), " on ", device_name(device()));
    impl_->grad = storage;
    impl_->grad_unwritten = true;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const { return impl_->grad_fn; }

void Tensor::backward(const Tensor& grad) const { run_backward(*this, grad); }

namespace {

void print_values(std::ostream& out, const std::vector<double>& v, const Shape& shape,
                  std::size_t dim, std::int64_t base, bool summarise, DType dtype) {
    const std::int64_t edge = 3;
    std::int64_t n = shape[dim];
    std::int64_t stride = 1;
    for (std::size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
    out << "[";
    for (std::int64_t i = 0; i < n; ++i) {
        if (summarise && n > 2 * edge && i == edge) {
            out << "..., ";
            i = n - edge - 1;
            continue;
        }
        if (dim + 1 == shape.size()) {
            double x = v[base + i];
            char buf[32];
            if (dtype == DType::i32) std::snprintf(buf, sizeof buf, "%lld", (long long)x);
            else std::snprintf(buf, sizeof buf, "%.4f", x);
            out << buf;
        } else {
            print_values(out, v, shape, dim + 1, base + i * stride, summarise, dtype);
        }
        if (i + 1 < n) out << (dim + 1 == shape.size() ? ", " : ",\n       ");
    }
    out << "]";
}

}  // namespace

std::string Tensor::str() const {
    if (!defined()) return "tensor(undefined)";
    std::ostringstream out;
    std::vector<double> v = to_vector<double>();
    out << "tensor(";
    if (dim() == 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4f", v[0]);
        out << buf;
    } else {
        print_values(out, v, shape(), 0, 0, numel() > 1000, dtype());
    }
    out << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype())
        << ", device=" << device_name(device());
    if (grad_fn()) out << ", grad_fn=" << grad_fn()->name();
    else if (requires_grad()) out << ", requires_grad";
    out << ")";
    return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << t.str(); }

}  // namespace fg
