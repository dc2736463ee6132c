// kernels/softmax.cu: one block per row. The softmax's passes over a row (max, sum of
// exponentials, write) are served from L1/L2 after the first read; the cross-entropy, whose rows
// are a vocabulary long, reads each row once in its forward (an online maximum and sum) and
// once in its backward, 16 bytes a load. See softmax.h for the math. Every kernel is a
// template over the storage type T of the row (float, __nv_bfloat16, __half, float_types.cuh):
// values are widened to float as they are read and rounded once as they are stored, so the f32
// instantiation does the same float operations as a float-only kernel would.
#include <cfloat>
#include <cstdint>

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

// One block a row, one pass over it: lse_r = m + log sum_j exp(x_j - m), m = max_j x_j. Each
// thread keeps a running maximum m_t and s_t = sum over its values of exp(x - m_t) (the online
// softmax), updated once per 16-byte vector: the vector's maximum first, s_t rescaled by
// exp(m_old - m_new) if that grew, then its values' exponentials added. Two vectors are loaded
// before either is used, so that more bytes are in flight. The block then takes M = max_t m_t and
// S = sum_t s_t exp(m_t - M), and lse = M + log S. A NaN or a +inf makes s, and so the loss,
// NaN; a row of -inf gives lse = -inf and a NaN loss (as the CPU's two-pass formula, NaN there).
template <typename T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int* targets, long long cols,
                                          int ignore_index, float* row_lse, float* row_loss,
                                          DeviceErrorRecord* err) {
    constexpr int V = Vec16<T>::kSize;
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* xr = logits + row * cols;
    float m = -FLT_MAX, s = 0.0f;
    auto add = [&](const float* x, int n) {  // n values, widened
        float top = m;
        for (int k = 0; k < n; ++k) top = fmaxf(top, x[k]);  // fmaxf passes a NaN by: s gets it
        if (top != m) s *= expf(m - top);
        m = top;
        for (int k = 0; k < n; ++k) s += expf(x[k] - m);
    };
    auto add_vector = [&](const Vec16<T>& v) {
        float x[V];
#pragma unroll
        for (int k = 0; k < V; ++k) x[k] = to_float(v.v[k]);
        add(x, V);
    };
    RowSplit split = split_row(xr, cols);
    for (long long j = threadIdx.x; j < split.head; j += blockDim.x) {
        float x = to_float(xr[j]);
        add(&x, 1);
    }
    const Vec16<T>* body = reinterpret_cast<const Vec16<T>*>(xr + split.head);
    long long i = threadIdx.x;
    for (; i + blockDim.x < split.vectors; i += 2 * (long long)blockDim.x) {
        Vec16<T> a = body[i], b = body[i + blockDim.x];
        add_vector(a);
        add_vector(b);
    }
    if (i < split.vectors) add_vector(body[i]);
    for (long long j = split.head + split.vectors * V + threadIdx.x; j < cols; j += blockDim.x) {
        float x = to_float(xr[j]);
        add(&x, 1);
    }
    float row_max = block_max(m, scratch);
    float sum = block_sum(s * expf(m - row_max), scratch);
    if (threadIdx.x == 0) {
        float lse = row_max + logf(sum);
        int t = targets[row];
        row_lse[row] = lse;
        if (t == ignore_index) {
            row_loss[row] = 0.0f;
        } else if (t < 0 || t >= cols) {
            report_device_error(err, DeviceErrorCode::cross_entropy_target, t, cols);
            row_loss[row] = __int_as_float(0x7fc00000);  // NaN: the loss must not look fine
        } else {
            row_loss[row] = lse - to_float(xr[t]);
        }
    }
}

// Per-row statistics only (fp32 whatever the logits' type): not a template.
__global__ void cross_entropy_mean_kernel(const float* row_loss, const int* targets,
                                          long long rows, int ignore_index, float* loss,
                                          float* inv_count) {
    __shared__ float scratch[32];
    float total = 0.0f, count = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        total += row_loss[r];
        count += targets[r] != ignore_index ? 1.0f : 0.0f;
    }
    total = block_sum(total, scratch);
    count = block_sum(count, scratch);
    if (threadIdx.x == 0) {
        loss[0] = total / count;  // no counted rows: 0 / 0 = NaN, as in PyTorch
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
