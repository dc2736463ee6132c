// kernels/softmax.h: row softmax and fused softmax cross-entropy, x viewed as (R, C), of f32,
// bf16 or f16 storage (`type`); every max, exponential and sum is computed in fp32.
//
// softmax:  y[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r) over the unmasked j.
//   Causal (q_len > 0): row r is query i = r % q_len and sees keys j <= i + (C - q_len); masked
//   entries get y = 0. Backward: dx = y * (dy - sum_j dy_j y_j), zero where masked. y, dy and dx
//   are of `type`.
// cross-entropy: loss = mean over rows with target != ignore_index of lse_r - x[r, t_r], where
//   lse_r = m_r + log sum_j exp(x[r, j] - m_r). Backward: dx = dloss / count * (softmax - onehot).
//   The loss, its gradient and the per-row statistics are fp32 whatever the logits' type (as
//   PyTorch's autocast computes the loss in fp32); dlogits is of the logits' type.
//   A target outside [0, C) is reported through the device error word (runtime.h).
// The one-pass form writes dx in the forward, for a dloss given in advance (below).
#pragma once

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

void softmax_forward(ScalarType type, const void* x, long long rows, long long cols,
                     long long q_len, void* y);
void softmax_backward(ScalarType type, const void* y, const void* dy, long long rows,
                      long long cols, void* dx);

// row_lse (rows) and inv_count (1) are kept for the backward; row_loss (rows) is scratch.
void cross_entropy_forward(ScalarType type, const void* logits, const int* targets,
                           long long rows, long long cols, int ignore_index, float* row_lse,
                           float* row_loss, float* loss, float* inv_count);
// dloss points at the scalar gradient of the loss (on the device: no host synchronisation).
void cross_entropy_backward(ScalarType type, const void* logits, const int* targets,
                            const float* row_lse, const float* inv_count, const float* dloss,
                            long long rows, long long cols, int ignore_index, void* dlogits);

// One pass for a training step's loss, where the logits are not needed after it: the forward
// above and the backward's dlogits for dloss = expected_dloss (the gradient the caller expects
// the loss to get), each row read once and kept in shared memory. dlogits may be the logits.
// Only where cross_entropy_one_pass_fits (a row of `cols` values in one block's shared memory).
// Its backward, cross_entropy_one_pass_backward, changes nothing where the loss's gradient *dloss
// is expected_dloss, and otherwise scales the first `count` values of dlogits by dloss / expected_dloss.
bool cross_entropy_one_pass_fits(ScalarType type, long long cols);
void cross_entropy_one_pass(ScalarType type, const void* logits, const int* targets,
                            long long rows, long long cols, int ignore_index,
                            float expected_dloss, float* row_loss, float* loss, float* inv_count,
                            void* dlogits);
void cross_entropy_one_pass_backward(ScalarType type, const float* dloss, float expected_dloss,
                                     long long count, void* dlogits);

}  // namespace fg::kernels
