// kernels/softmax.cu: one block per row. The softmax's passes over a row (max, sum of
// exponentials, write) are served from L1/L2 after the first read; the cross-entropy, whose rows
// are a vocabulary long, reads each row once in its forward (an online maximum and sum) and
// once in its backward, 16 bytes a load, or, in its one-pass form, once in all (the row kept in
// shared memory while its sum is found). See softmax.h for the math. Every kernel is a
// template over the storage type T of the row (float, __nv_bfloat16, __half, float_types.cuh):
// values are widened to float as they are read and rounded once as they are stored, so the f32
// instantiation does the same float operations as a float-only kernel would.
#include <cfloat>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_pipeline.h>

#include "block_reduce.cuh"
#include "device_error.cuh"
#include "float_types.cuh"
#include "runtime.h"
#include "softmax.h"

namespace fg::kernels {
namespace {

int threads_for(long long cols) {
    int t = 32;
    while (t < 256 && t < cols) t *= 2;
    return t;
}

template <typename T>
__global__ void softmax_forward_kernel(const T* x, long long cols, long long q_len, T* y) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    // Number of visible columns for this row.
    long long visible = cols;
    if (q_len > 0) visible = min(cols, row % q_len + (cols - q_len) + 1);
    float m = -FLT_MAX;
    for (long long j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, to_float(xr[j]));
    m = block_max(m, scratch);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < visible; j += blockDim.x) s += expf(to_float(xr[j]) - m);
    s = block_sum(s, scratch);
    float inv = 1.0f / s;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = from_float<T>(j < visible ? expf(to_float(xr[j]) - m) * inv : 0.0f);
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, long long cols, T* dx) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* yr = y + row * cols;
    const T* gr = dy + row * cols;
    float dot = 0.0f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        dot += to_float(yr[j]) * to_float(gr[j]);
    dot = block_sum(dot, scratch);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        dx[row * cols + j] = from_float<T>(to_float(yr[j]) * (to_float(gr[j]) - dot));
}

// The cross-entropy kernels read rows of a (B T, V) logits matrix, V up to GPT-2's 50304: they
// are bound by memory, so each thread loads 16 bytes at a time (8 bf16 / f16 values, 4 f32)
// wherever the row allows it, and the forward reads each row once.
template <typename T>
struct alignas(16) Vec16 {
    static constexpr int kSize = 16 / sizeof(T);
    T v[kSize];
};

// The columns of a row this thread handles, split for 16-byte loads: [0, head) one value at a
// time up to the first 16-byte boundary, then `vectors` whole Vec16s, then the rest one at a time.
// A row's start is only T-aligned (a row of V values starts at r * V), so head depends on the row.
struct RowSplit {
    long long head, vectors;
};
template <typename T>
__device__ __forceinline__ RowSplit split_row(const T* row, long long cols) {
    constexpr int V = Vec16<T>::kSize;
    long long misaligned =
        (long long)(reinterpret_cast<uintptr_t>(row) & 15) / (long long)sizeof(T);
    long long head = misaligned == 0 ? 0 : min(cols, (long long)V - misaligned);
    return {head, (cols - head) / V};
}

