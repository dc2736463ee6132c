// kernels/adamw.h: the optimizer's kernels, each launched over a whole list of f32 tensors at
// once (a "multi-tensor" launch: the list is a kernel parameter, so one launch updates up to
// kMaxTensorsPerLaunch tensors and nothing is uploaded; a captured graph keeps the list).
//
// The gradients' global norm and the clip factor, without reading anything back to the host:
//   norm = sqrt(sum over every tensor and element of g^2)   (fp32 partial sums, added in fp64)
//   coef = min(1, max_norm / (norm + 1e-6)), or 1 when max_norm <= 0 (no clipping)
//
// The fused AdamW step, PyTorch's order of operations so the two agree to rounding, with the
// gradient first multiplied by the clip factor (read on the device):
//   g = g * coef
//   p = p * (1 - lr * wd)                         (decoupled weight decay; wd = 0 for no decay)
//   m = m + (1 - beta1) * (g - m)
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t). Every factor is computed
// once on the host and kept as a float (the bias corrections computed in double, then rounded), so
// the device does exactly the operations of a host AdamW that computes the same factors, and the
// two produce the same bits.
//
// A captured step (kernels/captured_step.h) reads the step's factors on the device:
// adamw_multi_tensor_on_device.
#pragma once

namespace fg::kernels {

constexpr int kMaxTensorsPerLaunch = 24;
// Blocks of one sum-of-squares launch: `partials` must hold launches * kSumSquaresBlocks floats,
// launches = ceil(count / kMaxTensorsPerLaunch).
// Enough 256-thread blocks to keep many loads in flight on every SM of a large GPU.
constexpr int kSumSquaresBlocks = 1024;

// Writes the norm and the clip factor (f32 device scalars) of the `count` gradients grads[i] of
// sizes[i] elements (host arrays of device pointers).
void grad_norm_clip(const float* const* grads, const long long* sizes, int count, float* partials,
                    float max_norm, float* norm, float* coef);

struct AdamWStep {
    float decay;            // 1 - lr * weight_decay
    float one_minus_beta1;  // 1 - beta1
    float beta2;
    float one_minus_beta2;  // 1 - beta2
    float eps;
    float step_size;  // lr / (1 - beta1^t)
    float bc2_sqrt;   // sqrt(1 - beta2^t)
};

// One parameter tensor of an AdamW step: its values, gradient, moments, size, and whether it
// decays (the `decayed` factors) or not (`plain`, whose decay is 1).
struct AdamWTensor {
    float* p;
    const float* g;
    float* m;
    float* v;
    long long n;
    bool decay;
};

// The AdamW step of `count` tensors (a host array), each gradient scaled by *coef (a device
// scalar; null: 1).
void adamw_multi_tensor(const AdamWTensor* tensors, int count, const AdamWStep& decayed,
                        const AdamWStep& plain, const float* coef);

// The AdamW step with the factors read on the device, current[0] (decayed) and current[1]
// (plain), changing nothing while *skip is set.
void adamw_multi_tensor_on_device(const AdamWTensor* tensors, int count, const AdamWStep* current,
                                  const float* coef, const int* skip);

}  // namespace fg::kernels
