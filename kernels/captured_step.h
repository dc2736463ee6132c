// kernels/captured_step.h: the device side of a training step captured in a CUDA graph. A
// replay runs without the host, so what changes from step to step lives on the device: a
// StepState (the step counter, the dropout counters' base, the halt flag, the ranks' agreed
// stop), the AdamW factors of the coming steps in a table the host fills (the same floats the
// host would have passed), and a ring of each step's loss and norm that the host reads when it
// logs. step_begin and step_end bracket the update (adamw.h's adamw_multi_tensor_on_device).
#pragma once

#include "adamw.h"

namespace fg::kernels {

struct StepState {
    long long step;                    // optimizer steps done
    unsigned long long philox_base;    // dropout counters' base (runtime.h's philox_offset_base)
    long long halted_at;  // 0, or the first step whose loss or norm was not finite or whose kernels
                          // reported bad input
    long long stopped_at;              // 0, or the step after which the ranks agreed to stop
    int skip;                          // 1: the update changes nothing (from the halted step on,
                                       // after the stop step)
    int padding;
};
struct StepRecord {
    float loss_sum;  // the step's losses summed over its micro-batches (and over the ranks)
    float norm;      // the gradients' global norm
};
// Before the update (one thread; nothing once skipping): records step s = state->step + 1 in
// ring[(s - 1) % window] (*loss_sum and *norm); if either is not finite, or a kernel has
// recorded bad input (runtime.h's device error record; several ranks: `bad_input`, the sum of
// their records' codes), sets halted_at = s and skip; where `stop` (several ranks: the sum of
// their stop requests; else null) is above 0, sets stopped_at = s (this step updates, the
// later ones not); copies the step's factors, table[2 ((s - 1) % window)] (decayed) and the
// next (plain), to current[0] and current[1].
void step_begin(StepState* state, const float* loss_sum, const float* norm, const float* stop,
                const int* bad_input, StepRecord* ring, const AdamWStep* table, int window,
                AdamWStep* current);
// Where kernels record the code of bad input they find (runtime.h's device error record; 0:
// none), for several ranks' captured step to sum it over them.
const int* device_error_code();
// After the update (one thread): unless skipped, state->step += 1 and the dropout base moves on
// by `philox_per_step` counters (so both stay those of the last step that updated); after the
// stop step, skip.
void step_end(StepState* state, unsigned long long philox_per_step);

}  // namespace fg::kernels
