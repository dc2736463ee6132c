// train/optim.cpp: see optim.h.
#include "optim.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"

namespace fg {
namespace {

kernels::AdamWStep adamw_factors(double lr, const AdamWOptions& o, bool decay, std::int64_t t) {
    kernels::AdamWStep s;
    s.decay = 1.0f - static_cast<float>(lr) * static_cast<float>(decay ? o.weight_decay : 0.0);
    s.one_minus_beta1 = 1.0f - static_cast<float>(o.beta1);
    s.beta2 = static_cast<float>(o.beta2);
    s.one_minus_beta2 = 1.0f - static_cast<float>(o.beta2);
    s.eps = static_cast<float>(o.eps);
    s.step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, static_cast<double>(t))));
    s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t))));
    return s;
}

// The CPU step: the kernel's operations, in the same order.
template <typename T>
void adamw_cpu(T* p, const T* g, T* m, T* v, std::int64_t n, const kernels::AdamWStep& s,
               T coef) {
    for (std::int64_t i = 0; i < n; ++i) {
        T grad = g[i] * coef;
        T param = p[i] * T(s.decay);
        T mi = m[i] + T(s.one_minus_beta1) * (grad - m[i]);
        T vi = T(s.beta2) * v[i] + T(s.one_minus_beta2) * grad * grad;
        T denom = std::sqrt(vi) / T(s.bc2_sqrt) + T(s.eps);
        p[i] = param - T(s.step_size) * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

}  // namespace

Optimizer::Optimizer(std::vector<NamedParam> params) : params_(std::move(params)) {
    for (const NamedParam& np : params_)
        FG_CHECK(np.param && np.param->defined() && np.param->requires_grad(), "optimizer",
                 "parameter '", np.name, "' is undefined or does not require grad");
}

std::size_t Optimizer::state_bytes() {
    std::size_t bytes = 0;
    for (const auto& [name, t] : named_state())
        if (t->defined()) bytes += t->nbytes();
    return bytes;
}

void Optimizer::zero_grad() {
    for (NamedParam& np : params_) np.param->zero_grad();
}

void check_adamw_options(const AdamWOptions& o) {
    FG_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "adamw",
             "betas must be in [0, 1), got ", o.beta1, ", ", o.beta2);
    FG_CHECK(o.eps > 0 && o.weight_decay >= 0, "adamw", "eps must be > 0 and weight_decay "
             ">= 0, got ", o.eps, ", ", o.weight_decay);
}

std::vector<std::pair<std::string, Tensor*>> adamw_named_state(
    const std::vector<NamedParam>& params, std::vector<Tensor>& m, std::vector<Tensor>& v) {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (std::size_t i = 0; i < params.size(); ++i) {
        out.emplace_back(params[i].name + ".exp_avg", &m[i]);
        out.emplace_back(params[i].name + ".exp_avg_sq", &v[i]);
    }
    return out;
}

AdamW::AdamW(std::vector<NamedParam> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), opt_(options) {
    check_adamw_options(opt_);
    for (const NamedParam& np : params_) {
        const Tensor& p = *np.param;
        FG_CHECK(p.dtype() == DType::f32 || (p.dtype() == DType::f64 && !p.is_cuda()), "adamw",
                 "parameter '", np.name, "' must be f32 (or f64 on the CPU), got ",
                 dtype_name(p.dtype()));
        m_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
        v_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
        decay_.push_back(adamw_decays(p));
    }
}

kernels::AdamWStep AdamW::factors(double lr, bool decay, std::int64_t t) const {
    return adamw_factors(lr, opt_, decay, t);
}

void AdamW::check_grad_scale(const Tensor& grad_scale) const {
    if (!grad_scale.defined() || params_.empty()) return;
    const Device device = params_[0].param->device();
    FG_CHECK(grad_scale.numel() == 1 && grad_scale.device() == device &&
                 (device != Device::cuda || grad_scale.dtype() == DType::f32),
             "adamw", "the gradient scale must be one value on ", device_name(device),
             (device == Device::cuda ? " (f32)" : ""), ", got ", shape_str(grad_scale.shape()),
             " on ", device_name(grad_scale.device()));
}

