// train/step.cpp: the body of a training step (train/step.h).
#include "step.h"

#include "core/autograd.h"
#include "core/ops.h"

namespace fg {

void training_step(GPT& model, Optimizer& opt, std::int64_t grad_accum, double grad_clip,
                   StepHooks& hooks) {
    model.train(true);
    opt.zero_grad();
    hooks.begin();
    // The losses are summed where they are computed: nothing waits for the host here.
    Tensor loss_sum;
    // The loss's gradient is known before the backward (the mean over micro-batches): the loss
    // writes the logits' gradient as it reads them, once, for exactly the float that scale's
    // backward sends (float(loss_grad)); another float would cost the loss a rescaling pass.
    const double loss_grad = 1.0 / static_cast<double>(grad_accum);
    for (std::int64_t micro = 0; micro < grad_accum; ++micro) {
        const Batch b = hooks.micro_batch(micro);
        Tensor loss = model.loss(model.forward(b.inputs), b.targets, -1,
                                 static_cast<float>(loss_grad));
        if (micro == grad_accum - 1) hooks.before_last_backward();
        scale(loss, loss_grad).backward();
        loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
    }
    NoGradGuard no_grad;
    if (loss_sum.dtype() != DType::f32) loss_sum = cast(loss_sum, DType::f32);
    const GradNorm clip = hooks.gradients_done(loss_sum, model, grad_clip);
    hooks.update(loss_sum, clip);
}

}  // namespace fg
