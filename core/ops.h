// core/ops.h: every differentiable operation fusegrad has. Each family lives in one file under
// core/ops/ with its forward, its backward and its plain CPU reference; on CUDA tensors it calls a
// kernel through the seam (cuda_backend.h). Ops take f32, bf16 or f16 on both devices (16-bit
// values are computed in float and rounded once; sums and statistics are fp32) and f64 on the
// CPU; an op's result has its inputs' dtype, except cross_entropy, whose loss is f32 for 16-bit
// logits. Shape letters: B batch, T time, C channels, H heads, D head size, V vocabulary, M/N/K
// matrix sizes.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/norm.h"  // NormReduction (a plain enum)
#include "tensor.h"

namespace fg {

// ---- elementwise (ops/elementwise.cpp) ------------------------------------------------------
// a (op) b broadcast by NumPy's rules (shapes right-aligned, a 1 stretches), each operand's non-1
// dims one contiguous block of the result's: a (C) bias over a (B, T, C) activation, a (R, 1) row
// statistic over (R, C). The result has the broadcast shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);  // alpha * x
Tensor rsqrt(const Tensor& x);                // 1 / sqrt(x)
// In place, not recorded: dst += src (same shape). For gradient accumulation and optimizers.
void add_(Tensor& dst, const Tensor& src);
// In place, not recorded: dst = src (same shape, dtype and device).
void copy_(Tensor& dst, const Tensor& src);
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& x, double alpha) { return scale(x, alpha); }

// ---- activations (ops/activation.cpp) --------------------------------------------------------
// GELU. exact: x * Phi(x), Phi the standard normal CDF (PyTorch's approximate='none');
// tanh: x * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2, GPT-2's (approximate='tanh').
enum class GeluForm { exact, tanh };
Tensor gelu(const Tensor& x, GeluForm form = GeluForm::exact);
// Inverted dropout with probability p, masks from the seeded Philox stream (random.h); identity
// when p == 0 or when `training` is false.
Tensor dropout(const Tensor& x, double p, bool training = true);

// ---- reductions (ops/reduce.cpp) -------------------------------------------------------------
Tensor sum(const Tensor& x);       // all elements -> shape ()
Tensor mean(const Tensor& x);      // all elements -> shape ()
Tensor sum_last(const Tensor& x);  // (..., N) -> (...)
Tensor mean_last(const Tensor& x); // (..., N) -> (...)

// ---- matrix products (ops/matmul.cpp) --------------------------------------------------------
// op(a) @ op(b) with op = transpose of the last two dims when the flag is set.
// a (..., M, K) and b (..., K, N) with equal leading dims (batched), or, without trans_a, b 2-D,
// which applies to every leading index of a (a Linear layer: x (B, T, C) @ W^T with W (out, C),
// trans_b = true).
// options.tf32: f32 CUDA products on TF32 tensor cores (faster, about 1e-3 relative error; the
// backward's products too); 16-bit inputs and the CPU ignore it. options.autotune: a single
// (unbatched) 16-bit CUDA product of a call that records a backward (a training step; the
// backward's products too) runs cuBLASLt's fastest algorithm for its shape, timed at the shape's
// first call, instead of its heuristic's first guess (kernels/linear_lt.h: faster, but another
// process may pick another one and round differently); f32, the fused attention's products,
// forward-only calls and the CPU ignore it.
struct MatmulOptions {
    bool tf32 = false;
    bool autotune = false;
};
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              const MatmulOptions& options = {});