std::vector<kernels::AdamWTensor> AdamW::cuda_tensors() {
    std::vector<kernels::AdamWTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = *params_[i].param;
        Tensor g = p.grad();
        if (!g.defined() || !p.is_cuda()) continue;
        FG_CHECK(g.shape() == p.shape() && g.device() == p.device() && g.dtype() == p.dtype(),
                 "adamw", "gradient of '", params_[i].name, "' does not match its parameter");
        out.push_back({p.data<float>(), g.data<float>(), m_[i].data<float>(),
                       v_[i].data<float>(), p.numel(), static_cast<bool>(decay_[i])});
    }
    return out;
}

void AdamW::step(double lr, const Tensor& grad_scale) {
    NoGradGuard no_grad;
    check_grad_scale(grad_scale);  // before anything is updated
    ++steps_;
    const kernels::AdamWStep decayed = adamw_factors(lr, opt_, true, steps_);
    const kernels::AdamWStep plain = adamw_factors(lr, opt_, false, steps_);
    // CUDA: one multi-tensor launch a kMaxTensorsPerLaunch parameters.
    adamw_update(cuda_tensors(), Device::cuda, opt_, lr, steps_, grad_scale);
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = *params_[i].param;
        Tensor g = p.grad();
        if (!g.defined() || p.is_cuda()) continue;
        FG_CHECK(g.shape() == p.shape() && g.device() == p.device() && g.dtype() == p.dtype(),
                 "adamw", "gradient of '", params_[i].name, "' does not match its parameter");
        // Read for a CPU parameter only: then a CPU tensor, no synchronisation.
        const double coef = grad_scale.defined() ? grad_scale.item() : 1.0;
        const kernels::AdamWStep& s = decay_[i] ? decayed : plain;
        if (p.dtype() == DType::f64) {
            adamw_cpu(p.data<double>(), g.data<double>(), m_[i].data<double>(),
                      v_[i].data<double>(), p.numel(), s, coef);
        } else {
            adamw_cpu(p.data<float>(), g.data<float>(), m_[i].data<float>(), v_[i].data<float>(),
                      p.numel(), s, static_cast<float>(coef));
        }
    }
}

void AdamW::step_on_device(const Tensor& grad_scale, const kernels::AdamWStep* current,
                           const int* skip) {
    NoGradGuard no_grad;
    check_grad_scale(grad_scale);
    const std::vector<kernels::AdamWTensor> on_cuda = cuda_tensors();
    if (!on_cuda.empty())
        cuda_backend("adamw").adamw_multi_tensor_on_device(
            on_cuda.data(), static_cast<int>(on_cuda.size()), current,
            grad_scale.defined() ? grad_scale.data<float>() : nullptr, skip);
}

std::vector<std::pair<std::string, Tensor*>> AdamW::named_state() {
    return adamw_named_state(params_, m_, v_);
}

SGD::SGD(std::vector<NamedParam> params, const SGDOptions& options)
    : Optimizer(std::move(params)), opt_(options) {
    FG_CHECK(opt_.momentum >= 0 && opt_.momentum < 1 && opt_.weight_decay >= 0, "sgd",
             "momentum must be in [0, 1) and weight_decay >= 0, got ", opt_.momentum, ", ",
             opt_.weight_decay);
    buf_.resize(params_.size());
}

void SGD::step(double lr, const Tensor& grad_scale) {
    NoGradGuard no_grad;
    ++steps_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = *params_[i].param;
        Tensor g = p.grad();
        if (!g.defined()) continue;
        if (grad_scale.defined()) g = mul(g, cast(grad_scale, g.dtype()));
        if (opt_.weight_decay > 0) g = add(g, scale(p, opt_.weight_decay));
        if (opt_.momentum > 0) {
            buf_[i] = buf_[i].defined() ? add(scale(buf_[i], opt_.momentum), g) : g.clone();
            g = buf_[i];
        }
        add_(p, scale(g, -lr));
    }
}

std::vector<std::pair<std::string, Tensor*>> SGD::named_state() {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (std::size_t i = 0; i < buf_.size(); ++i)
        out.emplace_back(params_[i].name + ".momentum_buffer", &buf_[i]);
    return out;
}

GradNorm grad_norm(const std::vector<Tensor*>& params, double max_norm) {
    std::vector<Tensor> grads;
    for (Tensor* p : params) grads.push_back(p->grad());
    return grad_norm_of(grads, max_norm);
}

