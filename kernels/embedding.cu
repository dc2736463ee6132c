// kernels/embedding.cu: see embedding.h. Both kernels are templates over the storage type T of
// the weight and the activations (float, __nv_bfloat16, __half; float_types.cuh): the forward
// copies T values as they are, the backward widens dout to float, sums in float and rounds each
// dweight value once. Workspace layout for the backward, in order: sorted ids (n ints), positions
// (n ints), sorted positions (n ints), CUB's temporary storage (the same for every T).
#include <cub/device/device_radix_sort.cuh>

#include "device_error.cuh"
#include "embedding.h"
#include "float_types.cuh"
#include "runtime.h"

namespace fg::kernels {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(const T* weight, const int* ids, long long dim,
                                         long long vocab, T* out, DeviceErrorRecord* err) {
    long long row = blockIdx.x;
    int id = ids[row];
    T* dst = out + row * dim;
    if (id < 0 || id >= vocab) {
        if (threadIdx.x == 0) report_device_error(err, DeviceErrorCode::embedding_index, id, vocab);
        // NaN: the row must not look fine.
        const T nan_value = from_float<T>(__int_as_float(0x7fc00000));
        for (long long c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = nan_value;
        return;
    }
    const T* src = weight + (long long)id * dim;
    for (long long c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = src[c];
}

__global__ void iota_kernel(int* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = (int)i;
}

// Block (s, tile) owns sorted slot s if it starts a run of equal ids, and columns
// [tile * 128, tile * 128 + 128) of that id's gradient row. Its 8 warps split the run's rows
// (warp w takes rows w, w + 8, ...), each lane 4 columns (lane + 32 j); then the 8 partial sums
// are added in warp order. The same shape every time: the result is deterministic.
constexpr int kBackwardWarps = 8, kColsPerLane = 4, kTileCols = 32 * kColsPerLane;

template <typename T>
__global__ void embedding_backward_kernel(const T* dout, const int* sorted_ids,
                                          const int* sorted_pos, long long n, long long dim,
                                          long long vocab, T* dweight) {
    __shared__ float partial[kBackwardWarps][kTileCols];
    const long long s = blockIdx.x;
    const int id = sorted_ids[s];
    if ((s > 0 && sorted_ids[s - 1] == id) || id < 0 || id >= vocab) return;  // block-uniform
    long long end = s + 1;
    while (end < n && sorted_ids[end] == id) ++end;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long col0 = blockIdx.y * (long long)kTileCols;
    float acc[kColsPerLane] = {};
    for (long long k = s + warp; k < end; k += kBackwardWarps) {
        const T* row = dout + (long long)sorted_pos[k] * dim + col0;
        for (int j = 0; j < kColsPerLane; ++j)
            if (col0 + lane + 32 * j < dim) acc[j] += to_float(row[lane + 32 * j]);
    }
    for (int j = 0; j < kColsPerLane; ++j) partial[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    for (int c = threadIdx.x; c < kTileCols; c += blockDim.x) {
        if (col0 + c >= dim) continue;
        float total = 0.0f;
        for (int w = 0; w < kBackwardWarps; ++w) total += partial[w][c];
        dweight[(long long)id * dim + col0 + c] = from_float<T>(total);
    }
}

int threads_for(long long dim) { return dim >= 128 ? 128 : 32; }

std::size_t cub_temp_bytes(long long n) {
    std::size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int*)nullptr, (int*)nullptr,
                                    (const int*)nullptr, (int*)nullptr, (int)n);
    return bytes;
}

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void embedding_forward(ScalarType type, const void* weight, const int* ids, long long n,
                       long long dim, long long vocab, void* out) {
    with_float_type(type, "embedding_forward", [&](auto tag) {
        using T = decltype(tag);
        if (n == 0 || dim == 0) return;
        embedding_forward_kernel<T><<<(unsigned)n, threads_for(dim), 0, stream()>>>(
            static_cast<const T*>(weight), ids, dim, vocab, static_cast<T*>(out),
            device_error_record());
        FG_LAUNCH_CHECK();
    });
}

std::size_t embedding_backward_workspace_bytes(long long n) {
    return 3 * round_up(sizeof(int) * (std::size_t)n) + round_up(cub_temp_bytes(n));
}

void embedding_backward(ScalarType type, const void* dout, const int* ids, long long n,
                        long long dim, long long vocab, void* dweight, void* workspace) {
    with_float_type(type, "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        // Rows no id hits stay 0 (all-zero bytes are +0 in f32, bf16 and f16 alike).
        memset_device(dweight, 0, sizeof(T) * (std::size_t)(vocab * dim));
        if (n == 0 || dim == 0) return;
        char* base = static_cast<char*>(workspace);
        std::size_t ints = round_up(sizeof(int) * (std::size_t)n);
        int* sorted_ids = reinterpret_cast<int*>(base);
        int* positions = reinterpret_cast<int*>(base + ints);
        int* sorted_pos = reinterpret_cast<int*>(base + 2 * ints);
        void* temp = base + 3 * ints;
        std::size_t temp_bytes = cub_temp_bytes(n);
        iota_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(positions, n);
        FG_LAUNCH_CHECK();
        FG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, sorted_ids, positions,
                                                      sorted_pos, (int)n, 0, 32, stream()));
        const dim3 grid((unsigned)n, (unsigned)((dim + kTileCols - 1) / kTileCols));
        embedding_backward_kernel<T><<<grid, kBackwardWarps * 32, 0, stream()>>>(
            static_cast<const T*>(dout), sorted_ids, sorted_pos, n, dim, vocab,
            static_cast<T*>(dweight));
        FG_LAUNCH_CHECK();
    });
}

}  // namespace fg::kernels