// ---- a linear layer's product (ops/linear.cpp) -------------------------------------------------
// y = x @ weight^T + bias (bias may be undefined), x (..., K), weight (N, K), bias (N), computed
// in x's dtype: parameters of another float type take part as rounded copies and get their
// gradients in their own type. It is cast(weight) -> matmul -> add(cast(bias)); for 16-bit CUDA
// inputs with f32 parameters and a bias, one cuBLASLt product with the bias in its epilogue, and
// in the backward the weight gradient written in f32 by its product and the bias gradient summed
// in f32 from dy's 16-bit values (column_sum).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const MatmulOptions& options = {});
// An MLP's two layers: linear(gelu(linear(x, w1, b1), form), w2, b2), w1 (H, K), w2 (N, H). With
// the tanh form under linear's conditions for both layers, the GELU and its gradient ride in
// cuBLASLt's epilogues too (no GELU kernels); elsewhere it is that composition.
Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
           const Tensor& b2, GeluForm form, const MatmulOptions& options = {});
// Why cuBLASLt refused the first linear call it refused (that call, and those like it, ran as the
// composition: the same values to rounding, more kernels), or "" while it has refused none.
std::string linear_epilogue_failure();

// ---- softmax and loss (ops/softmax.cpp) ------------------------------------------------------
// Softmax over the last dim. causal: x is (..., Tq, Tk) and query i sees keys j <= i + Tk - Tq.
Tensor softmax(const Tensor& x, bool causal = false);
// Mean over rows of -log softmax(logits)[target]: logits (..., V), targets i32 (...). Rows whose
// target is ignore_index are left out of the mean. Logits handed over (a temporary, or moved in;
// not a view of one, whose storage the temporary still holds) on CUDA, where a backward will
// follow (grad mode, logits needing a gradient) and a row fits one block's shared memory: the
// forward reads each row once and writes the logits' gradient over them for a loss gradient of
// expected_dloss (a training step's 1 / micro-batches). The backward then does nothing if the
// gradient that arrives is exactly that float, and otherwise rescales the buffer (a pass more than
// the two-pass form, rounded twice). Logits the caller keeps are left as they are.
Tensor cross_entropy(Tensor logits, const Tensor& targets, int ignore_index = -1,
                     float expected_dloss = 1.0f);

// ---- embedding (ops/embedding.cpp) ----------------------------------------------------------
// weight (V, C), ids i32 of any shape S -> S + (C). Deterministic backward.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// ---- attention (ops/attention.cpp; kernels/attention.cu, kernels/attention_cudnn.cpp) --------
// Which kernels causal_attention runs (a config's kernels.attention, set on CausalSelfAttention):
//   automatic  cuDNN's fused flash attention (kernels/attention_cudnn.h) where it can run: CUDA,
//              bf16 or f16, head size D a multiple of 8 up to 128, a build with cuDNN on an
//              Ampere or newer GPU, a call that records a backward (training: a forward-only
//              call, as in sampling where T grows at every token, would build a cuDNN graph for
//              each new T); else fused;
//   cudnn      cuDNN's, and an error saying why where it cannot run;
//   fused      fusegrad's own kernels (kernels/attention.h) always: the only path for f32 and the
//              CPU, and the reference the cuDNN path is tested against.
enum class AttentionBackend { automatic, cudnn, fused };
struct AttentionOptions {
    AttentionBackend backend = AttentionBackend::automatic;
    bool tf32 = false;  // the fused path's f32 products on TF32 tensor cores (MatmulOptions)
};

// Causal self-attention of every head, fused so that nothing of (T, T) size is kept for the
// backward: qkv (3, B, H, T, D) holds q, k, v; returns (B, H, T, D)
//   out = dropout(softmax(q k^T / sqrt(D), causal), p) v
// with dropout only when training and p > 0. Fused kernels: the mask is drawn from
// default_generator() exactly as dropout() on the (B, H, T, T) probabilities would (the same
// counters); the backward recomputes q k^T and the probabilities from one saved log-sum-exp per
// row. cuDNN: the mask is cuDNN's own Philox stream, seeded from the same generator (the same
// seed and offset are claimed, so the draws after it do not depend on the backend); nothing of
// (T, T) size exists at all, and the output is saved too (its backward needs it).
Tensor causal_attention(const Tensor& qkv, double dropout_p, bool training = true,
                        const AttentionOptions& options = {});
