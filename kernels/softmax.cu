// kernels/softmax.cu: one block per row; passes over the row (max, sum of exponentials, write)
// are served from L1/L2 after the first read. See softmax.h for the math. Every kernel is a
// template over the storage type T of the row (float, __nv_bfloat16, __half, float_types.cuh):
// values are widened to float as they are read and rounded once as they are stored, so the f32
// instantiation does the same float operations as a float-only kernel would.
#include <cfloat>

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

template <typename T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int* targets, long long cols,
                                          int ignore_index, float* row_lse, float* row_loss,
                                          DeviceErrorRecord* err) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const T* xr = logits + row * cols;
    float m = -FLT_MAX;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, to_float(xr[j]));
    m = block_max(m, scratch);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(to_float(xr[j]) - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        float lse = m + logf(s);
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
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = from_float<T>(0.0f);
        return;
    }
    float scale = dloss[0] * inv_count[0];
    float lse = row_lse[row];
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        dr[j] = from_float<T>(scale * (expf(to_float(xr[j]) - lse) - (j == t ? 1.0f : 0.0f)));
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
        cross_entropy_rows_kernel<T><<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
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
        cross_entropy_backward_kernel<T><<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
            static_cast<const T*>(logits), targets, row_lse, inv_count, dloss, cols, ignore_index,
            static_cast<T*>(dlogits));
        FG_LAUNCH_CHECK();
    });
}

}  // namespace fg::kernels
