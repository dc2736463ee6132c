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

    void binary(k::BinaryOp op, k::ScalarType type, const void* a, k::Broadcast sa,
                const void* b, k::Broadcast sb, void* out, long long n) override {
        k::binary(op, type, a, sa, b, sb, out, n);
    }
    void scale(k::ScalarType type, const void* x, float alpha, void* y, long long n) override {
        k::scale(type, x, alpha, y, n);
    }
    void rsqrt(k::ScalarType type, const void* x, void* y, long long n) override {
        k::rsqrt(type, x, y, n);
    }
    void gelu_forward(k::ScalarType type, const void* x, void* y, long long n) override {
        k::gelu_forward(type, x, y, n);
    }
    void gelu_backward(k::ScalarType type, const void* x, const void* dy, void* dx,
                       long long n) override {
        k::gelu_backward(type, x, dy, dx, n);
    }
    void dropout(k::ScalarType type, const void* in, void* out, long long n, float p,
                 unsigned long long seed, unsigned long long offset) override {
        k::dropout(type, in, out, n, p, seed, offset);
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
    void row_sum(k::ScalarType type, const void* x, long long rows, long long cols, float alpha,
                 void* out) override {
        k::row_sum(type, x, rows, cols, alpha, out);
    }
    std::size_t column_sum_workspace_bytes(long long rows, long long cols) override {
        return k::column_sum_workspace_bytes(rows, cols);
    }
    void column_sum(k::ScalarType type, const void* x, long long rows, long long cols, void* out,
                    void* workspace) override {
        k::column_sum(type, x, rows, cols, out, workspace);
    }
    std::size_t total_sum_workspace_bytes(long long n) override {
        return k::total_sum_workspace_bytes(n);
    }
    void total_sum(k::ScalarType type, const void* x, long long n, float alpha, void* out,
                   void* workspace) override {
        k::total_sum(type, x, n, alpha, out, workspace);
    }
    void attention_probs(const float* s, k::ScalarType out_type, void* pd, float* lse,
                         bool compute_lse, long long rows, long long t, float scale, float p,
                         std::uint64_t seed, std::uint64_t offset) override {
        k::attention_probs(s, out_type, pd, lse, compute_lse, rows, t, scale, p, seed, offset);
    }
    void attention_probs_backward(const float* s, const float* dpd, const float* lse,
                                  k::ScalarType out_type, void* ds, long long rows, long long t,
                                  float scale, float p, std::uint64_t seed,
                                  std::uint64_t offset) override {
        k::attention_probs_backward(s, dpd, lse, out_type, ds, rows, t, scale, p, seed, offset);
    }
    void softmax_forward(k::ScalarType type, const void* x, long long rows, long long cols,
                         long long q_len, void* y) override {
        k::softmax_forward(type, x, rows, cols, q_len, y);
    }
    void softmax_backward(k::ScalarType type, const void* y, const void* dy, long long rows,
                          long long cols, void* dx) override {
        k::softmax_backward(type, y, dy, rows, cols, dx);
    }
    void cross_entropy_forward(k::ScalarType type, const void* logits, const int* targets,
                               long long rows, long long cols, int ignore_index, float* row_lse,
                               float* row_loss, float* loss, float* inv_count) override {
        k::cross_entropy_forward(type, logits, targets, rows, cols, ignore_index, row_lse,
                                 row_loss, loss, inv_count);
    }
    void cross_entropy_backward(k::ScalarType type, const void* logits, const int* targets,
                                const float* row_lse, const float* inv_count, const float* dloss,
                                long long rows, long long cols, int ignore_index,
                                void* dlogits) override {
        k::cross_entropy_backward(type, logits, targets, row_lse, inv_count, dloss, rows, cols,
                                  ignore_index, dlogits);
    }
    void embedding_forward(k::ScalarType type, const void* weight, const int* ids, long long n,
                           long long dim, long long vocab, void* out) override {
        k::embedding_forward(type, weight, ids, n, dim, vocab, out);
    }
    std::size_t embedding_backward_workspace_bytes(long long n) override {
        return k::embedding_backward_workspace_bytes(n);
    }
    void embedding_backward(k::ScalarType type, const void* dout, const int* ids, long long n,
                            long long dim, long long vocab, void* dweight,
                            void* workspace) override {
        k::embedding_backward(type, dout, ids, n, dim, vocab, dweight, workspace);
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
    void gemm(k::ScalarType ab_type, k::ScalarType c_type, bool trans_a, bool trans_b,
              long long m, long long n, long long kk, float alpha, const void* a,
              long long stride_a, const void* b, long long stride_b, float beta, void* c,
              long long stride_c, long long batch) override {
        k::gemm(ab_type, c_type, trans_a, trans_b, m, n, kk, alpha, a, stride_a, b, stride_b,
                beta, c, stride_c, batch);
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
