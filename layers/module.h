// layers/module.h: Module, the base of every layer: named parameters (nanoGPT-style dotted names
// such as "ln_1.weight"), sub-modules, moving to a device, train/eval mode, zero_grad.
#pragma once

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
    void zero_grad();
    // Moves every parameter to `device` (kept as leaves that require grad).
    void to(Device device);
    void train(bool on = true);
    bool training() const { return training_; }

protected:
    void register_parameter(const std::string& name, Tensor* param);
    void register_module(const std::string& name, Module* child);

private:
    std::vector<std::pair<std::string, Tensor*>> params_;
    std::vector<std::pair<std::string, Module*>> children_;
    bool training_ = true;
};

}  // namespace fg
