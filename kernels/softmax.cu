// kernels/softmax.cu: one block per row; passes over the row (max, sum of exponentials, write)
// are served from L1/L2 after the first read. See softmax.h for the math.
#include <cfloat>

#include "block_reduce.cuh"
#include "device_error.cuh"
#include "runtime.h"
#include "softmax.h"

namespace fg::kernels {
namespace {

int threads_for(long long cols) {
    int t = 32;
    while (t < 256 && t < cols) t *= 2;
    return t;
}

__global__ void softmax_forward_kernel(const float* x, long long cols, long long q_len, float* y) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    // Number of visible columns for this row.
    long long visible = cols;
    if (q_len > 0) visible = min(cols, row % q_len + (cols - q_len) + 1);
    float m = -FLT_MAX;
    for (long long j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < visible; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s, scratch);
    float inv = 1.0f / s;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = j < visible ? expf(xr[j] - m) * inv : 0.0f;
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, long long cols,
                                        float* dx) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* yr = y + row * cols;
    const float* gr = dy + row * cols;
    float dot = 0.0f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) dot += yr[j] * gr[j];
    dot = block_sum(dot, scratch);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        dx[row * cols + j] = yr[j] * (gr[j] - dot);
}

__global__ void cross_entropy_rows_kernel(const float* logits, const int* targets, long long cols,
                                          int ignore_index, float* row_lse, float* row_loss,
                                          DeviceErrorRecord* err) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    const float* xr = logits + row * cols;
    float m = -FLT_MAX;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
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
            row_loss[row] = lse - xr[t];
        }
    }
}

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

__global__ void cross_entropy_backward_kernel(const float* logits, const int* targets,
                                              const float* row_lse, const float* inv_count,
                                              const float* dloss, long long cols,
                                              int ignore_index, float* dlogits) {
    long long row = blockIdx.x;
    int t = targets[row];
    const float* xr = logits + row * cols;
    float* dr = dlogits + row * cols;
    if (t == ignore_index) {
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = 0.0f;
        return;
    }
    float scale = dloss[0] * inv_count[0];
    float lse = row_lse[row];
    for (long long j = threadIdx.x; j < cols; j += blockDim.x)
        dr[j] = scale * (expf(xr[j] - lse) - (j == t ? 1.0f : 0.0f));
}

}  // namespace

void softmax_forward_f32(const float* x, long long rows, long long cols, long long q_len,
                         float* y) {
    if (rows == 0 || cols == 0) return;
    softmax_forward_kernel<<<(unsigned)rows, threads_for(cols), 0, stream()>>>(x, cols, q_len, y);
    FG_LAUNCH_CHECK();
}

void softmax_backward_f32(const float* y, const float* dy, long long rows, long long cols,
                          float* dx) {
    if (rows == 0 || cols == 0) return;
    softmax_backward_kernel<<<(unsigned)rows, threads_for(cols), 0, stream()>>>(y, dy, cols, dx);
    FG_LAUNCH_CHECK();
}

void cross_entropy_forward_f32(const float* logits, const int* targets, long long rows,
                               long long cols, int ignore_index, float* row_lse, float* row_loss,
                               float* loss, float* inv_count) {
    if (rows > 0) {
        cross_entropy_rows_kernel<<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
            logits, targets, cols, ignore_index, row_lse, row_loss, device_error_record());
        FG_LAUNCH_CHECK();
    }
    cross_entropy_mean_kernel<<<1, 1024, 0, stream()>>>(row_loss, targets, rows, ignore_index,
                                                        loss, inv_count);
    FG_LAUNCH_CHECK();
}

void cross_entropy_backward_f32(const float* logits, const int* targets, const float* row_lse,
                                const float* inv_count, const float* dloss, long long rows,
                                long long cols, int ignore_index, float* dlogits) {
    if (rows == 0) return;
    cross_entropy_backward_kernel<<<(unsigned)rows, threads_for(cols), 0, stream()>>>(
        logits, targets, row_lse, inv_count, dloss, cols, ignore_index, dlogits);
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
