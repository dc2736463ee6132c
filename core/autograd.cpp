// core/autograd.cpp: the backward engine, grad mode and leaf accumulation (see autograd.h).
#include "autograd.h"

#include <unordered_map>

#include "error.h"
#include "ops.h"

namespace fg {
namespace {

thread_local bool g_grad_enabled = true;

// Adds incoming gradients into a leaf's .grad: the first one becomes the gradient (taken as it
// is when nothing else can reach its memory, copied when something can: the incoming tensor may
// be shared with other nodes; copied into the storage set_grad_storage gave, when there is
// one), later ones are added in place.
class AccumulateGrad final : public Node {
public:
    explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
        : Node("accumulate_grad", 1), leaf_(std::move(leaf)) {}
    bool persistent() const override { return true; }

    std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
        Tensor& incoming = grads[0];
        if (!incoming.defined()) return {};
        FG_ASSERT(incoming.shape() == leaf_->shape, "gradient shape ", shape_str(incoming.shape()),
                  " for a leaf of shape ", shape_str(leaf_->shape));
        if (incoming.dtype() != leaf_->dtype) incoming = incoming.to(leaf_->dtype);
        if (!leaf_->grad.defined()) {
            leaf_->grad = owned_alone(incoming) ? incoming : incoming.clone();
        } else if (leaf_->grad_unwritten) {  // storage given for the gradient: written, kept
            copy_(leaf_->grad, incoming);
            leaf_->grad_unwritten = false;
        } else {
            add_(leaf_->grad, incoming);
        }
        // The engine runs this node once per backward, when every edge into it has delivered:
        // the gradient is now final for this backward.
        if (leaf_->post_accumulate_grad_hook) leaf_->post_accumulate_grad_hook();
        return {};
    }

private:
    // True when this handle is the only way to the tensor's memory and the tensor is all of it:
    // taking it saves a copy of every gradient.
    static bool owned_alone(const Tensor& t) {
        const TensorImpl* impl = t.impl();
        return t.sole_holder() && impl->offset == 0 && impl->storage->bytes == t.nbytes() &&
               !impl->grad_fn;
    }

    std::shared_ptr<TensorImpl> leaf_;
};

// The edge a gradient for `t` should travel along (grad_fn, or the leaf's accumulator).
Edge gradient_edge(const Tensor& t) {
    if (!t.defined() || !t.requires_grad()) return Edge{};
    TensorImpl* impl = t.impl();
    if (impl->grad_fn) return Edge{impl->grad_fn, impl->output_nr};
    std::shared_ptr<Node> acc = impl->accumulator.lock();
    if (!acc) {
        acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
        impl->accumulator = acc;
    }
    return Edge{acc, 0};
}

}  // namespace

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
    FG_ASSERT(fn_ != nullptr, "node ", name(), " has no backward");
    if (!grads[0].defined()) return std::vector<Tensor>(next_edges.size());
    std::vector<Tensor> out = fn_(grads[0]);
    FG_ASSERT(out.size() == next_edges.size(), "node ", name(), " returned ", out.size(),
              " gradients for ", next_edges.size(), " inputs");
    return out;
}

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

bool needs_grad(const std::vector<Tensor>& inputs) {
    if (!g_grad_enabled) return false;
    for (const Tensor& t : inputs)
        if (t.defined() && t.requires_grad()) return true;
    return false;
}

void record_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs) {
    node->next_edges.clear();
    for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        TensorImpl* impl = outputs[i].impl();
        impl->requires_grad = true;
        impl->grad_fn = node;
        impl->output_nr = static_cast<int>(i);
    }
}

Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor output, BackwardFn fn) {
    if (!needs_grad(inputs)) return output;
    record_node(std::make_shared<FunctionNode>(name, std::move(fn)), inputs, {output});
    return output;
}

void run_backward(const Tensor& root, const Tensor& grad) {
    FG_CHECK(root.defined(), "backward", "called on an undefined tensor");
    FG_CHECK(root.requires_grad(), "backward", "tensor of shape ", shape_str(root.shape()),
             " does not require grad (no input of the ops that made it requires grad)");
    Tensor seed = grad;
    if (!seed.defined()) {
        FG_CHECK(root.numel() == 1, "backward", "backward() without a gradient needs a tensor "
                 "with one element, got shape ", shape_str(root.shape()),
                 "; pass a gradient of that shape");
        seed = Tensor::ones(root.shape(), root.dtype(), root.device());
    } else {
        FG_CHECK(seed.shape() == root.shape(), "backward", "gradient has shape ",
                 shape_str(seed.shape()), ", tensor has shape ", shape_str(root.shape()));
        FG_CHECK(seed.device() == root.device(), "backward", "gradient is on ",
                 device_name(seed.device()), ", tensor is on ", device_name(root.device()));
    }

    Edge root_edge = gradient_edge(root);
    // Count, for each node, how many edges lead into it from the part of the graph we will run.
    std::unordered_map<Node*, int> pending;
    std::vector<Node*> stack{root_edge.node.get()};
    pending[root_edge.node.get()] = 0;
    while (!stack.empty()) {
        Node* node = stack.back();
        stack.pop_back();
        for (const Edge& e : node->next_edges) {
            if (!e.node) continue;
            auto [it, inserted] = pending.try_emplace(e.node.get(), 0);
            ++it->second;
            if (inserted) stack.push_back(e.node.get());
        }
    }

    NoGradGuard no_grad;  // backward computations are not recorded
    std::unordered_map<Node*, std::vector<Tensor>> buffers;
    buffers[root_edge.node.get()].resize(root_edge.node->num_outputs());
    buffers[root_edge.node.get()][root_edge.input_nr] = seed;
    std::vector<Node*> ready{root_edge.node.get()};
    while (!ready.empty()) {
        Node* node = ready.back();
        ready.pop_back();
        FG_CHECK(!node->released, "backward", "trying to backward through the graph a second time "
                 "(node '", node->name(), "' already ran and freed its saved tensors); run the "
                 "forward again");
        std::vector<Tensor> grads = std::move(buffers[node]);
        buffers.erase(node);
        grads.resize(node->num_outputs());
        std::vector<Tensor> input_grads = node->apply(std::move(grads));
        if (!node->persistent()) {
            node->release_saved();
            node->released = true;
        }
        for (std::size_t i = 0; i < node->next_edges.size(); ++i) {
            const Edge& e = node->next_edges[i];
            if (!e.node) continue;
            if (i < input_grads.size() && input_grads[i].defined()) {
                std::vector<Tensor>& slot = buffers[e.node.get()];
                slot.resize(e.node->num_outputs());
                Tensor& acc = slot[e.input_nr];
                acc = acc.defined() ? add(acc, input_grads[i]) : input_grads[i];
            }
            if (--pending[e.node.get()] == 0) ready.push_back(e.node.get());
        }
    }
}

}  // namespace fg
