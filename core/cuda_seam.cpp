// core/cuda_seam.cpp: the seam in a CUDA build (see cuda_backend.h): forwards each call to the
// kernels library, and turns device-side error records into fg::Error at synchronisations. The
// memory methods are written here by hand; the kernel launchers are generated from cuda_ops.def.
#include "kernels/embedding.h"
#include "kernels/linear_lt.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/runtime.h"
#include "kernels/attention.h"
#include "kernels/attention_cudnn.h"
#include "kernels/softmax.h"

#include "cuda_backend.h"
#include "error.h"

namespace fg {
namespace {

namespace k = ::fg::kernels;

void raise_device_error() {
    k::DeviceErrorRecord r = k::take_device_error();
    switch (static_cast<k::DeviceErrorCode>(r.code)) {
        case k::DeviceErrorCode::none: return;
        case k::DeviceErrorCode::embedding_index:
            fail("embedding", "token id ", r.value, " is out of range [0, ", r.bound,
                 ") (found on the device)");
        case k::DeviceErrorCode::cross_entropy_target:
            fail("cross_entropy", "target ", r.value, " is out of range [0, ", r.bound,
                 ") (found on the device)");
    }
}

class KernelsBackend final : public CudaBackend {
public:
    // Written by hand (cuda_backend.h says why these are not in cuda_ops.def).
    CudaDeviceInfo device_info() override {
        const k::DeviceInfo& d = k::device_info();
        return CudaDeviceInfo{d.name, d.sm_count, d.total_bytes};
    }
    void* malloc(std::size_t bytes) override { return k::device_malloc(bytes); }
    void free(void* ptr) override { k::device_free(ptr); }
    std::size_t free_bytes() override { return k::device_free_bytes(); }
    void copy_host_to_device(void* dst, const void* src, std::size_t bytes) override {
        k::copy_host_to_device(dst, src, bytes);
    }
    void copy_device_to_host(void* dst, const void* src, std::size_t bytes) override {
        k::copy_device_to_host(dst, src, bytes);
        raise_device_error();
    }
    void copy_device_to_device(void* dst, const void* src, std::size_t bytes) override {
        k::copy_device_to_device(dst, src, bytes);
    }
    void memset(void* dst, int byte, std::size_t bytes) override {
        k::memset_device(dst, byte, bytes);
    }
    void synchronize() override {
        k::synchronize();
        raise_device_error();
    }

    // One override per entry of cuda_ops.def, forwarding to the launcher of the same name: the
    // gelu_forward entry becomes
    //   void gelu_forward(kernels::ScalarType type, const void* x, void* y, long long n,
    //                     bool tanh_form) override
    //   { return ::fg::kernels::gelu_forward(type, x, y, n, tanh_form); }
#define FG_CUDA_OP(ret, name, params, args) \
    ret name params override { return ::fg::kernels::name args; }
#include "cuda_ops.def"
#undef FG_CUDA_OP
};

}  // namespace

CudaBackend* cuda_backend_or_null() {
    static KernelsBackend backend;
    static const bool usable = k::cuda_available();
    return usable ? &backend : nullptr;
}

bool built_with_cuda() { return true; }

CudaBackend& cuda_backend(const char* op) {
    CudaBackend* backend = cuda_backend_or_null();
    if (!backend) fail(op, "no CUDA device is available on this machine; use device cpu");
    return *backend;
}

}  // namespace fg
