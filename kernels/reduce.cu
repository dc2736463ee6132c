// kernels/reduce.cu: see reduce.h. The kernels are templates over the storage type T of x (float,
// __nv_bfloat16 or __half, float_types.cuh): each element is widened to float as it is loaded,
// every sum and partial is fp32, and only the final value is rounded to T (column_sum's stays f32
// with f32_out). The order of additions
// is the same for every T, so a 16-bit sum is the f32 kernel's sum of the widened values, rounded
// once. Row sums give each row one warp. Column and total sums split the data over a grid whose
// size depends only on the shape and the SM count, write fp32 partials (one per (row chunk,
// column), or one per block), then add the partials in a second kernel. Column sums give each
// thread 4 consecutive columns, read by one vector load per row where x is aligned for it and by
// scalar loads otherwise, with the same additions in the same order either way.
#include <algorithm>
#include <cstdint>

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

// Column sums. Geometry, the same for every T: a block of (32, 8) threads covers kColumnsPerBlock
// = 128 columns of one chunk of rows; thread (tx, ty) owns the 4 consecutive columns
// c = 128 * blockIdx.x + 4 * tx .. c + 3 and, of the chunk's rows first, first + 1, ..., the rows
// first + ty, first + ty + 8, ... (row lane ty). A warp thus reads 128 contiguous columns of a row.
constexpr int kColumnLanes = 32;      // threadIdx.x
constexpr int kRowLanes = 8;          // threadIdx.y
constexpr int kColumnsPerThread = 4;  // one 16-byte f32 load or one 8-byte bf16/f16 load
constexpr int kColumnsPerBlock = kColumnLanes * kColumnsPerThread;
constexpr int kRowUnroll = 4;  // rows a thread loads before it adds any of them

// A thread's 4 columns of one row, as one aligned vector load.
template <typename T>
struct alignas(kColumnsPerThread * sizeof(T)) ColumnPack {
    T v[kColumnsPerThread];
};

// v[j] = x[r, c + j] widened to float, from the row xr = x + r * cols. kVector: one load of the
// 4 columns, which the caller has checked to be aligned and inside the row. Otherwise 4 scalar
// loads, and 0 for columns past `cols` (never stored).
template <bool kVector, typename T>
__device__ __forceinline__ void load_columns(const T* xr, long long c, long long cols,
                                             float (&v)[kColumnsPerThread]) {
    if constexpr (kVector) {
        ColumnPack<T> p = *reinterpret_cast<const ColumnPack<T>*>(xr + c);
#pragma unroll
        for (int j = 0; j < kColumnsPerThread; ++j) v[j] = to_float(p.v[j]);
    } else {
#pragma unroll
        for (int j = 0; j < kColumnsPerThread; ++j)
            v[j] = c + j < cols ? to_float(xr[c + j]) : 0.0f;
    }
}

