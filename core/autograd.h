// core/autograd.h: reverse-mode automatic differentiation on a dynamic tape.
//
// Each differentiable op that sees an input requiring grad creates a Node and hangs it on its
// output (grad_fn). A node's next_edges point at the nodes that produced its inputs (or, for
// leaves, at an AccumulateGrad node that adds into the leaf's .grad). backward() on a scalar
// counts how many edges reach each node, then runs nodes in reverse topological order (a node runs
// once every consumer of its outputs has handed it a gradient), summing gradients that meet.
//
// Saved tensors live in the node (for FunctionNode: in the backward closure's captures) and are
// released right after the node runs; running the same node again is a clear error. A closure
// must never capture a tensor that has this node as grad_fn (that is a reference cycle): capture
// out.detach() instead.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor.h"

namespace fg {

struct Edge {
    std::shared_ptr<Node> node;  // null: this input needs no gradient
    int input_nr = 0;            // which output of `node` the gradient belongs to
};

class Node {
public:
    Node(std::string name, int num_outputs) : name_(std::move(name)), num_outputs_(num_outputs) {}
    virtual ~Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;

    const std::string& name() const { return name_; }
    int num_outputs() const { return num_outputs_; }

    // grads: one per output (undefined where an output received none). Returns one gradient per
    // entry of next_edges (undefined where none is needed).
    virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
    // Drops saved tensors. Nodes that persist across backward passes (AccumulateGrad) keep state.
    virtual void release_saved() {}
    virtual bool persistent() const { return false; }

    std::vector<Edge> next_edges;
    bool released = false;

private:
    std::string name_;
    int num_outputs_;
};

// The usual node: one output, its backward a closure over what the forward saved.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad)>;

class FunctionNode final : public Node {
public:
    FunctionNode(std::string name, BackwardFn fn) : Node(std::move(name), 1), fn_(std::move(fn)) {}
    std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
    void release_saved() override { fn_ = nullptr; }

private:
    BackwardFn fn_;
};

// Grad mode: recording is on by default; NoGradGuard turns it off in its scope (evaluation,
// sampling, optimizer steps, and the backward pass itself).
bool grad_enabled();
class NoGradGuard {
public:
    NoGradGuard();
    ~NoGradGuard();
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};

// True when grad mode is on and some input requires grad: the op must record a node.
bool needs_grad(const std::vector<Tensor>& inputs);

// Hooks `output` to a FunctionNode named `name` whose edges lead to `inputs`, when needs_grad.
// Returns output for chaining.
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor output, BackwardFn fn);
// General form for nodes with several outputs: wires edges and sets grad_fn/output_nr.
void record_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs);

// The engine behind Tensor::backward.
void run_backward(const Tensor& root, const Tensor& grad);

}  // namespace fg
