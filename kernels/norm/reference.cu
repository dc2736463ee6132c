// kernels/norm/reference.cu: the reference RMSNorm / LayerNorm kernels (the ladder of versions is
// in reference.h; the math in kernels/norm.h). In order: the arguments with typed pointers and
// small helpers; version 1, one thread per row; version 2, one warp per row; the dw / db kernel
// both versions share; the host entry points.
//
// Every row kernel makes the same passes over its row, accumulating in fp32:
//   forward:  (1) sum x, for the mean (with a fused residual, this pass first makes h = x + r,
//                 rounded to x's type, writes it out, and from then on the row is h);
//             (2) sum (x - mean)^2, for rstd; (3) y = x_hat * w' + b.
//   backward: (1) sum g and g * x_hat, for c1 and c2; (2) dx.
// Two passes for the variance, rather than sum x and sum x^2 in one, keep it accurate when the
// mean is large against the spread. RMSNorm is LayerNorm with the mean taken as 0.
#include <stdexcept>
#include <string>

#include "../block_reduce.cuh"  // warp_sum
#include "../float_types.cuh"   // to_float, from_float, with_float_type
#include "../runtime.h"         // stream, FG_LAUNCH_CHECK
#include "reference.h"

namespace fg::kernels {
namespace {

// NormForwardArgs and NormBackwardArgs with typed pointers: T is the storage type of x and of
// everything shaped like it, W that of the weights (float, or T).
template <typename T, typename W>
struct Forward {
    long long rows, cols;
    float eps;
    bool layer, zero_centered;
    const T* x;
    const T* residual;  // null unless fused
    T* h_out;
    const W* weight;  // null: w' = 1
    const W* bias;    // null: b = 0
    T* y;
    float* mean;  // may be null
    float* rstd;  // may be null
};

template <typename T, typename W>
struct Backward {
    long long rows, cols;
    bool layer, zero_centered;
    const T* x;  // what the forward normalised (h when the residual was fused)
    const T* dy;
    const T* dh;  // null: nothing added into dx
    const W* weight;
    const float* mean;  // read for LayerNorm only
    const float* rstd;
    T* dx;
    W* dweight;  // each may be null
    W* dbias;
    bool accumulate;
};

// w' at column c: w, 1 + w when zero-centred, 1 without a weight.
template <typename W>
__device__ float weight_at(const W* weight, bool zero_centered, long long c) {
    if (!weight) return 1.0f;
    return to_float(weight[c]) + (zero_centered ? 1.0f : 0.0f);
}

// Element i of what the forward normalises. In the first pass with a fused residual, h is made
// here and written out; later passes read it back (a thread reads only elements it wrote).
template <typename T, typename W>
__device__ float forward_input(const Forward<T, W>& p, long long i, bool first_pass) {
    if (!p.residual) return to_float(p.x[i]);
    if (!first_pass) return to_float(p.h_out[i]);
    const T h = from_float<T>(to_float(p.x[i]) + to_float(p.residual[i]));
    p.h_out[i] = h;
    return to_float(h);
}

template <typename T, typename W>
__device__ void store_statistics(const Forward<T, W>& p, long long row, float mean, float rstd) {
    if (p.layer && p.mean) p.mean[row] = mean;
    if (p.rstd) p.rstd[row] = rstd;
}

// y at flat index first + c (first: the row's element 0).
template <typename T, typename W>
__device__ void store_y(const Forward<T, W>& p, long long first, long long c, float mean,
                        float rstd) {
    const float x_hat = (forward_input(p, first + c, false) - mean) * rstd;
    const float b = p.bias ? to_float(p.bias[c]) : 0.0f;
    p.y[first + c] = from_float<T>(x_hat * weight_at(p.weight, p.zero_centered, c) + b);
}

// The backward's per-element terms: g = w' * dy and x_hat = (x - mean) * rstd.
template <typename T, typename W>
__device__ float g_at(const Backward<T, W>& p, long long first, long long c) {
    return weight_at(p.weight, p.zero_centered, c) * to_float(p.dy[first + c]);
}
template <typename T, typename W>
__device__ float x_hat_at(const Backward<T, W>& p, long long i, float mean, float rstd) {
    return (to_float(p.x[i]) - mean) * rstd;
}

// dx = (g - x_hat * c1 - c2) * rstd, plus dh when given.
template <typename T, typename W>
__device__ void store_dx(const Backward<T, W>& p, long long first, long long c, float mean,
                         float rstd, float c1, float c2) {
    const float x_hat = x_hat_at(p, first + c, mean, rstd);
    float dx = (g_at(p, first, c) - x_hat * c1 - c2) * rstd;
    if (p.dh) dx += to_float(p.dh[first + c]);
    p.dx[first + c] = from_float<T>(dx);
}

// ---- Version 1: thread `row` does all of row `row`, one value at a time. --------------------

// mean = sum(x) / N (LayerNorm; 0 for RMSNorm), rstd = 1 / sqrt(sum((x - mean)^2) / N + eps),
// y = (x - mean) * rstd * w' + b.
template <typename T, typename W>
__global__ void forward_thread_per_row(Forward<T, W> p) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row >= p.rows) return;
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    float sum = 0.0f;
    for (long long c = 0; c < p.cols; ++c) sum += forward_input(p, first + c, true);
    const float mean = p.layer ? sum / n : 0.0f;
    float squares = 0.0f;
    for (long long c = 0; c < p.cols; ++c) {
        const float d = forward_input(p, first + c, false) - mean;
        squares += d * d;
    }
    const float rstd = 1.0f / sqrtf(squares / n + p.eps);
    store_statistics(p, row, mean, rstd);
    for (long long c = 0; c < p.cols; ++c) store_y(p, first, c, mean, rstd);
}

