// kernels/captured_step.cu: see captured_step.h. Two one-thread kernels around the update.
#include "captured_step.h"

#include <cmath>

#include "device_error.cuh"
#include "runtime.h"

namespace fg::kernels {
namespace {

__global__ void step_begin_kernel(StepState* state, const float* loss_sum, const float* norm,
                                  const float* stop, const int* bad_input, StepRecord* ring,
                                  const AdamWStep* table, int window, AdamWStep* current,
                                  const DeviceErrorRecord* errors) {
    if (state->skip) return;  // halted or stopped: the last step's record stays as it was
    const long long s = state->step + 1;
    const int slot = static_cast<int>((s - 1) % window);
    ring[slot] = StepRecord{*loss_sum, *norm};
    // A kernel of this step found bad input (a token id out of range): the host raises it at
    // its next synchronisation; until then nothing is updated.
    const bool bad = bad_input ? *bad_input != 0 : errors->code != 0;
    if (!isfinite(*loss_sum) || !isfinite(*norm) || bad) {
        if (state->halted_at == 0) state->halted_at = s;
        state->skip = 1;
    }
    if (stop && *stop > 0.0f) state->stopped_at = s;
    current[0] = table[2 * slot];
    current[1] = table[2 * slot + 1];
}

__global__ void step_end_kernel(StepState* state, unsigned long long philox_per_step) {
    if (state->skip) return;
    state->step += 1;
    state->philox_base += philox_per_step;
    if (state->stopped_at != 0) state->skip = 1;
}

}  // namespace

void step_begin(StepState* state, const float* loss_sum, const float* norm, const float* stop,
                const int* bad_input, StepRecord* ring, const AdamWStep* table, int window,
                AdamWStep* current) {
    step_begin_kernel<<<1, 1, 0, stream()>>>(state, loss_sum, norm, stop, bad_input, ring, table,
                                             window, current, device_error_record());
    FG_LAUNCH_CHECK();
}

const int* device_error_code() { return &device_error_record()->code; }

void step_end(StepState* state, unsigned long long philox_per_step) {
    step_end_kernel<<<1, 1, 0, stream()>>>(state, philox_per_step);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