// out[k * cols + c] = sum of x[r, c] over the rows r of chunk k = blockIdx.y, the contiguous rows
// [k * per, min(rows, (k + 1) * per)) with per = ceil(rows / gridDim.y); fp32 sums, each stored
// once as U. Both passes of column_sum run it: pass 1 with T the storage type and U = float, one
// partial row per chunk; pass 2 with T = float over those partials (rows = chunks, one chunk)
// and U the storage type (float with f32_out).
// Order of additions for column c: each thread adds its rows in increasing order into one fp32
// accumulator per column; the 8 row lanes' sums are then added in lane order 0..7 through shared
// memory. The kRowUnroll loads of a step are all issued before their adds (more bytes in flight),
// which leaves that order unchanged, and the scalar path adds exactly what the vector path does.
template <bool kVector, typename T, typename U>
__global__ void __launch_bounds__(kColumnLanes * kRowLanes)
    column_chunk_kernel(const T* __restrict__ x, long long rows, long long cols,
                        U* __restrict__ out) {
    __shared__ alignas(16) float tile[kRowLanes][kColumnsPerBlock];
    long long c = blockIdx.x * (long long)kColumnsPerBlock + threadIdx.x * kColumnsPerThread;
    long long per = (rows + gridDim.y - 1) / gridDim.y;
    long long end = min(rows, (blockIdx.y + 1) * per);
    float acc[kColumnsPerThread] = {};
    if (c < cols) {  // on the vector path (cols % 4 == 0), all 4 columns are inside the row
        long long r = blockIdx.y * per + threadIdx.y;
        constexpr long long kStep = (long long)kRowUnroll * kRowLanes;
        float v[kRowUnroll][kColumnsPerThread];
        for (; r + kStep - kRowLanes < end; r += kStep) {  // kRowUnroll rows, all in the chunk
#pragma unroll
            for (int u = 0; u < kRowUnroll; ++u)
                load_columns<kVector>(x + (r + u * kRowLanes) * cols, c, cols, v[u]);
#pragma unroll
            for (int u = 0; u < kRowUnroll; ++u)
#pragma unroll
                for (int j = 0; j < kColumnsPerThread; ++j) acc[j] += v[u][j];
        }
        // The last fewer than kRowUnroll rows of this lane, loaded together in the same way.
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
            if (r + u * kRowLanes < end)
                load_columns<kVector>(x + (r + u * kRowLanes) * cols, c, cols, v[u]);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
            if (r + u * kRowLanes < end)
#pragma unroll
                for (int j = 0; j < kColumnsPerThread; ++j) acc[j] += v[u][j];
    }
    *reinterpret_cast<float4*>(&tile[threadIdx.y][threadIdx.x * kColumnsPerThread]) =
        make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    // Threads 0..127 of the block each add one column's 8 lane sums, in lane order.
    int t = threadIdx.y * kColumnLanes + threadIdx.x;
    long long col = blockIdx.x * (long long)kColumnsPerBlock + t;
    if (t < kColumnsPerBlock && col < cols) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < kRowLanes; ++k) s += tile[k][t];
        out[blockIdx.y * cols + col] = from_float<U>(s);
    }
}

// Sums the rows of x into out in `chunks` row chunks (column_chunk_kernel), by vector loads when x
// and every row start are aligned to 4 columns, else by scalar loads in the same order.
template <typename T, typename U>
void launch_column_chunks(const T* x, long long rows, long long cols, int chunks, U* out) {
    static_assert(kColumnsPerThread == 4, "the tile takes one float4 per thread");
    bool vector = cols % kColumnsPerThread == 0 &&
                  reinterpret_cast<std::uintptr_t>(x) % sizeof(ColumnPack<T>) == 0;
    dim3 grid((unsigned)((cols + kColumnsPerBlock - 1) / kColumnsPerBlock), (unsigned)chunks);
    dim3 block(kColumnLanes, kRowLanes);
    if (vector)
        column_chunk_kernel<true><<<grid, block, 0, stream()>>>(x, rows, cols, out);
    else
        column_chunk_kernel<false><<<grid, block, 0, stream()>>>(x, rows, cols, out);
    FG_LAUNCH_CHECK();
}

// Row chunks of pass 1: enough for about 4 blocks per SM, but at most one per 64 rows (smaller
// chunks would make the partials a large part of the traffic) and at most 1024.
int column_chunks(long long rows, long long cols) {
    long long column_blocks = (cols + kColumnsPerBlock - 1) / kColumnsPerBlock;
    long long wanted = std::max(1LL, 4LL * device_info().sm_count / column_blocks);
    long long useful = (rows + 63) / 64;
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
                void* workspace, bool f32_out) {
    if (cols == 0) return;
    int chunks = column_chunks(rows, cols);
    float* partial = static_cast<float*>(workspace);
    with_float_type(type, "column_sum", [&](auto tag) {
        using T = decltype(tag);
        // Pass 1: partial[k, c] = sum over chunk k's rows of x[r, c]. Pass 2: out[c] = sum_k
        // partial[k, c], the same kernel summing the (chunks, cols) partials as a single chunk.
        launch_column_chunks(static_cast<const T*>(x), rows, cols, chunks, partial);
        if (f32_out)
            launch_column_chunks(static_cast<const float*>(partial), (long long)chunks, cols, 1,
                                 static_cast<float*>(out));
        else
            launch_column_chunks(static_cast<const float*>(partial), (long long)chunks, cols, 1,
                                 static_cast<T*>(out));
    });
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
