// kernels/device_error.cuh: the device side of the error word declared in runtime.h. A kernel
// that meets an out-of-range index calls report_device_error(); the first report wins.
#pragma once

#include "runtime.h"

namespace fg::kernels {

__device__ inline void report_device_error(DeviceErrorRecord* record, DeviceErrorCode code,
                                           long long value, long long bound) {
    if (atomicCAS(&record->code, 0, static_cast<int>(code)) == 0) {
        record->value = value;
        record->bound = bound;
    }
}

// The grid of a grid-stride loop (elementwise, adamw, layout, embedding): a thread an item, at
// most 32 blocks an SM.
inline int grid_for(long long work_items, int threads_per_block) {
    long long blocks = (work_items + threads_per_block - 1) / threads_per_block;
    long long cap = static_cast<long long>(device_info().sm_count) * 32;
    if (blocks > cap) blocks = cap;
    return blocks < 1 ? 1 : static_cast<int>(blocks);
}

}  // namespace fg::kernels
