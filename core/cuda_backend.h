// core/cuda_backend.h: the one seam between core/ and the CUDA kernels. core/ calls the GPU only
// through cuda_backend(op), which returns the kernels library in a CUDA build with a device, and
// otherwise throws "[op] built without CUDA" or "[op] no CUDA device is available". The CUDA
// build implements this interface in cuda_seam.cpp by forwarding to kernels/; a CPU-only build
// links cuda_stub.cpp, which has no implementation at all. No #ifdef anywhere else.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/elementwise.h"  // ScalarType, BinaryOp (plain C++ declarations)
#include "kernels/layout.h"       // PermuteParams
#include "kernels/norm.h"         // NormForwardArgs, NormBackwardArgs
#include "kernels/optim.h"        // AdamWStep

namespace fg {

struct CudaDeviceInfo {
    std::string name;
    int sm_count = 0;
    int l2_bytes = 0;
    std::size_t total_bytes = 0;
};

class CudaBackend {
public:
    virtual ~CudaBackend() = default;
    virtual CudaDeviceInfo device_info() = 0;

    // Memory and copies, all ordered on fusegrad's one stream. Device-to-host copies synchronise
    // and then surface any error a kernel recorded (see kernels/runtime.h) as an fg::Error.
    virtual void* malloc(std::size_t bytes) = 0;  // nullptr when out of memory
    virtual void free(void* ptr) = 0;
    virtual std::size_t free_bytes() = 0;  // what the driver can still hand out
    virtual void copy_host_to_device(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void copy_device_to_host(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void copy_device_to_device(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void memset(void* dst, int byte, std::size_t bytes) = 0;
    virtual void synchronize() = 0;

    // Kernel launchers: see the kernels/*.h header named beside each group for the math. A
    // `type` is the storage of every floating operand (f32, bf16 or f16) unless named otherwise.
    // elementwise.h
    virtual void binary(kernels::BinaryOp op, kernels::ScalarType type, const void* a,
                        kernels::Broadcast sa, const void* b, kernels::Broadcast sb, void* out,
                        long long n) = 0;
    virtual void scale(kernels::ScalarType type, const void* x, float alpha, void* y,
                       long long n) = 0;
    virtual void rsqrt(kernels::ScalarType type, const void* x, void* y, long long n) = 0;
    virtual void gelu_forward(kernels::ScalarType type, const void* x, void* y, long long n) = 0;
    virtual void gelu_backward(kernels::ScalarType type, const void* x, const void* dy, void* dx,
                               long long n) = 0;
    virtual void dropout(kernels::ScalarType type, const void* in, void* out, long long n, float p,
                         unsigned long long seed, unsigned long long offset) = 0;
    virtual void fill(void* dst, kernels::ScalarType type, double value, long long n) = 0;
    virtual void cast(const void* src, kernels::ScalarType from, void* dst,
                      kernels::ScalarType to, long long n) = 0;
    virtual void random_uniform_f32(float* out, long long n, unsigned long long seed,
                                    unsigned long long offset) = 0;
    virtual void random_normal_f32(float* out, long long n, float mean, float stddev,
                                   unsigned long long seed, unsigned long long offset) = 0;
    virtual void random_bernoulli_f32(float* out, long long n, float p, unsigned long long seed,
                                      unsigned long long offset) = 0;
    // reduce.h
    virtual void row_sum(kernels::ScalarType type, const void* x, long long rows, long long cols,
                         float alpha, void* out) = 0;
    virtual std::size_t column_sum_workspace_bytes(long long rows, long long cols) = 0;
    virtual void column_sum(kernels::ScalarType type, const void* x, long long rows,
                            long long cols, void* out, void* workspace) = 0;
    virtual std::size_t total_sum_workspace_bytes(long long n) = 0;
    virtual void total_sum(kernels::ScalarType type, const void* x, long long n, float alpha,
                           void* out, void* workspace) = 0;
    // attention.h (S, dPd and lse fp32; Pd and dS of out_type)
    virtual void attention_probs(const float* s, kernels::ScalarType out_type, void* pd,
                                 float* lse, bool compute_lse, long long rows, long long t,
                                 float scale, float p, std::uint64_t seed,
                                 std::uint64_t offset) = 0;
    virtual void attention_probs_backward(const float* s, const float* dpd, const float* lse,
                                          kernels::ScalarType out_type, void* ds, long long rows,
                                          long long t, float scale, float p, std::uint64_t seed,
                                          std::uint64_t offset) = 0;
    // softmax.h (cross-entropy's loss and statistics are fp32 for every logits type)
    virtual void softmax_forward(kernels::ScalarType type, const void* x, long long rows,
                                 long long cols, long long q_len, void* y) = 0;
    virtual void softmax_backward(kernels::ScalarType type, const void* y, const void* dy,
                                  long long rows, long long cols, void* dx) = 0;
    virtual void cross_entropy_forward(kernels::ScalarType type, const void* logits,
                                       const int* targets, long long rows, long long cols,
                                       int ignore_index, float* row_lse, float* row_loss,
                                       float* loss, float* inv_count) = 0;
    virtual void cross_entropy_backward(kernels::ScalarType type, const void* logits,
                                        const int* targets, const float* row_lse,
                                        const float* inv_count, const float* dloss,
                                        long long rows, long long cols, int ignore_index,
                                        void* dlogits) = 0;
    // embedding.h
    virtual void embedding_forward(kernels::ScalarType type, const void* weight, const int* ids,
                                   long long n, long long dim, long long vocab, void* out) = 0;
    virtual std::size_t embedding_backward_workspace_bytes(long long n) = 0;
    virtual void embedding_backward(kernels::ScalarType type, const void* dout, const int* ids,
                                    long long n, long long dim, long long vocab, void* dweight,
                                    void* workspace) = 0;
    // layout.h
    virtual void permute(const void* in, void* out, int element_bytes, long long n,
                         const kernels::PermuteParams& p) = 0;
    // norm.h
    virtual void norm_forward(const kernels::NormForwardArgs& args) = 0;
    virtual std::size_t norm_backward_workspace_bytes(const kernels::NormBackwardArgs& args) = 0;
    virtual void norm_backward(const kernels::NormBackwardArgs& args) = 0;
    // optim.h
    virtual void adamw_step_f32(float* p, const float* g, float* m, float* v, long long n,
                                const kernels::AdamWStep& s) = 0;
    // matmul.h
    virtual void set_tf32(bool enabled) = 0;
    virtual void gemm(kernels::ScalarType ab_type, kernels::ScalarType c_type, bool trans_a,
                      bool trans_b, long long m, long long n, long long k, float alpha,
                      const void* a, long long stride_a, const void* b, long long stride_b,
                      float beta, void* c, long long stride_c, long long batch) = 0;
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
