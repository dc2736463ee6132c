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
void adamw_cpu(T* p, const T* g, T* m, T* v, std::int64_t n, const kernels::AdamWStep& s) {
    for (std::int64_t i = 0; i < n; ++i) {
        T param = p[i] * T(s.decay);
        T mi = m[i] + T(s.one_minus_beta1) * (g[i] - m[i]);
        T vi = T(s.beta2) * v[i] + T(s.one_minus_beta2) * g[i] * g[i];
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

void Optimizer::zero_grad() {
    for (NamedParam& np : params_) np.param->zero_grad();
}

AdamW::AdamW(std::vector<NamedParam> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), opt_(options) {
    FG_CHECK(opt_.beta1 >= 0 && opt_.beta1 < 1 && opt_.beta2 >= 0 && opt_.beta2 < 1, "adamw",
             "betas must be in [0, 1), got ", opt_.beta1, ", ", opt_.beta2);
    FG_CHECK(opt_.eps > 0 && opt_.weight_decay >= 0, "adamw", "eps must be > 0 and weight_decay "
             ">= 0, got ", opt_.eps, ", ", opt_.weight_decay);
    for (const NamedParam& np : params_) {
        const Tensor& p = *np.param;
        FG_CHECK(p.dtype() == DType::f32 || (p.dtype() == DType::f64 && !p.is_cuda()), "adamw",
                 "parameter '", np.name, "' must be f32 (or f64 on the CPU), got ",
                 dtype_name(p.dtype()));
        m_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
        v_.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
        decay_.push_back(p.dim() >= 2);
    }
}

void AdamW::step(double lr) {
    NoGradGuard no_grad;
    ++steps_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = *params_[i].param;
        Tensor g = p.grad();
        if (!g.defined()) continue;
        FG_CHECK(g.shape() == p.shape() && g.device() == p.device() && g.dtype() == p.dtype(),
                 "adamw", "gradient of '", params_[i].name, "' does not match its parameter");
        kernels::AdamWStep s = adamw_factors(lr, opt_, decay_[i], steps_);
        if (p.is_cuda()) {
            cuda_backend("adamw").adamw_step_f32(p.data<float>(), g.data<float>(),
                                                 m_[i].data<float>(), v_[i].data<float>(),
                                                 p.numel(), s);
        } else if (p.dtype() == DType::f64) {
            adamw_cpu(p.data<double>(), g.data<double>(), m_[i].data<double>(),
                      v_[i].data<double>(), p.numel(), s);
        } else {
            adamw_cpu(p.data<float>(), g.data<float>(), m_[i].data<float>(), v_[i].data<float>(),
                      p.numel(), s);
        }
    }
}

std::vector<std::pair<std::string, Tensor*>> AdamW::named_state() {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (std::size_t i = 0; i < m_.size(); ++i) {
        out.emplace_back(params_[i].name + ".exp_avg", &m_[i]);
        out.emplace_back(params_[i].name + ".exp_avg_sq", &v_[i]);
    }
    return out;
}

SGD::SGD(std::vector<NamedParam> params, const SGDOptions& options)
    : Optimizer(std::move(params)), opt_(options) {
    FG_CHECK(opt_.momentum >= 0 && opt_.momentum < 1 && opt_.weight_decay >= 0, "sgd",
             "momentum must be in [0, 1) and weight_decay >= 0, got ", opt_.momentum, ", ",
             opt_.weight_decay);
    buf_.resize(params_.size());
}

void SGD::step(double lr) {
    NoGradGuard no_grad;
    ++steps_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = *params_[i].param;
        Tensor g = p.grad();
        if (!g.defined()) continue;
        if (opt_.weight_decay > 0) g = add(g, scale(p, opt_.weight_decay));
        if (opt_.momentum > 0) {
            if (!buf_[i].defined()) {
                buf_[i] = g.clone();
            } else {
                buf_[i] = scale(buf_[i], opt_.momentum);
                add_(buf_[i], g);
            }
            g = buf_[i];
        }
        Tensor update = scale(g, -lr);
        add_(p, update);
    }
}

std::vector<std::pair<std::string, Tensor*>> SGD::named_state() {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (std::size_t i = 0; i < buf_.size(); ++i)
        out.emplace_back(params_[i].name + ".momentum_buffer", &buf_[i]);
    return out;
}

double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm) {
    NoGradGuard no_grad;
    Tensor total;
    for (Tensor* p : params) {
        Tensor g = p->grad();
        if (!g.defined()) continue;
        Tensor sq = sum(mul(g, g));
        if (sq.dtype() != DType::f64 && !sq.is_cuda()) sq = sq.to(DType::f64);
        total = total.defined() ? add(total, sq.to(total.dtype())) : sq;
    }
    if (!total.defined()) return 0.0;
    double norm = std::sqrt(total.item());
    if (max_norm > 0.0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            for (Tensor* p : params)
                if (p->grad().defined()) p->set_grad(scale(p->grad(), coef));
        }
    }
    return norm;
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
