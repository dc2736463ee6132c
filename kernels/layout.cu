// kernels/layout.cu: see layout.h. One thread per output unit (an element, or up to 16 bytes of
// a row when the last dim stays last), writes coalesced, reads gathered.
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
    // When the last dim stays last (the usual case: moving heads around), its rows are contiguous
    // on both sides: copy them in units of up to 16 bytes, which divides the index arithmetic
    // and the memory instructions by up to 16 / element_bytes.
    PermuteParams q = p;
    int unit = element_bytes;
    const int last = p.ndim - 1;
    if (p.in_stride[last] == 1) {
        const long long row_bytes = p.out_shape[last] * element_bytes;
        const auto aligned = [&](int bytes) {
            return row_bytes % bytes == 0 && reinterpret_cast<std::uintptr_t>(in) % bytes == 0 &&
                   reinterpret_cast<std::uintptr_t>(out) % bytes == 0;
        };
        for (int bytes : {16, 8, 4})
            if (bytes > unit && aligned(bytes)) {
                unit = bytes;
                break;
            }
        const int per_unit = unit / element_bytes;
        if (per_unit > 1) {
            q.out_shape[last] /= per_unit;
            for (int k = 0; k < last; ++k) q.in_stride[k] /= per_unit;  // multiples of the row
        }
    }
    const long long units = n * element_bytes / unit;
    const int grid = grid_for(units, 256);
    switch (unit) {
        case 2:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint16_t*)in, (std::uint16_t*)out, units, q);
            break;
        case 4:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint32_t*)in, (std::uint32_t*)out, units, q);
            break;
        case 8:
            permute_kernel<<<grid, 256, 0, stream()>>>((const std::uint64_t*)in, (std::uint64_t*)out, units, q);
            break;
        default:
            permute_kernel<<<grid, 256, 0, stream()>>>((const uint4*)in, (uint4*)out, units, q);
            break;
    }
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
