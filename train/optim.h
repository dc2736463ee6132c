// train/optim.h: optimizers and the learning-rate schedule.
//   AdamW: PyTorch's update (kernels/adamw.h states it), decoupled weight decay applied only to
//     parameters with 2 or more dims (matrices and embeddings, as nanoGPT does); on CUDA one
//     multi-tensor launch a kernels::kMaxTensorsPerLaunch parameters, the clip factor applied
//     inside it; the same arithmetic on the CPU.
//   SGD: momentum (buf = mu buf + g, the first step buf = g) and coupled L2 weight decay, as
//     PyTorch's SGD.
//   grad_norm: the gradients' global norm and clip factor min(1, max_norm / (||g|| + 1e-6)), as
//     tensors where the gradients are (nothing read back); the step applies the factor.
//   clip_grad_norm: the same, then the gradients scaled by it; returns ||g|| (read back).
//   cosine_lr: nanoGPT's schedule: linear warmup, then cosine decay to min_lr.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/adamw.h"  // AdamWStep, AdamWTensor (plain C++)

namespace fg {

struct NamedParam {
    std::string name;
    Tensor* param;
};

class Optimizer {
public:
    virtual ~Optimizer() = default;
    // One update of every parameter that has a gradient, with learning rate lr, each gradient
    // first multiplied by `grad_scale` (a scalar tensor on the parameters' device, e.g.
    // GradNorm::coef; undefined: 1).
    virtual void step(double lr, const Tensor& grad_scale) = 0;
    void step(double lr) { step(lr, Tensor()); }
    // The optimizer's tensors by name ("<param>.exp_avg", ...), for checkpoints; a tensor may be
    // undefined until the first step (SGD's momentum buffer).
    virtual std::vector<std::pair<std::string, Tensor*>> named_state() = 0;
    virtual const char* name() const = 0;
    // For an optimizer whose state is split across ranks (ZeRO-1's sharded AdamW, made by the wing: train/wing.h),
    // around a checkpoint; no-ops for the others. gather_state() (every rank calls it) makes
    // named_state() the whole state, on the host of the rank that saves (rank 0); to load,
    // prepare_state_load() makes it whole host tensors to load into; shard_state() then keeps
    // this rank's part of what was loaded, and frees the whole copies.
    virtual void gather_state() {}
    virtual void prepare_state_load() {}
    virtual void shard_state() {}
    // The bytes of state this process keeps (its slice, when split).
    virtual std::size_t state_bytes();
    void zero_grad();
    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }

protected:
    explicit Optimizer(std::vector<NamedParam> params);
    std::vector<NamedParam> params_;
    std::int64_t steps_ = 0;
};

struct AdamWOptions {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW final : public Optimizer {
public:
    AdamW(std::vector<NamedParam> params, const AdamWOptions& options);
    using Optimizer::step;
    void step(double lr, const Tensor& grad_scale) override;
    std::vector<std::pair<std::string, Tensor*>> named_state() override;  // exp_avg, exp_avg_sq
    const char* name() const override { return "adamw"; }

    // For a step captured in a CUDA graph (train/wing.h's QueuedSteps). The factors of update t (1 for
    // the first) at learning rate lr, for parameters that decay or not: what step() passes.
    kernels::AdamWStep factors(double lr, bool decay, std::int64_t t) const;
    // The update of the CUDA parameters with the factors read on the device, current[0] for
    // those that decay and current[1] for the rest, and nothing changed while *skip is set. The
    // host's count of steps is not advanced (the graph's step counter is on the device).
    void step_on_device(const Tensor& grad_scale, const kernels::AdamWStep* current,
                        const int* skip);

private:
    // The parameters with a gradient, as the multi-tensor kernels take them (CUDA only).
    std::vector<kernels::AdamWTensor> cuda_tensors();
    void check_grad_scale(const Tensor& grad_scale) const;

    AdamWOptions opt_;
    std::vector<Tensor> m_, v_;
    std::vector<bool> decay_;
};

struct SGDOptions {
    double momentum = 0.9, weight_decay = 0.0;
};

class SGD final : public Optimizer {
public:
    SGD(std::vector<NamedParam> params, const SGDOptions& options);
    using Optimizer::step;
    void step(double lr, const Tensor& grad_scale) override;
    std::vector<std::pair<std::string, Tensor*>> named_state() override;  // momentum_buffer
    const char* name() const override { return "sgd"; }

private:
    SGDOptions opt_;
    std::vector<Tensor> buf_;
};

// The global L2 norm of all gradients and the factor that clips it to max_norm: coef = min(1,
// max_norm / (norm + 1e-6)), 1 when max_norm <= 0 (measure only). Scalars on the parameters'
// device (f32 on CUDA, f64 on the CPU); on CUDA nothing is read back. The gradients are not
// changed: pass coef to Optimizer::step.
struct GradNorm {
    Tensor norm;
    Tensor coef;
};
GradNorm grad_norm(const std::vector<Tensor*>& params, double max_norm);
// The same over gradient tensors themselves (undefined ones skipped).
GradNorm grad_norm_of(const std::vector<Tensor>& grads, double max_norm);

// What AdamW and ZeRO-1's sharded AdamW (the wing's) share: the check of their
// options (an error naming the bad one), which parameters decay (2 or more dims), and the names
// their moments have in checkpoints ("<param>.exp_avg", "<param>.exp_avg_sq").
void check_adamw_options(const AdamWOptions& options);
inline bool adamw_decays(const Tensor& param) { return param.dim() >= 2; }
std::vector<std::pair<std::string, Tensor*>> adamw_named_state(
    const std::vector<NamedParam>& params, std::vector<Tensor>& m, std::vector<Tensor>& v);

// One AdamW update (AdamW::step's arithmetic, at update t and learning rate lr) of raw f32 pieces
// of parameters on `device` (values, gradient and moments; ZeRO-1's slices): the multi-tensor
// kernel on CUDA, the same operations on the CPU. grad_scale as Optimizer::step's.
void adamw_update(const std::vector<kernels::AdamWTensor>& pieces, Device device,
                  const AdamWOptions& options, double lr, std::int64_t t, const Tensor& grad_scale);

// grad_norm, then every gradient scaled by coef; returns the norm, read on the host (one
// device synchronisation).
double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm);

// nanoGPT's learning rate at step `it` (0-based).
double cosine_lr(std::int64_t it, double lr, double min_lr, std::int64_t warmup_steps,
                 std::int64_t decay_steps);

}  // namespace fg