GradNorm grad_norm_of(const std::vector<Tensor>& grads, double max_norm) {
    NoGradGuard no_grad;
    std::vector<const float*> cuda_grads;
    std::vector<long long> cuda_sizes;
    double total = 0.0;  // the CPU gradients' sum of squares
    bool on_cuda = false, on_cpu = false;
    for (const Tensor& g : grads) {
        if (!g.defined()) continue;
        if (g.is_cuda()) {
            FG_CHECK(g.dtype() == DType::f32, "grad_norm", "CUDA gradients must be f32, got ",
                     dtype_name(g.dtype()));
            cuda_grads.push_back(g.data<float>());
            cuda_sizes.push_back(g.numel());
            on_cuda = true;
        } else {
            auto add_squares = [&](const auto* x, std::int64_t n) {
                for (std::int64_t i = 0; i < n; ++i) total += double(x[i]) * double(x[i]);
            };
            if (g.dtype() == DType::f32) add_squares(g.data<float>(), g.numel());
            else if (g.dtype() == DType::f64) add_squares(g.data<double>(), g.numel());
            else for (double v : g.to_vector<double>()) total += v * v;  // 16-bit: widened
            on_cpu = true;
        }
    }
    FG_CHECK(!(on_cuda && on_cpu), "grad_norm", "the gradients are on both the CPU and CUDA");
    GradNorm out;
    if (on_cuda) {
        const int launches = (static_cast<int>(cuda_grads.size()) + kernels::kMaxTensorsPerLaunch -
                              1) / kernels::kMaxTensorsPerLaunch;
        Tensor partials = Tensor::empty({launches * kernels::kSumSquaresBlocks}, DType::f32,
                                        Device::cuda);
        out.norm = Tensor::empty({}, DType::f32, Device::cuda);
        out.coef = Tensor::empty({}, DType::f32, Device::cuda);
        cuda_backend("grad_norm").grad_norm_clip(
            cuda_grads.data(), cuda_sizes.data(), static_cast<int>(cuda_grads.size()),
            partials.data<float>(), static_cast<float>(max_norm), out.norm.data<float>(),
            out.coef.data<float>());
        return out;
    }
    const double norm = std::sqrt(total);
    const double coef = max_norm > 0.0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
    out.norm = Tensor::full({}, norm, DType::f64, Device::cpu);
    out.coef = Tensor::full({}, coef, DType::f64, Device::cpu);
    return out;
}

void adamw_update(const std::vector<kernels::AdamWTensor>& pieces, Device device,
                  const AdamWOptions& options, double lr, std::int64_t t,
                  const Tensor& grad_scale) {
    if (pieces.empty()) return;
    const kernels::AdamWStep decayed = adamw_factors(lr, options, true, t);
    const kernels::AdamWStep plain = adamw_factors(lr, options, false, t);
    if (device == Device::cuda) {
        cuda_backend("adamw").adamw_multi_tensor(
            pieces.data(), static_cast<int>(pieces.size()), decayed, plain,
            grad_scale.defined() ? grad_scale.data<float>() : nullptr);
        return;
    }
    const float coef = grad_scale.defined() ? static_cast<float>(grad_scale.item()) : 1.0f;
    for (const kernels::AdamWTensor& x : pieces)
        adamw_cpu(x.p, x.g, x.m, x.v, x.n, x.decay ? decayed : plain, coef);
}

double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm) {
    NoGradGuard no_grad;
    GradNorm n = grad_norm(params, max_norm);
    for (Tensor* p : params)
        if (p->grad().defined()) p->set_grad(mul(p->grad(), cast(n.coef, p->grad().dtype())));
    return n.norm.item();
}

double cosine_lr(std::int64_t it, double lr, double min_lr, std::int64_t warmup_steps,
                 std::int64_t decay_steps) {
    if (it < warmup_steps) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup_steps + 1);
    if (it > decay_steps) return min_lr;
    double ratio = static_cast<double>(it - warmup_steps) /
                   static_cast<double>(std::max<std::int64_t>(1, decay_steps - warmup_steps));
    const double kPi = 3.14159265358979323846;
    double coeff = 0.5 * (1.0 + std::cos(kPi * ratio));
    return min_lr + coeff * (lr - min_lr);
}

}  // namespace fg