// The same from the layout a fused QKV projection writes and to the one the output projection
// reads: qkv (B, T, 3 C) with C = heads * D (q, then k, then v, each with its heads side by
// side), returns (B, T, C). cuDNN reads and writes these layouts where they are (strides), so
// nothing is permuted; elsewhere this is causal_attention between the permutes to and from
// (3, B, H, T, D), with the same result and the same dropout draws.
Tensor causal_self_attention(const Tensor& qkv, std::int64_t heads, double dropout_p,
                             bool training = true, const AttentionOptions& options = {});
// Why cuDNN refused the first of causal_self_attention's calls on the packed layouts that it
// refused (such calls run it between permutes: the same result, more copies), or "" while it has
// refused none, for a log.
std::string packed_cudnn_attention_failure();
// A call of causal attention, as the choice of its kernels sees it.
struct AttentionCall {
    Device device = Device::cpu;
    DType dtype = DType::f32;
    std::int64_t head_dim = 0;
    std::int64_t seq_len = 2;      // T
    bool records_backward = true;  // training (a forward-only call: evaluation, sampling)
    bool aligned = true;           // qkv's data on a 16-byte boundary
};
// Why cuDNN's fused attention cannot run `call`, or "" when it can (which asks the GPU, and
// starts cuDNN, the first time): CUDA, bf16 or f16, the head sizes cuDNN takes, aligned data,
// and T >= 2 for a call that records a backward.
std::string cudnn_attention_unsupported(const AttentionCall& call);
// Whether causal attention under `backend` runs cuDNN's kernels for `call` (the rule under
// AttentionBackend above; with cudnn, a call cuDNN cannot run is the op's error). The op and
// anything that plans for it (a memory estimate, a report of the build) ask this one function.
bool attention_runs_cudnn(const AttentionCall& call, AttentionBackend backend);

// ---- layout and conversion (ops/layout.cpp) -------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);  // view; one dim may be -1
Tensor slice(const Tensor& x, std::int64_t start, std::int64_t end);  // view of rows of dim 0
Tensor permute(const Tensor& x, const std::vector<int>& order);  // new contiguous tensor
Tensor transpose(const Tensor& x, int dim0, int dim1);           // permute swapping two dims
Tensor cast(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);
// Heads of attention: (B, T, H*D) -> (B, H, T, D) and back.
Tensor split_heads(const Tensor& x, std::int64_t heads);
Tensor merge_heads(const Tensor& x);

// ---- normalisation (ops/norm.cpp; fused CUDA kernels in kernels/norm/) ----------------------
using kernels::NormReduction;  // automatic | locked (a) | grid (b): how dw/db sum across rows
struct NormOptions {
    double eps = 1e-5;
    bool zero_centered = false;  // scale by (1 + w): the weight is stored as its offset from 1
    NormReduction reduction = NormReduction::automatic;
    // The CUDA kernels' launch tuning (kernels/norm.h), for tests and benchmarks that force a
    // path; null: the measured defaults. It must outlive the backward.
    const kernels::NormTuning* tuning = nullptr;
};
// Over the last dim N of x (..., N). weight and bias: (N) or undefined (none). x is f32, bf16 or
// f16 (or f64 on the CPU, the reference), weight and bias f32 or x's dtype.
Tensor rms_norm(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                const NormOptions& options = {});
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                  const NormOptions& options = {});
// Fused residual add: normalises h = x + residual and returns both (y, h).
struct NormResidualResult {
    Tensor y, h;
};
NormResidualResult rms_norm_residual(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                     const Tensor& bias = Tensor(), const NormOptions& options = {});
NormResidualResult layer_norm_residual(const Tensor& x, const Tensor& residual,
                                       const Tensor& weight, const Tensor& bias = Tensor(),
                                       const NormOptions& options = {});

}  // namespace fg
