// train/step.h: one training step, written once. The forward and backward of the step's
// micro-batches (each loss scaled by 1 / grad_accum, the losses summed on the device), the
// gradients' norm and clip factor, then the update. The eager trainer (train/trainer.cpp) and the
// captured graph (scale/cuda_graph.h's CapturedStep, the wing's QueuedSteps) both run this body;
// what differs between them is in the hooks: where a micro-batch comes from, what happens once
// the gradients are queued (ranks wait for their exchange), and how the update gets its learning
// rate (from the host, or from a table on the device).
#pragma once

#include <cstdint>

#include "data.h"
#include "models/gpt.h"
#include "optim.h"

namespace fg {

class StepHooks {
public:
    virtual ~StepHooks() = default;
    // The step begins (the gradients were just dropped).
    virtual void begin() {}
    // Micro-batch `micro` (0 .. grad_accum - 1) of the step, on the model's device.
    virtual Batch micro_batch(std::int64_t micro) = 0;
    // Just before the last micro-batch's backward, which completes the gradients.
    virtual void before_last_backward() {}
    // Every backward is queued; `loss_sum` is the sum of the micro-batches' losses (f32, on the
    // device). Returns the gradients' norm and clip factor (by default over the model's
    // parameters).
    virtual GradNorm gradients_done(const Tensor& /*loss_sum*/, GPT& model, double max_norm) {
        return grad_norm(model.parameters(), max_norm);
    }
    // The update, with the clip factor applied inside it.
    virtual void update(const Tensor& loss_sum, const GradNorm& clip) = 0;
};

void training_step(GPT& model, Optimizer& opt, std::int64_t grad_accum, double grad_clip,
                   StepHooks& hooks);

}  // namespace fg
