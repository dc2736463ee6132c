// layers/module.cpp: see module.h.
#include "module.h"

#include "core/autograd.h"

namespace fg {

void Module::register_parameter(const std::string& name, Tensor* param) {
    params_.emplace_back(name, param);
}

void Module::register_module(const std::string& name, Module* child) {
    children_.emplace_back(name, child);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters(const std::string& prefix) {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (auto& [name, p] : params_)
        if (p->defined()) out.emplace_back(prefix + name, p);
    for (auto& [name, child] : children_) {
        auto sub = child->named_parameters(prefix + name + ".");
        out.insert(out.end(), sub.begin(), sub.end());
    }
    return out;
}

std::vector<Tensor*> Module::parameters() {
    std::vector<Tensor*> out;
    for (auto& [name, p] : named_parameters()) out.push_back(p);
    return out;
}

void Module::to(DType dtype) {
    NoGradGuard no_grad;
    for (Tensor* p : parameters()) {
        bool grad = p->requires_grad();
        *p = p->to(dtype).detach();
        p->set_requires_grad(grad);
    }
}

void Module::apply(const std::function<void(Module&)>& fn) {
    fn(*this);
    for (auto& [name, child] : children_) child->apply(fn);
}

void Module::train(bool on) {
    training_ = on;
    for (auto& [name, child] : children_) child->train(on);
}

}  // namespace fg