// out[j] = g(j, in[j]) for every column j of the row this thread handles, rounded to T: 16 bytes
// a load and a store where both rows sit at the same offset from a 16-byte boundary (always when
// out is in), else one value at a time. in and out may be the same row (the loss's gradient
// overwrites the logits when nothing else holds them).
template <typename T, typename G>
__device__ __forceinline__ void map_row(const T* in, T* out, long long cols, G&& g) {
    constexpr int V = Vec16<T>::kSize;
    bool same_offset =
        ((reinterpret_cast<uintptr_t>(in) ^ reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    RowSplit split = same_offset ? split_row(in, cols) : RowSplit{cols, 0};
    for (long long j = threadIdx.x; j < split.head; j += blockDim.x)
        out[j] = from_float<T>(g(j, to_float(in[j])));
    const Vec16<T>* body_in = reinterpret_cast<const Vec16<T>*>(in + split.head);
    Vec16<T>* body_out = reinterpret_cast<Vec16<T>*>(out + split.head);
    for (long long i = threadIdx.x; i < split.vectors; i += blockDim.x) {
        Vec16<T> x = body_in[i];
        long long j0 = split.head + i * V;
#pragma unroll
        for (int k = 0; k < V; ++k) x.v[k] = from_float<T>(g(j0 + k, to_float(x.v[k])));
        body_out[i] = x;
    }
    for (long long j = split.head + split.vectors * V + threadIdx.x; j < cols; j += blockDim.x)
        out[j] = from_float<T>(g(j, to_float(in[j])));
}

// Threads a cross-entropy block: enough for a long row to keep many loads in flight.
int cross_entropy_threads(long long cols) {
    int t = 32;
    while (t < 512 && t * 8LL < cols) t *= 2;
    return t;
}

// A thread's share of a row's log-sum-exp, the online softmax: its running maximum m and
// s = sum over its values of exp(x - m), updated once per group of values (a 16-byte vector or one
// value): the group's maximum first, s rescaled by exp(m_old - m_new) if that grew, then the
// group's exponentials added. fmaxf passes a NaN by, so s, and the loss, get it.
struct OnlineSum {
    float m = -FLT_MAX, s = 0.0f;
    template <typename T>
    __device__ __forceinline__ void add(const T* v, int n) {  // n: Vec16<T>::kSize or 1
        float x[Vec16<T>::kSize];
        float top = m;
#pragma unroll
        for (int k = 0; k < n; ++k) {
            x[k] = to_float(v[k]);
            top = fmaxf(top, x[k]);
        }
        if (top != m) s *= expf(m - top);
        m = top;
#pragma unroll
        for (int k = 0; k < n; ++k) s += expf(x[k] - m);
    }
    // The block's lse = M + log S, M = max_t m_t, S = sum_t s_t exp(m_t - M): a row of -inf gives
    // -inf (and a NaN loss, as the CPU's two-pass formula). Call from every thread (it syncs).
    __device__ __forceinline__ float block_lse(float* scratch) const {
        float row_max = block_max(m, scratch);
        return row_max + logf(block_sum(s * expf(m - row_max), scratch));
    }
};

// Calls visit(j, v, n) on this thread's columns of the row, v holding the n values from column
// j: whole 16-byte vectors (n = Vec16<T>::kSize) where the row allows, one value at a time
// before the first 16-byte boundary and after the last. Two vectors are loaded before either is
// visited, so that more bytes are in flight.
template <typename T, typename Visit>
__device__ __forceinline__ void read_row(const T* xr, long long cols, Visit&& visit) {
    constexpr int V = Vec16<T>::kSize;
    RowSplit split = split_row(xr, cols);
    for (long long j = threadIdx.x; j < split.head; j += blockDim.x) visit(j, xr + j, 1);
    const Vec16<T>* body = reinterpret_cast<const Vec16<T>*>(xr + split.head);
    long long i = threadIdx.x;
    for (; i + blockDim.x < split.vectors; i += 2 * (long long)blockDim.x) {
        Vec16<T> a = body[i], b = body[i + blockDim.x];
        visit(split.head + i * V, a.v, V);
        visit(split.head + (i + blockDim.x) * V, b.v, V);
    }
    if (i < split.vectors) {
        Vec16<T> a = body[i];
        visit(split.head + i * V, a.v, V);
    }
    for (long long j = split.head + split.vectors * V + threadIdx.x; j < cols; j += blockDim.x)
        visit(j, xr + j, 1);
}

// A row's loss lse - x[t] (row in global or shared memory): 0 for the ignored target; NaN, and
// the device error word set, for a target outside [0, cols).
template <typename T>
__device__ __forceinline__ float target_loss(const T* row, float lse, int t, long long cols,
                                             int ignore_index, DeviceErrorRecord* err) {
    if (t == ignore_index) return 0.0f;
    if (t < 0 || t >= cols) {
        report_device_error(err, DeviceErrorCode::cross_entropy_target, t, cols);
        return __int_as_float(0x7fc00000);  // NaN: the loss must not look fine
    }
    return lse - to_float(row[t]);
}

// One block a row, one read of it: lse_r (OnlineSum) and the row's loss.
template <typename T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int* targets, long long cols,
                                          int ignore_index, float* row_lse, float* row_loss,
                                          DeviceErrorRecord* err) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* xr = logits + row * cols;
    OnlineSum acc;
    read_row(xr, cols, [&](long long, const T* v, int n) { acc.add(v, n); });
    float lse = acc.block_lse(scratch);
    if (threadIdx.x == 0) {
        row_lse[row] = lse;
        row_loss[row] = target_loss(xr, lse, targets[row], cols, ignore_index, err);
    }
}

