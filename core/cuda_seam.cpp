// core/cuda_seam.cpp: the seam in a CUDA build (see cuda_backend.h): forwards each call to the
// kernels library, and turns device-side error records into fg::Error at synchronisations.
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/runtime.h"
#include "kernels/attention.h"
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
    CudaDeviceInfo device_info() override {
        const k::DeviceInfo& d = k::device_info();
        return CudaDeviceInfo{d.name, d.sm_count, d.l2_bytes, d.total_bytes};
    }
    void* malloc(std::size_t bytes) override { return k::device_malloc(bytes); }
    void free(void* ptr) override { k::device_free(ptr); }
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

    void binary_f32(k::BinaryOp op, const float* a, k::Broadcast sa, const float* b,
                    k::Broadcast sb, float* out, long long n) override {
        k::binary_f32(op, a, sa, b, sb, out, n);
    }
    void scale_f32(const float* x, float alpha, float* y, long long n) override {
        k::scale_f32(x, alpha, y, n);
    }
    void rsqrt_f32(const float* x, float* y, long long n) override { k::rsqrt_f32(x, y, n); }
    void gelu_forward_f32(const float* x, float* y, long long n) override {
        k::gelu_forward_f32(x, y, n);
    }
    void gelu_backward_f32(const float* x, const float* dy, float* dx, long long n) override {
        k::gelu_backward_f32(x, dy, dx, n);
    }
    void dropout_f32(const float* in, float* out, long long n, float p, unsigned long long seed,
                     unsigned long long offset) override {
        k::dropout_f32(in, out, n, p, seed, offset);
    }
    void fill(void* dst, k::ScalarType type, double value, long long n) override {
        k::fill(dst, type, value, n);
    }
    void cast(const void* src, k::ScalarType from, void* dst, k::ScalarType to,
              long long n) override {
        k::cast(src, from, dst, to, n);
    }
    void random_uniform_f32(float* out, long long n, unsigned long long seed,
                            unsigned long long offset) override {
        k::random_uniform_f32(out, n, seed, offset);
    }
    void random_normal_f32(float* out, long long n, float mean, float stddev,
                           unsigned long long seed, unsigned long long offset) override {
        k::random_normal_f32(out, n, mean, stddev, seed, offset);
    }
    void random_bernoulli_f32(float* out, long long n, float p, unsigned long long seed,
                              unsigned long long offset) override {
        k::random_bernoulli_f32(out, n, p, seed, offset);
    }
    void row_sum_f32(const float* x, long long rows, long long cols, float alpha,
                     float* out) override {
        k::row_sum_f32(x, rows, cols, alpha, out);
    }
    std::size_t column_sum_workspace_bytes(long long rows, long long cols) override {
        return k::column_sum_workspace_bytes(rows, cols);
    }
    void column_sum_f32(const float* x, long long rows, long long cols, float* out,
                        void* workspace) override {
        k::column_sum_f32(x, rows, cols, out, workspace);
    }
    std::size_t total_sum_workspace_bytes(long long n) override {
        return k::total_sum_workspace_bytes(n);
    }
    void total_sum_f32(const float* x, long long n, float alpha, float* out,
                       void* workspace) override {
        k::total_sum_f32(x, n, alpha, out, workspace);
    }
    void attention_probs_f32(const float* s, float* pd, float* lse, bool compute_lse,
                             long long rows, long long t, float scale, float p, std::uint64_t seed,
                             std::uint64_t offset) override {
        k::attention_probs_f32(s, pd, lse, compute_lse, rows, t, scale, p, seed, offset);
    }
    void attention_probs_backward_f32(float* s_to_ds, const float* dpd, const float* lse,
                                      long long rows, long long t, float scale, float p,
                                      std::uint64_t seed, std::uint64_t offset) override {
        k::attention_probs_backward_f32(s_to_ds, dpd, lse, rows, t, scale, p, seed, offset);
    }
    void softmax_forward_f32(const float* x, long long rows, long long cols, long long q_len,
                             float* y) override {
        k::softmax_forward_f32(x, rows, cols, q_len, y);
    }
    void softmax_backward_f32(const float* y, const float* dy, long long rows, long long cols,
                              float* dx) override {
        k::softmax_backward_f32(y, dy, rows, cols, dx);
    }
    void cross_entropy_forward_f32(const float* logits, const int* targets, long long rows,
                                   long long cols, int ignore_index, float* row_lse,
                                   float* row_loss, float* loss, float* inv_count) override {
        k::cross_entropy_forward_f32(logits, targets, rows, cols, ignore_index, row_lse,
                                     row_loss, loss, inv_count);
    }
    void cross_entropy_backward_f32(const float* logits, const int* targets,
                                    const float* row_lse, const float* inv_count,
                                    const float* dloss, long long rows, long long cols,
                                    int ignore_index, float* dlogits) override {
        k::cross_entropy_backward_f32(logits, targets, row_lse, inv_count, dloss, rows, cols,
                                      ignore_index, dlogits);
    }
    void embedding_forward_f32(const float* weight, const int* ids, long long n, long long dim,
                               long long vocab, float* out) override {
        k::embedding_forward_f32(weight, ids, n, dim, vocab, out);
    }
    std::size_t embedding_backward_workspace_bytes(long long n) override {
        return k::embedding_backward_workspace_bytes(n);
    }
    void embedding_backward_f32(const float* dout, const int* ids, long long n, long long dim,
                                long long vocab, float* dweight, void* workspace) override {
        k::embedding_backward_f32(dout, ids, n, dim, vocab, dweight, workspace);
    }
    void permute(const void* in, void* out, int element_bytes, long long n,
                 const k::PermuteParams& p) override {
        k::permute(in, out, element_bytes, n, p);
    }
    void norm_forward(const k::NormForwardArgs& args) override { k::norm_forward(args); }
    std::size_t norm_backward_workspace_bytes(const k::NormBackwardArgs& args) override {
        return k::norm_backward_workspace_bytes(args);
    }
    void norm_backward(const k::NormBackwardArgs& args) override { k::norm_backward(args); }
    void adamw_step_f32(float* p, const float* g, float* m, float* v, long long n,
                        const k::AdamWStep& s) override {
        k::adamw_step_f32(p, g, m, v, n, s);
    }
    void set_tf32(bool enabled) override { k::set_tf32(enabled); }
    void gemm_f32(bool trans_a, bool trans_b, long long m, long long n, long long kk, float alpha,
                  const float* a, long long stride_a, const float* b, long long stride_b,
                  float beta, float* c, long long stride_c, long long batch) override {
        k::gemm_f32(trans_a, trans_b, m, n, kk, alpha, a, stride_a, b, stride_b, beta, c,
                    stride_c, batch);
    }
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
