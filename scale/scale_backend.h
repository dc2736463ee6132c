// scale/scale_backend.h: the wing's seam to the CUDA runtime. The wing (a captured step, several
// ranks, phase timing) needs things of the runtime that no op of core/ needs: NCCL's
// communicators and collectives, which GPU a rank takes, CUDA graphs, page-locked host memory,
// events, the device side of a captured step. They are reached here, through scale_backend(op),
// as core/ reaches its kernels through core/cuda_backend.h; the launchers are listed once, in
// scale_ops.def. A CPU-only build links scale_stub.cpp, whose scale_backend says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/captured_step.h"  // StepState, StepRecord, AdamWStep (plain C++)
#include "kernels/elementwise.h"    // ScalarType
#include "kernels/nccl.h"           // several GPUs (plain C++)

namespace fg {

class ScaleBackend {
public:
    virtual ~ScaleBackend() = default;
    // One pure virtual per entry of scale_ops.def.
#define FG_SCALE_OP(ret, name, params, args) virtual ret name params = 0;
#include "scale_ops.def"
#undef FG_SCALE_OP
};

// The backend, or an fg::Error naming `op` and why CUDA cannot be used.
ScaleBackend& scale_backend(const char* op);

}  // namespace fg
