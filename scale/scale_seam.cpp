// scale/scale_seam.cpp: the wing's seam in a CUDA build (see scale_backend.h): each call
// forwards to the kernels library's function of the same name.
#include "scale_backend.h"

#include "core/cuda_backend.h"
#include "kernels/runtime.h"

namespace fg {
namespace {

class KernelsScaleBackend final : public ScaleBackend {
public:
#define FG_SCALE_OP(ret, name, params, args) \
    ret name params override { return ::fg::kernels::name args; }
#include "scale_ops.def"
#undef FG_SCALE_OP
};

}  // namespace

ScaleBackend& scale_backend(const char* op) {
    static KernelsScaleBackend backend;
    cuda_backend(op);  // the same device as core's seam, or core's error naming `op`
    return backend;
}

}  // namespace fg