// With x_hat = (x - mean) * rstd and g = w' * dy: c1 = sum(x_hat * g) / N, c2 = sum(g) / N
// (LayerNorm; 0 for RMSNorm), dx = (g - x_hat * c1 - c2) * rstd (+ dh).
template <typename T, typename W>
__global__ void backward_thread_per_row(Backward<T, W> p) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row >= p.rows) return;
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    const float mean = p.layer ? p.mean[row] : 0.0f, rstd = p.rstd[row];
    float sum_g = 0.0f, sum_g_x_hat = 0.0f;
    for (long long c = 0; c < p.cols; ++c) {
        const float g = g_at(p, first, c);
        sum_g += g;
        sum_g_x_hat += g * x_hat_at(p, first + c, mean, rstd);
    }
    const float c1 = sum_g_x_hat / n, c2 = p.layer ? sum_g / n : 0.0f;
    for (long long c = 0; c < p.cols; ++c) store_dx(p, first, c, mean, rstd, c1, c2);
}

// ---- Version 2: warp w of a block does one row; lane l takes columns l, l + 32, ... --------
// The same math as version 1. The warp's 32 loads of a step are neighbours (coalesced), and each
// lane's partial sums are added across the warp by warp_sum (block_reduce.cuh: five
// __shfl_xor_sync steps, after which every lane holds the total).

constexpr int kWarp = 32;

