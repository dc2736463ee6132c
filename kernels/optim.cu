// kernels/optim.cu: see optim.h. Grid-strided, one thread per element. The arithmetic is the host
// reference's (train/optim.cpp), written with explicitly rounded operations (no FMA contraction)
// so that both produce the same bits.
#include "device_error.cuh"
#include "optim.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, long long n,
                             AdamWStep s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float grad = g[i];
        float param = __fmul_rn(p[i], s.decay);
        float mi = __fadd_rn(m[i], __fmul_rn(s.one_minus_beta1, __fsub_rn(grad, m[i])));
        float vi = __fadd_rn(__fmul_rn(s.beta2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, grad), grad));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
        p[i] = __fsub_rn(param, __fmul_rn(s.step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

}  // namespace

void adamw_step_f32(float* p, const float* g, float* m, float* v, long long n, const AdamWStep& s) {
    if (n == 0) return;
    adamw_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(p, g, m, v, n, s);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
