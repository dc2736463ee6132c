// kernels/layout.cu: see layout.h. One thread per output element, writes coalesced, reads
// gathered; correctness first (head splits in attention are a small share of a step).
#include <cstdint>

#include "device_error.cuh"
#include "layout.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

template <typename T>
__global__ void permute_kernel(const T* in, T* out, long long n, PermuteParams p) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, src = 0;
        for (int k = p.ndim - 1; k >= 0; --k) {
            long long idx = rest % p.out_shape[k];
            rest /= p.out_shape[k];
            src += idx * p.in_stride[k];
        }
        out[i] = in[src];
    }
}

}  // namespace

void permute(const void* in, void* out, int element_bytes, long long n, const PermuteParams& p) {
    if (n == 0) return;
    int grid = grid_for(n, 256);
    switch (element_bytes) {
        case 2:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint16_t*)in,
                                                       (std::uint16_t*)out, n, p);
            break;
        case 4:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint32_t*)in,
                                                       (std::uint32_t*)out, n, p);
            break;
        default:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint64_t*)in,
                                                       (std::uint64_t*)out, n, p);
            break;
    }
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
