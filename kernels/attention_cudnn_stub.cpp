// kernels/attention_cudnn_stub.cpp: attention_cudnn.h in a CUDA build without cuDNN (FG_CUDNN
// did not find cudnn.h, libcudnn and cudnn_frontend.h, or was OFF; cmake/FusegradCudnn.cmake).
// cuDNN is never available, so causal_attention runs fusegrad's own kernels (attention.h); the
// launchers cannot be reached and throw if they are.
#include "attention_cudnn.h"
#include "runtime.h"

namespace fg::kernels {

namespace {
[[noreturn]] void not_built() {
    throw CudaError("[attention_cudnn] fusegrad was built without cuDNN (FG_CUDNN)");
}
}  // namespace

bool cudnn_attention_built() {
    return false;
}

std::string cudnn_attention_unsupported(ScalarType, long long) {
    return "fusegrad was built without cuDNN (configure with -DFG_CUDNN=ON once cuDNN and its "
           "frontend are installed: see README)";
}

std::size_t cudnn_attention_workspace_bytes(const CudnnAttentionArgs&, bool) {
    not_built();
}
void cudnn_attention_forward(const CudnnAttentionArgs&) {
    not_built();
}
void cudnn_attention_backward(const CudnnAttentionArgs&) {
    not_built();
}

}  // namespace fg::kernels
