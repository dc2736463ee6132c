// kernels/optim.h: the fused AdamW step for one f32 parameter tensor (one kernel reads p, g, m, v
// once and writes p, m, v once), in PyTorch's order of operations so the two agree to rounding:
//   p = p * (1 - lr * wd)                         (decoupled weight decay; wd = 0 for no decay)
//   m = m + (1 - beta1) * (g - m)
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t). Every factor is computed
// once on the host (in float), so the device does exactly the host reference's operations.
#pragma once

namespace fg::kernels {

struct AdamWStep {
    float decay;            // 1 - lr * weight_decay
    float one_minus_beta1;  // 1 - beta1
    float beta2;
    float one_minus_beta2;  // 1 - beta2
    float eps;
    float step_size;  // lr / (1 - beta1^t)
    float bc2_sqrt;   // sqrt(1 - beta2^t)
};

void adamw_step_f32(float* p, const float* g, float* m, float* v, long long n, const AdamWStep& s);

}  // namespace fg::kernels