// The loss and its gradient with one read of each row, which is copied to shared memory (at the
// logits row's offset from a 16-byte boundary, so that their vectors line up); the block finds
// lse_r there as cross_entropy_rows_kernel does in the logits, then writes dx_j = expected_dloss
// * inv_count * (exp(x_j - lse_r) - [j == t]) from there: the backward's formula for dloss =
// expected_dloss, the same floats. dlogits may be the logits.
template <typename T>
__global__ void cross_entropy_one_pass_kernel(const T* logits, const int* targets,
                                              long long cols, int ignore_index,
                                              float expected_dloss, const float* inv_count,
                                              float* row_loss, T* dlogits,
                                              DeviceErrorRecord* err) {
    constexpr int V = Vec16<T>::kSize;
    extern __shared__ __align__(16) unsigned char row_smem[];
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* xr = logits + row * cols;
    T* sr = reinterpret_cast<T*>(row_smem) + (reinterpret_cast<uintptr_t>(xr) & 15) / sizeof(T);
    // The row's 16-byte vectors copied asynchronously (cp.async), all of a thread's in flight at
    // once; the values before the first 16-byte boundary and after the last by plain loads.
    RowSplit split = split_row(xr, cols);
    const Vec16<T>* body = reinterpret_cast<const Vec16<T>*>(xr + split.head);
    Vec16<T>* shared_body = reinterpret_cast<Vec16<T>*>(sr + split.head);
    for (long long i = threadIdx.x; i < split.vectors; i += blockDim.x)
        __pipeline_memcpy_async(shared_body + i, body + i, sizeof(Vec16<T>));
    __pipeline_commit();
    for (long long j = threadIdx.x; j < split.head; j += blockDim.x) sr[j] = xr[j];
    for (long long j = split.head + split.vectors * V + threadIdx.x; j < cols; j += blockDim.x)
        sr[j] = xr[j];
    __pipeline_wait_prior(0);
    // Each thread reads back what it copied (read_row splits sr as it split xr), as the rows
    // kernel reads the logits.
    OnlineSum acc;
    read_row(sr, cols, [&](long long, const T* v, int n) { acc.add(v, n); });
    float lse = acc.block_lse(scratch);  // its __syncthreads: the whole row is in sr
    int t = targets[row];
    if (threadIdx.x == 0) row_loss[row] = target_loss(sr, lse, t, cols, ignore_index, err);
    float scale = expected_dloss * inv_count[0];
    bool ignored = t == ignore_index;
    map_row(sr, dlogits + row * cols, cols, [=](long long j, float x) {
        return ignored ? 0.0f : scale * (expf(x - lse) - (j == t ? 1.0f : 0.0f));
    });
}

// loss = the mean of row_loss over the rows whose target is not ignored, inv_count = 1 / their
// count; with no row_loss, inv_count only (the one-pass kernel needs it before it runs). Per-row
// statistics only (fp32 whatever the logits' type): not a template.
__global__ void cross_entropy_mean_kernel(const float* row_loss, const int* targets,
                                          long long rows, int ignore_index, float* loss,
                                          float* inv_count) {
    __shared__ float scratch[32];
    float total = 0.0f, count = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        if (row_loss) total += row_loss[r];
        count += targets[r] != ignore_index ? 1.0f : 0.0f;
    }
    total = block_sum(total, scratch);
    count = block_sum(count, scratch);
    if (threadIdx.x == 0) {
        if (row_loss) loss[0] = total / count;  // no counted rows: 0 / 0 = NaN, as in PyTorch
        inv_count[0] = count > 0.0f ? 1.0f / count : 0.0f;
    }
}

// dx_j = dloss / count * (exp(x_j - lse) - [j == t]) over the row, written over the logits when
// dlogits is the logits' buffer; a row with the ignored target gets zeros.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int* targets,
                                              const float* row_lse, const float* inv_count,
                                              const float* dloss, long long cols,
                                              int ignore_index, T* dlogits) {
    long long row = blockIdx.x;
    int t = targets[row];
    const T* xr = logits + row * cols;
    T* dr = dlogits + row * cols;
    if (t == ignore_index) {
        map_row(xr, dr, cols, [](long long, float) { return 0.0f; });
        return;
    }
    float scale = dloss[0] * inv_count[0];
    float lse = row_lse[row];
    map_row(xr, dr, cols, [=](long long j, float x) {
        return scale * (expf(x - lse) - (j == t ? 1.0f : 0.0f));
    });
}

// The one-pass gradient's backward: dx *= dloss / expected_dloss, where the backward's dloss
// differs from the one the forward assumed (otherwise every block returns at once).
template <typename T>
__global__ void cross_entropy_rescale_kernel(const float* dloss, float expected_dloss,
                                             long long n, T* dx) {
    float d = dloss[0];
    if (d == expected_dloss) return;
    float factor = d / expected_dloss;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dx[i] = from_float<T>(to_float(dx[i]) * factor);
}

// Shared memory the one-pass kernel needs: the row and up to one vector of offset.
std::size_t one_pass_smem(std::size_t value_bytes, long long cols) {
    return (static_cast<std::size_t>(cols) + 16 / value_bytes) * value_bytes;
}

}  // namespace

void softmax_forward(ScalarType type, const void* x, long long rows, long long cols,
                     long long q_len, void* y) {
    with_float_type(type, "softmax_forward", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0 || cols == 0) return;
        softmax_forward_kernel<T><<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
            static_cast<const T*>(x), cols, q_len, static_cast<T*>(y));
        FG_LAUNCH_CHECK();
    });
}

