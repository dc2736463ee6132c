// layers/module.h: Module, the base of every layer: named parameters (nanoGPT-style dotted names
// such as "ln_1.weight"), sub-modules, casting the parameters, train/eval mode, and apply (a visit
// of every module of the tree, to configure the layers of a built model).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace fg {

class Module {
public:
    virtual ~Module() = default;
    Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    // Parameters of this module and its children, depth first, named "child.param".
    std::vector<std::pair<std::string, Tensor*>> named_parameters(const std::string& prefix = "");
    std::vector<Tensor*> parameters();
    // Casts every parameter, kept as a leaf that requires grad as before (e.g. to f64 for
    // gradient checks on the CPU).
    void to(DType dtype);
    void train(bool on = true);
    bool training() const { return training_; }
    // Calls fn on this module, then on every sub-module, depth first in registration order (a
    // module before its children, where PyTorch's Module.apply visits the children first), each
    // module once per registration. For settings that belong to a layer but not to the model's
    // shape, such as the norms' dw/db reduction, set once the model is built.
    void apply(const std::function<void(Module&)>& fn);

    // Also for containers that only group names (a GPT's "transformer.").
    void register_module(const std::string& name, Module* child);

protected:
    void register_parameter(const std::string& name, Tensor* param);

private:
    std::vector<std::pair<std::string, Tensor*>> params_;
    std::vector<std::pair<std::string, Module*>> children_;
    bool training_ = true;
};

}  // namespace fg
