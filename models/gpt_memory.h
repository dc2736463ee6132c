// models/gpt_memory.h: how much memory one training step of a GPT needs, worked out from the
// config before anything is allocated, so that a run too large for its device is refused with a
// number instead of ending in an out-of-memory error halfway through building the model.
//
// The estimate follows what the ops keep alive (see gpt_memory.cpp for the term-by-term count):
// the f32 parameters and the optimizer's state; in mixed precision the 16-bit copies of the
// weights that the forward keeps for the backward; and, at the step's busiest moment (the
// head's, the last MLP's or the last attention's backward, or the optimizer's step), the
// activations still saved, the gradients made so far and the op's own buffers (the fused
// attention's per-head (T, T) scores, say). Each tensor is rounded up to the
// caching allocator's granule, as the allocator does. tests/test_gpt.cpp (CPU, f32) and
// tests/gpu/test_gpu_train.cpp (CUDA, f32 and bf16) compare it with the allocator's measured
// peak. The CPU's 16-bit path is not covered: there each op widens its inputs to f32 copies
// (a test path, see core/ops/op_utils.h), which needs more than this.
#pragma once

#include <cstdint>
#include <string>

#include "gpt.h"

namespace fg {

struct TrainingMemory {
    double parameters = 0;       // f32 weights
    double optimizer_state = 0;  // AdamW's two moments, SGD's momentum buffer
    double weight_copies = 0;    // 16-bit copies of the weights the forward saves (bf16/f16)
    // At the busiest moment of the step:
    double activations = 0;  // saved by the forward and not yet used by the backward
    double gradients = 0;    // f32 gradients made so far (zero_grad frees them each step)
    double workspace = 0;    // buffers of the op running then
    double exchange = 0;     // several ranks: the gradients' flat buckets of their exchange
    double total() const {
        return parameters + gradients + optimizer_state + weight_copies + activations + workspace +
               exchange;
    }
    // "1.52 GiB: parameters 41.0 MiB, gradients 41.0 MiB, ..." (only the non-zero terms)
    std::string describe() const;
};

// One training step's memory for `config` on batches of `batch` sequences of `seq_len` tokens.
// `optimizer_floats_per_param`: 2 for AdamW, 1 for SGD with momentum, 0 without.
// `cudnn_attention`: the attention runs cuDNN's fused kernels (core/ops.h, AttentionBackend),
// which keep no (T, T) buffer but save their output for the backward.
TrainingMemory estimate_training_memory(const GPTConfig& config, std::int64_t batch,
                                        std::int64_t seq_len, int optimizer_floats_per_param,
                                        bool cudnn_attention = false);

}  // namespace fg
