// kernels/attention.h: the row-wise middle of causal self-attention, for core/ops/attention.cpp
// (which does the matrix products with cuBLAS). Scores S are (rows = heads * T, T), row r being
// query i = r % T of its head; query i sees keys j <= i. With s = scale = 1/sqrt(D), p the dropout
// probability and m_rj = keep(seed, offset + r * T + j, p) (kernels/philox.h):
//
//   forward:  lse_r = log sum_{j<=i} exp(s S_rj)
//             P_rj  = exp(s S_rj - lse_r)            (0 for j > i)
//             Pd_rj = m_rj P_rj / (1 - p)            the dropped-out probabilities, O = Pd V
//   backward, given dPd = dO V^T (and the same S, recomputed as Q K^T):
//             dP_rj = m_rj dPd_rj / (1 - p)
//             dS_rj = s P_rj (dP_rj - sum_k dP_rk P_rk)
//   where sum_k dP_rk P_rk = sum_k dPd_rk Pd_rk, so nothing of (T, T) size is kept between the
//   forward and the backward: only lse (one float per row).
// Precision: S, dPd and lse are fp32 whatever the inputs' type (the score GEMMs write fp32 even from
// bf16 q and k, as flash attention keeps its scores); Pd and dS, the operands of the next GEMMs,
// are stored in `out_type` (f32, bf16 or f16).
#pragma once

#include <cstdint>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

// Pd (of out_type) from S. compute_lse: the forward (writes lse); else lse is read (the
// backward's recompute). s and pd may be the same buffer when out_type is f32 (each row is read
// before it is written).
void attention_probs(const float* s, ScalarType out_type, void* pd, float* lse, bool compute_lse,
                     long long rows, long long t, float scale, float p, std::uint64_t seed,
                     std::uint64_t offset);
// dS (of out_type) from S, dPd and lse. ds may be s itself when out_type is f32.
void attention_probs_backward(const float* s, const float* dpd, const float* lse,
                              ScalarType out_type, void* ds, long long rows, long long t,
                              float scale, float p, std::uint64_t seed, std::uint64_t offset);

}  // namespace fg::kernels
