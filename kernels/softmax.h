// kernels/softmax.h: row softmax and fused softmax cross-entropy, f32, x viewed as (R, C).
//
// softmax:  y[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r) over the unmasked j.
//   Causal (q_len > 0): row r is query i = r % q_len and sees keys j <= i + (C - q_len); masked
//   entries get y = 0. Backward: dx = y * (dy - sum_j dy_j y_j), zero where masked.
// cross-entropy: loss = mean over rows with target != ignore_index of lse_r - x[r, t_r], where
//   lse_r = m_r + log sum_j exp(x[r, j] - m_r). Backward: dx = dloss / count * (softmax - onehot).
//   A target outside [0, C) is reported through the device error word (runtime.h).
#pragma once

namespace fg::kernels {

void softmax_forward_f32(const float* x, long long rows, long long cols, long long q_len,
                         float* y);
void softmax_backward_f32(const float* y, const float* dy, long long rows, long long cols,
                          float* dx);

// row_lse (rows) and inv_count (1) are kept for the backward; row_loss (rows) is scratch.
void cross_entropy_forward_f32(const float* logits, const int* targets, long long rows,
                               long long cols, int ignore_index, float* row_lse, float* row_loss,
                               float* loss, float* inv_count);
// dloss points at the scalar gradient of the loss (on the device: no host synchronisation).
void cross_entropy_backward_f32(const float* logits, const int* targets, const float* row_lse,
                                const float* inv_count, const float* dloss, long long rows,
                                long long cols, int ignore_index, float* dlogits);

}  // namespace fg::kernels
