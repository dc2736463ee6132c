// core/cuda_stub.cpp: the seam in a CPU-only build (see cuda_backend.h). There is no backend, so
// every CUDA request fails with "[op] built without CUDA".
#include "cuda_backend.h"
#include "error.h"

namespace fg {

CudaBackend* cuda_backend_or_null() { return nullptr; }
bool built_with_cuda() { return false; }

CudaBackend& cuda_backend(const char* op) {
    fail(op, "fusegrad was built without CUDA; rebuild with nvcc available (FG_CUDA=ON) or use "
             "device cpu");
}

}  // namespace fg
