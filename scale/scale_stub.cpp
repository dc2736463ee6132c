// scale/scale_stub.cpp: the wing's seam in a CPU-only build (see scale_backend.h): there is no
// backend, so every request fails as core's seam does.
#include "scale_backend.h"

#include "core/cuda_backend.h"
#include "core/error.h"

namespace fg {

ScaleBackend& scale_backend(const char* op) {
    cuda_backend(op);  // throws: "[op] fusegrad was built without CUDA ..."
    fail(op, "fusegrad was built without CUDA");
}

}  // namespace fg
