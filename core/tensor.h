// core/tensor.h: Tensor, a cheap handle (one shared_ptr) to TensorImpl: storage, element offset,
// shape, dtype, device, and the autograd fields (requires_grad, grad, grad_fn).
//
// Every tensor in fusegrad is contiguous and row-major: a view (reshape, slicing along the first
// dim) shares storage and differs only in offset and shape. Ops that would need strides
// (transpose, permute) write a new contiguous tensor. This keeps every kernel a plain loop over
// memory, which is what a reader of kernels/ should see.
//
// Differentiable operations are free functions in core/ops.h; this file holds what every tensor
// has: construction, inspection, copies between devices, views and the autograd entry points.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dtype.h"

namespace fg {

using Shape = std::vector<std::int64_t>;

class Node;
struct TensorImpl;

// A block of memory on one device, returned to the allocator when the last view lets go.
struct Storage {
    Storage(Device device, std::size_t bytes);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    void* data = nullptr;
    std::size_t bytes = 0;
    Device device;
};

class Tensor {
public:
    Tensor() = default;
    explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

    // Construction. `empty` leaves memory unset (poisoned when set_poison_new_tensors is on).
    static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
    static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
    static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
    static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                       Device device = Device::cpu);
    // Copies host values (float, double or int32_t) into a new tensor on `device`.
    template <typename T>
    static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                              Device device = Device::cpu);

    // Inspection.
    bool defined() const { return impl_ != nullptr; }
    const Shape& shape() const;
    int dim() const;
    std::int64_t size(int d) const;  // negative d counts from the end
    std::int64_t numel() const;
    DType dtype() const;
    Device device() const;
    bool is_cuda() const { return device() == Device::cuda; }
    std::size_t nbytes() const;
    void* raw_data() const;  // address of element 0
    template <typename T>
    T* data() const;         // typed address; checks that T matches dtype

    // Copies out. to_vector<T> converts from any dtype (bf16/f16 through float) on the host.
    template <typename T>
    std::vector<T> to_vector() const;
    double item() const;  // single-element tensors

    // Conversions (differentiable; same device/dtype returns *this) and copies.
    Tensor to(Device device) const;
    Tensor to(DType dtype) const;
    Tensor clone() const;

    // Views sharing storage (differentiable).
    Tensor reshape(const Shape& shape) const;           // one dim may be -1
    Tensor slice(std::int64_t start, std::int64_t end) const;  // rows [start, end) of dim 0
    Tensor detach() const;  // same storage, cut from the graph
    // Whether this handle is the only way to its memory: no other handle to the same tensor, no
    // other tensor (a view, a detached copy) on its storage. An op on fusegrad's one stream may
    // then overwrite it.
    bool sole_holder() const;

    // Autograd.
    bool requires_grad() const;
    Tensor& set_requires_grad(bool on);  // leaves only
    bool is_leaf() const;
    Tensor grad() const;    // undefined until a backward reaches this leaf
    void zero_grad();       // drops the gradient (the next backward starts a fresh one)
    void set_grad(const Tensor& grad);
    // Makes `storage` (this tensor's shape) where the next backward writes the gradient, without
    // its values counting: the first accumulation into it overwrites them (a copy, not an add),
    // later ones add, as if it had been zero. grad() returns `storage` meanwhile, with whatever
    // it held. Data-parallel training has the backward write into its exchange buckets this way,
    // without zeroing them every step.
    void set_grad_storage(const Tensor& storage);
    // Runs `hook` each time a backward has finished adding into this leaf's gradient: once per
    // backward that reaches the leaf, after all of its contributions (both uses of a tied weight,
    // say), so grad() is then final for that backward. An empty function removes it. Leaves
    // only. What data-parallel training starts its gradient exchange from.
    void set_post_accumulate_grad_hook(std::function<void()> hook);
    const std::shared_ptr<Node>& grad_fn() const;
    // Backpropagates from this tensor. Without `grad`, the tensor must hold one element.
    void backward(const Tensor& grad = Tensor()) const;

    // Printing: values (summarised when large), shape, dtype, device, grad_fn.
    std::string str() const;

    TensorImpl* impl() const { return impl_.get(); }
    const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

private:
    std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
    std::shared_ptr<Storage> storage;
    std::int64_t offset = 0;  // in elements
    Shape shape;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    // autograd
    bool requires_grad = false;
    Tensor grad;
    std::shared_ptr<Node> grad_fn;    // the node that produced this tensor (non-leaves)
    int output_nr = 0;                // which output of grad_fn this is
    std::weak_ptr<Node> accumulator;  // leaves: the node that adds into grad
    std::function<void()> post_accumulate_grad_hook;  // leaves: see Tensor's setter
    bool grad_unwritten = false;  // leaves: grad's values are not a gradient yet (set_grad_storage)
};

std::ostream& operator<<(std::ostream& out, const Tensor& t);
std::string shape_str(const Shape& shape);  // "(2, 3)"
std::int64_t shape_numel(const Shape& shape);

// Debugging aid for tests: fill every new tensor with all-ones bytes (NaN for floats, -1 for
// int32), so an element a kernel forgot to write cannot pass for a result.
void set_poison_new_tensors(bool on);

}  // namespace fg