void softmax_backward(ScalarType type, const void* y, const void* dy, long long rows,
                      long long cols, void* dx) {
    with_float_type(type, "softmax_backward", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0 || cols == 0) return;
        softmax_backward_kernel<T><<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
            static_cast<const T*>(y), static_cast<const T*>(dy), cols, static_cast<T*>(dx));
        FG_LAUNCH_CHECK();
    });
}

void cross_entropy_forward(ScalarType type, const void* logits, const int* targets,
                           long long rows, long long cols, int ignore_index, float* row_lse,
                           float* row_loss, float* loss, float* inv_count) {
    with_float_type(type, "cross_entropy_forward", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0) return;
        int threads = cross_entropy_threads(cols);
        cross_entropy_rows_kernel<T><<<(unsigned)rows, threads, 0, stream()>>>(
            static_cast<const T*>(logits), targets, cols, ignore_index, row_lse, row_loss,
            device_error_record());
        FG_LAUNCH_CHECK();
    });
    // Also with no rows: the loss is then 0 / 0 = NaN and inv_count 0.
    cross_entropy_mean_kernel<<<1, 1024, 0, stream()>>>(row_loss, targets, rows, ignore_index,
                                                        loss, inv_count);
    FG_LAUNCH_CHECK();
}

bool cross_entropy_one_pass_fits(ScalarType type, long long cols) {
    bool fits = false;
    with_float_type(type, "cross_entropy_one_pass", [&](auto tag) {
        // A margin of 1 KiB for the kernel's static shared memory (the reductions' 32 floats).
        fits = one_pass_smem(sizeof(tag), cols) + 1024 <=
               static_cast<std::size_t>(device_info().smem_per_block_optin);
    });
    return fits;
}

void cross_entropy_one_pass(ScalarType type, const void* logits, const int* targets,
                            long long rows, long long cols, int ignore_index,
                            float expected_dloss, float* row_loss, float* loss, float* inv_count,
                            void* dlogits) {
    if (!cross_entropy_one_pass_fits(type, cols))
        throw std::invalid_argument("internal error: rows of " + std::to_string(cols) +
                                    " values do not fit the one-pass cross-entropy");
    cross_entropy_mean_kernel<<<1, 1024, 0, stream()>>>(nullptr, targets, rows, ignore_index,
                                                        nullptr, inv_count);
    FG_LAUNCH_CHECK();
    with_float_type(type, "cross_entropy_one_pass", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0) return;
        const void* kernel = reinterpret_cast<const void*>(&cross_entropy_one_pass_kernel<T>);
        std::size_t smem = one_pass_smem(sizeof(T), cols);
        allow_dynamic_smem(kernel, smem);
        cross_entropy_one_pass_kernel<T><<<(unsigned)rows, cross_entropy_threads(cols), smem,
                                           stream()>>>(
            static_cast<const T*>(logits), targets, cols, ignore_index, expected_dloss, inv_count,
            row_loss, static_cast<T*>(dlogits), device_error_record());
        FG_LAUNCH_CHECK();
    });
    cross_entropy_mean_kernel<<<1, 1024, 0, stream()>>>(row_loss, targets, rows, ignore_index,
                                                        loss, inv_count);
    FG_LAUNCH_CHECK();
}

void cross_entropy_one_pass_backward(ScalarType type, const float* dloss, float expected_dloss,
                                     long long count, void* dlogits) {
    with_float_type(type, "cross_entropy_one_pass_backward", [&](auto tag) {
        using T = decltype(tag);
        if (count == 0) return;
        unsigned blocks = static_cast<unsigned>(4 * device_info().sm_count);
        cross_entropy_rescale_kernel<T><<<blocks, 256, 0, stream()>>>(dloss, expected_dloss, count,
                                                                     static_cast<T*>(dlogits));
        FG_LAUNCH_CHECK();
    });
}

void cross_entropy_backward(ScalarType type, const void* logits, const int* targets,
                            const float* row_lse, const float* inv_count, const float* dloss,
                            long long rows, long long cols, int ignore_index, void* dlogits) {
    with_float_type(type, "cross_entropy_backward", [&](auto tag) {
        using T = decltype(tag);
        if (rows == 0) return;
        int threads = cross_entropy_threads(cols);
        cross_entropy_backward_kernel<T><<<(unsigned)rows, threads, 0, stream()>>>(
            static_cast<const T*>(logits), targets, row_lse, inv_count, dloss, cols, ignore_index,
            static_cast<T*>(dlogits));
        FG_LAUNCH_CHECK();
    });
}

}  // namespace fg::kernels