template <typename T, typename W>
__global__ void forward_warp_per_row(Forward<T, W> p) {
    const int lane = threadIdx.x % kWarp;
    const long long row = blockIdx.x * (long long)(blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (row >= p.rows) return;  // the whole warp leaves: the shuffles below see all 32 lanes
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    float sum = 0.0f;
    for (long long c = lane; c < p.cols; c += kWarp) sum += forward_input(p, first + c, true);
    const float mean = p.layer ? warp_sum(sum) / n : 0.0f;
    float squares = 0.0f;
    for (long long c = lane; c < p.cols; c += kWarp) {
        const float d = forward_input(p, first + c, false) - mean;
        squares += d * d;
    }
    const float rstd = 1.0f / sqrtf(warp_sum(squares) / n + p.eps);
    if (lane == 0) store_statistics(p, row, mean, rstd);
    for (long long c = lane; c < p.cols; c += kWarp) store_y(p, first, c, mean, rstd);
}

template <typename T, typename W>
__global__ void backward_warp_per_row(Backward<T, W> p) {
    const int lane = threadIdx.x % kWarp;
    const long long row = blockIdx.x * (long long)(blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (row >= p.rows) return;
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    const float mean = p.layer ? p.mean[row] : 0.0f, rstd = p.rstd[row];
    float sum_g = 0.0f, sum_g_x_hat = 0.0f;
    for (long long c = lane; c < p.cols; c += kWarp) {
        const float g = g_at(p, first, c);
        sum_g += g;
        sum_g_x_hat += g * x_hat_at(p, first + c, mean, rstd);
    }
    const float c1 = warp_sum(sum_g_x_hat) / n, c2 = p.layer ? warp_sum(sum_g) / n : 0.0f;
    for (long long c = lane; c < p.cols; c += kWarp) store_dx(p, first, c, mean, rstd, c1, c2);
}

// ---- dw and db, both versions: thread c sums column c over all rows. ------------------------
// dw = sum over rows of dy * x_hat, db = sum over rows of dy (plus the old values when
// accumulating; with no rows, just those). Neighbouring threads take neighbouring columns, so
// each row's loads are coalesced; the order of the additions is fixed (deterministic).
template <typename T, typename W>
__global__ void weight_grads_thread_per_column(Backward<T, W> p) {
    const long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (c >= p.cols) return;
    float dw = 0.0f, db = 0.0f;
    for (long long row = 0; row < p.rows; ++row) {
        const long long i = row * p.cols + c;
        const float mean = p.layer ? p.mean[row] : 0.0f;
        const float dy = to_float(p.dy[i]);
        dw += dy * x_hat_at(p, i, mean, p.rstd[row]);
        db += dy;
    }
    if (p.accumulate) {
        if (p.dweight) dw += to_float(p.dweight[c]);
        if (p.dbias) db += to_float(p.dbias[c]);
    }
    if (p.dweight) p.dweight[c] = from_float<W>(dw);
    if (p.dbias) p.dbias[c] = from_float<W>(db);
}

// ---- Host side. ------------------------------------------------------------------------------

constexpr int kThreads = 128;  // a block: 128 rows (version 1), 4 rows (version 2), 128 columns

unsigned blocks_for(long long items, long long per_block) {
    return (unsigned)((items + per_block - 1) / per_block);
}

void check_version(int version, const char* what) {
    if (version != 1 && version != 2)
        throw std::invalid_argument(std::string(what) + ": version must be 1 or 2, got " +
                                    std::to_string(version));
}

// Calls f(T{}, W{}) with T the storage type of x and W that of the weights (float, or T).
template <typename F>
void with_norm_types(ScalarType x_type, ScalarType w_type, const char* what, F&& f) {
    if (w_type != ScalarType::f32 && w_type != x_type)
        throw std::invalid_argument(std::string(what) + ": weights must be f32 or x's type");
    with_float_type(x_type, what, [&](auto x_tag) {
        if (w_type == ScalarType::f32) f(x_tag, float{});
        else f(x_tag, x_tag);
    });
}

}  // namespace

void norm_forward_reference(const NormForwardArgs& a, int version) {
    check_version(version, "norm_forward_reference");
    if (a.rows == 0 || a.cols == 0) return;
    with_norm_types(a.x_type, a.w_type, "norm_forward_reference", [&](auto x_tag, auto w_tag) {
        using T = decltype(x_tag);
        using W = decltype(w_tag);
        const Forward<T, W> p{a.rows, a.cols, a.eps, a.kind == NormKind::layer, a.zero_centered,
                              static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                              static_cast<T*>(a.h_out), static_cast<const W*>(a.weight),
                              static_cast<const W*>(a.bias), static_cast<T*>(a.y), a.mean,
                              a.rstd};
        if (version == 1)
            forward_thread_per_row<T, W>
                <<<blocks_for(a.rows, kThreads), kThreads, 0, stream()>>>(p);
        else
            forward_warp_per_row<T, W>
                <<<blocks_for(a.rows, kThreads / kWarp), kThreads, 0, stream()>>>(p);
        FG_LAUNCH_CHECK();
    });
}

void norm_backward_reference(const NormBackwardArgs& a, int version) {
    check_version(version, "norm_backward_reference");
    if (a.cols == 0) return;
    with_norm_types(a.x_type, a.w_type, "norm_backward_reference", [&](auto x_tag, auto w_tag) {
        using T = decltype(x_tag);
        using W = decltype(w_tag);
        const Backward<T, W> p{a.rows, a.cols, a.kind == NormKind::layer, a.zero_centered,
                               static_cast<const T*>(a.x), static_cast<const T*>(a.dy),
                               static_cast<const T*>(a.dh), static_cast<const W*>(a.weight),
                               a.mean, a.rstd, static_cast<T*>(a.dx),
                               static_cast<W*>(a.dweight), static_cast<W*>(a.dbias), a.accumulate};
        if (a.rows > 0) {
            if (version == 1)
                backward_thread_per_row<T, W>
                    <<<blocks_for(a.rows, kThreads), kThreads, 0, stream()>>>(p);
            else
                backward_warp_per_row<T, W>
                    <<<blocks_for(a.rows, kThreads / kWarp), kThreads, 0, stream()>>>(p);
            FG_LAUNCH_CHECK();
        }
        if (a.dweight || a.dbias) {  // also with no rows: zeros, or the old values kept
            weight_grads_thread_per_column<T, W>
                <<<blocks_for(a.cols, kThreads), kThreads, 0, stream()>>>(p);
            FG_LAUNCH_CHECK();
        }
    });
}

}  // namespace fg::kernels
