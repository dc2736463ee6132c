// core/cuda_backend.h: the one seam between core/ and the CUDA kernels. core/ calls the GPU only
// through cuda_backend(op), which returns the kernels library in a CUDA build with a device, and
// otherwise throws "[op] built without CUDA" or "[op] no CUDA device is available". The CUDA
// build implements this interface in cuda_seam.cpp by forwarding to kernels/; a CPU-only build
// links cuda_stub.cpp, which has no implementation at all. No #ifdef anywhere else. The kernel
// launchers are listed once, in cuda_ops.def, and expanded here and in cuda_seam.cpp.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/attention_cudnn.h"  // CudnnAttentionArgs (plain C++ declarations)
#include "kernels/elementwise.h"      // ScalarType, BinaryOp
#include "kernels/layout.h"           // PermuteParams
#include "kernels/norm.h"             // NormForwardArgs, NormBackwardArgs
#include "kernels/adamw.h"            // AdamWStep, AdamWTensor

namespace fg {

struct CudaDeviceInfo {
    std::string name;
    int sm_count = 0;
    std::size_t total_bytes = 0;
};

class CudaBackend {
public:
    virtual ~CudaBackend() = default;
    virtual CudaDeviceInfo device_info() = 0;

    // Memory and copies, all ordered on fusegrad's one stream. Device-to-host copies synchronise
    // and then surface any error a kernel recorded (see kernels/runtime.h) as an fg::Error.
    // Written by hand, like device_info, not in cuda_ops.def: most of their forwarders rename
    // (malloc -> device_malloc), or check for device errors (copy_device_to_host, synchronize).
    virtual void* malloc(std::size_t bytes) = 0;  // nullptr when out of memory
    virtual void free(void* ptr) = 0;
    virtual std::size_t free_bytes() = 0;  // what the driver can still hand out
    virtual void copy_host_to_device(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void copy_device_to_host(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void copy_device_to_device(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void memset(void* dst, int byte, std::size_t bytes) = 0;
    virtual void synchronize() = 0;

    // Kernel launchers, one pure virtual per entry of cuda_ops.def (the X-macro list: its top
    // comment explains the pattern).
#define FG_CUDA_OP(ret, name, params, args) virtual ret name params = 0;
#include "cuda_ops.def"
#undef FG_CUDA_OP
};

// The backend, or nullptr when this build has no CUDA or the machine has no device.
CudaBackend* cuda_backend_or_null();
// True when CUDA tensors can be made here.
inline bool cuda_is_available() { return cuda_backend_or_null() != nullptr; }
// True when fusegrad was compiled with its CUDA kernels (whether or not a device is present).
bool built_with_cuda();
// The backend, or an fg::Error naming `op` and why CUDA cannot be used.
CudaBackend& cuda_backend(const char* op);

}  // namespace fg
