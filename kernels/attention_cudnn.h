// kernels/attention_cudnn.h: causal self-attention by cuDNN's fused flash-attention kernels
// ("scaled dot-product attention", SDPA, built with the cuDNN frontend's graph API), bf16 or f16
// on tensor cores. For core/ops/attention.cpp, which uses them where they can run and a backward
// follows (or wherever they can run when asked for), and kernels/attention.h's otherwise. The same
// math per head, with Q, K, V (T, D), s = scale (1/sqrt(D)), p the dropout probability and m_ij in
// {0, 1} cuDNN's dropout mask (its own Philox stream, drawn from (seed, offset): not the mask
// kernels/philox.h would draw):
//
//   forward:  S = Q K^T;  lse_i = log sum_{j<=i} exp(s S_ij)       (the "stats", fp32)
//             P_ij = exp(s S_ij - lse_i) for j <= i, else 0         (causal)
//             Pd_ij = m_ij P_ij / (1 - p);  O = Pd V
//   backward, given dO (and lse and O from the forward):
//             dV = Pd^T dO;  dPd = dO V^T;  dP_ij = m_ij dPd_ij / (1 - p)
//             dS_ij = s P_ij (dP_ij - sum_k dP_ik P_ik)  where  sum_k dP_ik P_ik = sum_d dO_id O_id
//             dQ = dS K;  dK = dS^T Q
//
// Flash attention's point: nothing of size (T, T) touches global memory, forward or backward.
// Each block of queries streams the keys and values through shared memory, keeps its scores S,
// P and the running max and sum in registers (fp32), and writes only O and lse; the backward
// recomputes S and P block by block from Q, K and lse, and gets the row sums sum_k dP_ik P_ik
// from dO and O (hence O is an input of the backward). The mask is regenerated from the same
// (seed, offset). Scores, softmax statistics and every product's accumulation are fp32; P and dS
// are rounded to the storage type for the tensor-core products that read them. dQ is summed over
// the key blocks with fp32 atomic adds, so its last bits may vary from run to run (cuDNN's
// deterministic backward would stage dP in a (B, H, T, T) workspace on Hopper: not used).
//
// The graphs (one per shape and strides, type, scale, dropout probability, direction and whether
// the statistics are written) are built on first use and
// cached: building one takes a fraction of a second, running one is a single launch or a few.
// One cuDNN handle, bound to fusegrad's stream (runtime.h). A build without cuDNN (FG_CUDNN,
// cmake/FusegradCudnn.cmake) compiles attention_cudnn_stub.cpp instead: not built, never
// available, and forward/backward throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

// One call. q, k, v are (B, H, T, D) each with element strides stride_b, stride_h, stride_t (the
// last dim contiguous); fusegrad's (3, B, H, T, D) qkv gives q, k, v at offsets 0, BHTD, 2 BHTD
// with strides (H T D, T D, D). dq, dk, dv have the same layout; out and dout are contiguous
// (B, H, T, D) unless out_stride_* say otherwise (below). Pointers 16-byte aligned.
struct CudnnAttentionArgs {
    ScalarType type = ScalarType::bf16;  // q, k, v, out, dout, dq, dk, dv: bf16 or f16
    long long b = 0, h = 0, t = 0, d = 0;
    long long stride_b = 0, stride_h = 0, stride_t = 0;  // of q, k, v (and dq, dk, dv)
    // Of O and dO: 0 for contiguous (B, H, T, D); (T H D, D, H D) for the heads side by side in
    // (B, T, H D), as the output projection reads them.
    long long out_stride_b = 0, out_stride_h = 0, out_stride_t = 0;
    float scale = 1.0f;                  // s
    float p = 0.0f;                      // dropout probability on P, in [0, 1)
    std::uint64_t seed = 0, offset = 0;  // the dropout's Philox stream; the backward needs the same
    const void* q = nullptr;
    const void* k = nullptr;
    const void* v = nullptr;
    void* out = nullptr;         // forward: written; backward: read (the forward's O)
    float* stats = nullptr;      // (B, H, T) lse. Forward: written, or null when no backward
                                 // follows (inference); backward: read
    const void* dout = nullptr;  // backward only
    void* dq = nullptr;
    void* dk = nullptr;
    void* dv = nullptr;
    void* workspace = nullptr;  // cudnn_attention_workspace_bytes(args, backward) bytes
};

// True when this build has cuDNN's attention (FG_CUDNN found cuDNN and its frontend).
bool cudnn_attention_built();
// Why a call of storage `type` with head size `head_dim` cannot run here, or "" when it can: a
// build without cuDNN, cuDNN failing to load or start (its message), a GPU before Ampere (sm_80),
// a type other than bf16 / f16, D not a multiple of 8 or above 128. Starts cuDNN on first use.
std::string cudnn_attention_unsupported(ScalarType type, long long head_dim);
// Device memory the forward (backward = false) or backward needs as `workspace`: cuDNN's own,
// rounded up to 16 bytes, and 16 more for the dropout's seed and offset when p > 0. Builds (and
// caches) the call's graph.
std::size_t cudnn_attention_workspace_bytes(const CudnnAttentionArgs& a, bool backward);
// out (and stats) from q, k, v.
void cudnn_attention_forward(const CudnnAttentionArgs& a);
// dq, dk, dv from q, k, v, out, stats and dout (the forward's args, seed and offset).
void cudnn_attention_backward(const CudnnAttentionArgs& a);

}  // namespace fg::kernels
