// kernels/reduce.cu: see reduce.h. The kernels are templates over the storage type T of x (float,
// __nv_bfloat16 or __half, float_types.cuh): each element is widened to float as it is loaded,
// every sum and partial is fp32, and only the final value is rounded to T. The order of additions
// is the same for every T, so a 16-bit sum is the f32 kernel's sum of the widened values, rounded
// once. Row sums give each row one warp; column and total sums split the rows over a grid whose
// size depends only on the shape and the SM count, write one fp32 partial per (chunk, column),
// then sum the partials in a second, column-parallel kernel.
#include <algorithm>

#include "block_reduce.cuh"
#include "device_error.cuh"
#include "float_types.cuh"
#include "reduce.h"
#include "runtime.h"

namespace fg::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row, 8 warps per block

// out[r] = alpha * sum_c x[r, c]: lane l adds columns l, l + 32, ..., then the warp adds lanes.
template <typename T>
__global__ void row_sum_kernel(const T* x, long long rows, long long cols, float alpha, T* out) {
    long long row = blockIdx.x * (long long)kRowsPerBlock + (threadIdx.x >> 5);
    if (row >= rows) return;
    const T* xr = x + row * cols;
    float acc = 0.0f;
    for (long long c = threadIdx.x & 31; c < cols; c += 32) acc += to_float(xr[c]);
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) out[row] = from_float<T>(alpha * acc);
}

// Column sums, pass 1: block (32, 8) covers 32 columns; chunk blockIdx.y takes rows
// ty + 8 * (blockIdx.y + k * gridDim.y). Partial row blockIdx.y gets the chunk's fp32 sums.
template <typename T>
__global__ void column_partial_kernel(const T* x, long long rows, long long cols, float* partial) {
    __shared__ float tile[8][33];
    long long c = blockIdx.x * 32LL + threadIdx.x;
    float acc = 0.0f;
    if (c < cols) {
        for (long long r = blockIdx.y * 8LL + threadIdx.y; r < rows; r += gridDim.y * 8LL)
            acc += to_float(x[r * cols + c]);
    }
    tile[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) s += tile[k][threadIdx.x];
        partial[blockIdx.y * cols + c] = s;
    }
}

// Column sums, pass 2: one thread per column adds the chunks' partials in order.
template <typename T>
__global__ void column_finish_kernel(const float* partial, int chunks, long long cols, T* out) {
    long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; ++k) s += partial[k * cols + c];
    out[c] = from_float<T>(s);
}

int column_chunks(long long rows, long long cols) {
    long long column_blocks = (cols + 31) / 32;
    long long wanted = std::max(1LL, 4LL * device_info().sm_count / column_blocks);
    long long useful = (rows + 63) / 64;  // at least 64 rows per chunk
    return (int)std::max(1LL, std::min({wanted, useful, 1024LL}));
}

constexpr int kSumThreads = 512;

// Total sum, pass 1: block b adds elements b * 512 + t + k * (grid * 512) into partial[b].
template <typename T>
__global__ void total_partial_kernel(const T* x, long long n, float* partial) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        acc += to_float(x[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Total sum, pass 2: one block adds the partials; out[0] = alpha * sum.
template <typename T>
__global__ void total_finish_kernel(const float* partial, int blocks, float alpha, T* out) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = from_float<T>(alpha * acc);
}

int total_blocks(long long n) {
    long long wanted = (n + kSumThreads * 4LL - 1) / (kSumThreads * 4LL);
    return (int)std::max(1LL, std::min(wanted, 2LL * device_info().sm_count));
}

}  // namespace

void row_sum(ScalarType type, const void* x, long long rows, long long cols, float alpha,
             void* out) {
    if (rows == 0) return;
    long long blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    with_float_type(type, "row_sum", [&](auto tag) {
        using T = decltype(tag);
        row_sum_kernel<T><<<(unsigned)blocks, 32 * kRowsPerBlock, 0, stream()>>>(
            static_cast<const T*>(x), rows, cols, alpha, static_cast<T*>(out));
    });
    FG_LAUNCH_CHECK();
}

std::size_t column_sum_workspace_bytes(long long rows, long long cols) {
    return sizeof(float) * (std::size_t)column_chunks(rows, cols) * (std::size_t)cols;
}

void column_sum(ScalarType type, const void* x, long long rows, long long cols, void* out,
                void* workspace) {
    if (cols == 0) return;
    int chunks = column_chunks(rows, cols);
    float* partial = static_cast<float*>(workspace);
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)chunks);
    with_float_type(type, "column_sum", [&](auto tag) {
        using T = decltype(tag);
        column_partial_kernel<T><<<grid, dim3(32, 8), 0, stream()>>>(static_cast<const T*>(x),
                                                                     rows, cols, partial);
        FG_LAUNCH_CHECK();
        column_finish_kernel<T><<<(unsigned)((cols + 255) / 256), 256, 0, stream()>>>(
            partial, chunks, cols, static_cast<T*>(out));
    });
    FG_LAUNCH_CHECK();
}

std::size_t total_sum_workspace_bytes(long long n) { return sizeof(float) * total_blocks(n); }

void total_sum(ScalarType type, const void* x, long long n, float alpha, void* out,
               void* workspace) {
    int blocks = total_blocks(n);
    float* partial = static_cast<float*>(workspace);
    with_float_type(type, "total_sum", [&](auto tag) {
        using T = decltype(tag);
        total_partial_kernel<T>
            <<<blocks, kSumThreads, 0, stream()>>>(static_cast<const T*>(x), n, partial);
        FG_LAUNCH_CHECK();
        total_finish_kernel<T><<<1, 1024, 0, stream()>>>(partial, blocks, alpha,
                                                         static_cast<T*>(out));
    });
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
