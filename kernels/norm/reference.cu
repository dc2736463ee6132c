// kernels/norm/reference.cu: the reference RMSNorm / LayerNorm kernels (the ladder of versions is
// in reference.h; the math in kernels/norm.h). In order: the arguments with typed pointers and
// small helpers; version 1, one thread per row; version 2, one warp per row; the dw / db kernel
// versions 1-3 share; version 3, the row in registers; version 4, lock-guarded partial rows;
// version 5, a persistent grid's partial rows; the column sum versions 4 and 5 share; the host
// entry points.
//
// Every row kernel makes the same passes over its row, accumulating in fp32:
//   forward:  (1) sum x, for the mean (with a fused residual, this pass first makes h = x + r,
//                 rounded to x's type, writes it out, and from then on the row is h);
//             (2) sum (x - mean)^2, for rstd; (3) y = x_hat * w' + b.
//   backward: (1) sum g and g * x_hat, for c1 and c2; (2) dx.
// Two passes for the variance, rather than sum x and sum x^2 in one, keep it accurate when the
// mean is large against the spread. RMSNorm is LayerNorm with the mean taken as 0.
#include <algorithm>
#include <cstdint>
#include <cuda/atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

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
    bool vectors;  // versions 3-5: every row may be read and written in 16-byte vectors
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

// ---- dw and db, versions 1-3: thread c sums column c over all rows. --------------------------
// dw = sum over rows of dy * x_hat, db = sum over rows of dy (zeros when there are no rows).
// Neighbouring threads take neighbouring columns, so each row's loads are coalesced; the order
// of the additions is fixed (deterministic). But there are only N threads, each looping over all
// M rows: at N = 384, three blocks for the whole GPU.
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
    if (p.dweight) p.dweight[c] = from_float<W>(dw);
    if (p.dbias) p.dbias[c] = from_float<W>(db);
}

// ---- Versions 3-5 share: 16-byte vectors, and a row laid over a group of threads. -----------
// A row of N values is read as 16-byte vectors (4 f32 or 8 bf16 / f16 values): vector v covers
// columns v * VEC .. v * VEC + VEC - 1. A row is laid over `tpr` threads (a power of two, 32 to
// 1024): thread t of the row holds vectors t, t + tpr, t + 2 tpr, ..., ITEMS of them, so a warp's
// 32 loads of a step are 512 neighbouring bytes. A block of blockDim.x threads works on
// blockDim.x / tpr rows at once, one per group of tpr threads.

template <typename T>
struct alignas(16) Vec16 {
    static constexpr int kSize = 16 / sizeof(T);
    T v[kSize];
};

// The vector at column c of a row: one 16-byte load where the call allows (every pointer 16-byte
// aligned and N a whole number of vectors), else value by value, zeros past the row's end.
template <typename T>
__device__ Vec16<T> load_vec16(const T* row, long long c, long long cols, bool vectors) {
    if (vectors) return *reinterpret_cast<const Vec16<T>*>(row + c);
    Vec16<T> out;
#pragma unroll
    for (int k = 0; k < Vec16<T>::kSize; ++k)
        out.v[k] = c + k < cols ? row[c + k] : from_float<T>(0.0f);
    return out;
}
template <typename T>
__device__ void store_vec16(T* row, long long c, long long cols, bool vectors, const Vec16<T>& x) {
    if (vectors) {
        *reinterpret_cast<Vec16<T>*>(row + c) = x;
        return;
    }
#pragma unroll
    for (int k = 0; k < Vec16<T>::kSize; ++k)
        if (c + k < cols) row[c + k] = x.v[k];
}

// VEC weights (or biases) from column c, as floats plus `shift` (1 for a zero-centred weight);
// `absent` for every column when there is no such tensor. 16-byte loads where the call allows,
// as for the row (f32 weights of a 16-bit row: two loads); one value at a time otherwise.
// (Loaded one value at a time with 16-byte rows, a warp's loads of a column would be VEC values
// apart: VEC times the memory requests of the row's own.)
template <typename W, int VEC>
__device__ void load_affine16(const W* ptr, long long c, long long cols, bool vectors, float shift,
                              float absent, float (&out)[VEC]) {
    constexpr int kPer = Vec16<W>::kSize;  // VEC is a multiple: W is at least as wide as T
#pragma unroll
    for (int j = 0; j < VEC; j += kPer) {
        Vec16<W> v;
        if (ptr && vectors) v = *reinterpret_cast<const Vec16<W>*>(ptr + c + j);
#pragma unroll
        for (int q = 0; q < kPer; ++q) {
            const bool here = ptr && c + j + q < cols;
            out[j + q] =
                !here ? absent : (vectors ? to_float(v.v[q]) : to_float(ptr[c + j + q])) + shift;
        }
    }
}

// Where this thread is: `group`, its row's place in the block; `lane`, its place in the row.
struct RowThreads {
    int tpr, group, lane, rows_per_block;
    __device__ explicit RowThreads(int threads_a_row)
        : tpr(threads_a_row),
          group((int)threadIdx.x / threads_a_row),
          lane((int)threadIdx.x % threads_a_row),
          rows_per_block((int)blockDim.x / threads_a_row) {}
    // The first column of this thread's vector i.
    template <int VEC>
    __device__ long long column(int i) const {
        return ((long long)i * tpr + lane) * VEC;
    }
};

// Sum of v over the tpr threads of each row; every thread gets its row's. Warps first (shuffles),
// then, for rows of several warps, the warps' sums through shared memory (`scratch`: 32 floats).
// Has barriers when tpr > 32: every thread of the block calls it.
__device__ float row_sum(float v, int tpr, float* scratch) {
    v = warp_sum(v);
    if (tpr <= kWarp) return v;
    const int warp = (int)threadIdx.x / kWarp, warps_a_row = tpr / kWarp;
    const int first = warp / warps_a_row * warps_a_row;
    __syncthreads();  // scratch may still be read by the previous call
    if (threadIdx.x % kWarp == 0) scratch[warp] = v;
    __syncthreads();
    float sum = 0.0f;
    for (int w = first; w < first + warps_a_row; ++w) sum += scratch[w];
    return sum;
}

// ---- Version 3: the row in registers, read in 16-byte vectors. ------------------------------
// The same math as versions 1 and 2. A thread loads its vectors of the row once, keeps them in
// registers through the row sums, and computes its outputs from them: x is read from memory once
// (versions 1 and 2 read it two or three times), each load instruction moves 16 bytes (4-8
// values, where version 2 moved one), and short rows share a block. dw and db: still the column
// kernel above.

template <typename T, typename W, int ITEMS>
__global__ void __launch_bounds__(512)
    forward_row_in_registers(Forward<T, W> p, int tpr, bool vectors) {
    constexpr int VEC = Vec16<T>::kSize;
    __shared__ float scratch[32];
    const RowThreads at(tpr);
    const long long row = blockIdx.x * (long long)at.rows_per_block + at.group;
    const bool active = row < p.rows;  // no early return: row_sum has barriers
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    Vec16<T> h[ITEMS];  // the row (h = x + r when the residual is fused), as stored
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long c = at.column<VEC>(i);
        if (!active || c >= p.cols) continue;
        h[i] = load_vec16(p.x + first, c, p.cols, vectors);
        if (p.residual) {
            const Vec16<T> r = load_vec16(p.residual + first, c, p.cols, vectors);
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                h[i].v[k] = from_float<T>(to_float(h[i].v[k]) + to_float(r.v[k]));
            store_vec16(p.h_out + first, c, p.cols, vectors, h[i]);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += to_float(h[i].v[k]);  // zeros past the end
    }
    const float mean = p.layer ? row_sum(sum, tpr, scratch) / n : 0.0f;
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long c = at.column<VEC>(i);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            if (!active || c + k >= p.cols) continue;
            const float d = to_float(h[i].v[k]) - mean;
            squares += d * d;
        }
    }
    const float rstd = 1.0f / sqrtf(row_sum(squares, tpr, scratch) / n + p.eps);
    if (!active) return;  // no barrier below
    if (at.lane == 0) store_statistics(p, row, mean, rstd);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long c = at.column<VEC>(i);
        if (c >= p.cols) continue;
        Vec16<T> y;
        float w[VEC], b[VEC];
        load_affine16(p.weight, c, p.cols, vectors, p.zero_centered ? 1.0f : 0.0f, 1.0f, w);
        load_affine16(p.bias, c, p.cols, vectors, 0.0f, 0.0f, b);
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            y.v[k] = from_float<T>((to_float(h[i].v[k]) - mean) * rstd * w[k] + b[k]);
        store_vec16(p.y + first, c, p.cols, vectors, y);
    }
}

// One row of the backward with the row in registers: dx, and (SUMS) the row's dy * x_hat and dy
// added into the thread's column sums dw, db (versions 4 and 5). All threads of the block call it
// (row_sum); `row` may lie past the last row (then it does nothing but take part in the sums).
template <bool SUMS, typename T, typename W, int ITEMS, int VEC = Vec16<T>::kSize>
__device__ void backward_row(const Backward<T, W>& p, const RowThreads& at, long long row,
                             float* scratch, float (&dw)[ITEMS][VEC], float (&db)[ITEMS][VEC]) {
    const bool active = row < p.rows;
    const long long first = row * p.cols;
    const float n = (float)p.cols;
    const float mean = p.layer && active ? p.mean[row] : 0.0f;
    const float rstd = active ? p.rstd[row] : 0.0f;
    Vec16<T> x[ITEMS], dy[ITEMS];
    float sum_g = 0.0f, sum_g_x_hat = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long c = at.column<VEC>(i);
        if (!active || c >= p.cols) continue;
        x[i] = load_vec16(p.x + first, c, p.cols, p.vectors);
        dy[i] = load_vec16(p.dy + first, c, p.cols, p.vectors);
        float w[VEC];
        load_affine16(p.weight, c, p.cols, p.vectors, p.zero_centered ? 1.0f : 0.0f, 1.0f, w);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {  // past the row's end x = dy = 0: nothing is added
            const float x_hat = (to_float(x[i].v[k]) - mean) * rstd, d = to_float(dy[i].v[k]);
            const float g = w[k] * d;
            sum_g += g;
            sum_g_x_hat += g * x_hat;
            if (SUMS) {
                dw[i][k] += d * x_hat;
                db[i][k] += d;
            }
        }
    }
    const float c1 = row_sum(sum_g_x_hat, at.tpr, scratch) / n;
    const float c2 = p.layer ? row_sum(sum_g, at.tpr, scratch) / n : 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const long long c = at.column<VEC>(i);
        if (!active || c >= p.cols) continue;
        Vec16<T> dh, dx;
        if (p.dh) dh = load_vec16(p.dh + first, c, p.cols, p.vectors);
        float w[VEC];  // read again (from L1) rather than held: registers go to the row
        load_affine16(p.weight, c, p.cols, p.vectors, p.zero_centered ? 1.0f : 0.0f, 1.0f, w);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float x_hat = (to_float(x[i].v[k]) - mean) * rstd;
            const float g = w[k] * to_float(dy[i].v[k]);
            const float d = (g - x_hat * c1 - c2) * rstd;
            dx.v[k] = from_float<T>(p.dh ? d + to_float(dh.v[k]) : d);
        }
        store_vec16(p.dx + first, c, p.cols, p.vectors, dx);
    }
}

template <typename T, typename W, int ITEMS>
__global__ void __launch_bounds__(512) backward_row_in_registers(Backward<T, W> p, int tpr) {
    constexpr int VEC = Vec16<T>::kSize;
    __shared__ float scratch[32];
    float unused[ITEMS][VEC];
    const RowThreads at(tpr);
    backward_row<false>(p, at, blockIdx.x * (long long)at.rows_per_block + at.group, scratch,
                        unused, unused);
}

// ---- Versions 4 and 5: dw and db summed in the same pass as dx. -----------------------------
// A block no longer takes one row group and leaves: a grid of as many blocks as the GPU holds at
// once strides over the row groups (block b: groups b, b + B, b + 2B, ...), and each thread adds
// its columns' dy * x_hat and dy into fp32 registers as it goes (backward_row with SUMS). After
// its last row a block holds the sums of its rows; what remains is to add B such rows of sums.
// Version 4 adds them into G < B shared partial rows under locks, version 5 gives each block a
// partial row of its own; then one column sum over the partial rows writes dw and db.

// Adds this block's column sums into partial row `dst` (N floats), the block's row groups one
// after the other (threads of different groups hold the same columns); `store_first`: the first
// group stores instead of adding (the row belongs to this block alone). Loads and stores go to
// L2 (__ldcg, __stcg): other SMs write these rows, and an SM's L1 is not kept coherent with them.
template <typename T, int ITEMS, int VEC = Vec16<T>::kSize>
__device__ void add_to_partial_row(float* dst, const float (&sums)[ITEMS][VEC],
                                   const RowThreads& at, long long cols, bool store_first) {
    for (int group = 0; group < at.rows_per_block; ++group) {
        if (group == at.group) {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                const long long c = at.column<VEC>(i);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    if (c + k >= cols) continue;
                    const bool store = store_first && group == 0;
                    __stcg(dst + c + k, store ? sums[i][k] : __ldcg(dst + c + k) + sums[i][k]);
                }
            }
        }
        __syncthreads();  // this group's adds are done (and visible to the block) before the next
    }
}

// ---- Version 4: lock-guarded partial rows. ---------------------------------------------------
// dw_partial[g] = sum of the column sums of blocks g, g + G, g + 2G, ...; then dw = sum over g.
// Block b adds its sums into partial row g = b mod G while it holds lock g, so that no two
// blocks read-modify-write a row at once. G is B / 2 (rounded up): the blocks finish their rows at about the
// same time, so each lock's queue is as deep as the blocks sharing it (two), and the column sum
// reads half the rows version 5's does. The rows start at zero (the host clears them in-stream).
// The order in which blocks take a lock varies from run to run, so the last bits of dw and db do.
//
// The lock's memory ordering, written out:
//   acquire: thread 0 swaps 1 into the lock until it gets 0 back, with acquire order: no read
//     of the partial row that follows can be served from before the lock was seen free, so the
//     block reads the row as the last holder left it. The barrier then holds the block's other
//     threads until thread 0 has the lock (and passes its acquire on to them).
//   release: every thread fences (__threadfence: its adds are visible device-wide before
//     anything it does later), the barrier waits until all have, and only then does thread 0
//     store 0 with release order. The next holder's acquire, which reads that 0, therefore sees
//     every add. Without the fence and barrier the lock could be seen free while some adds were
//     still on their way, and two blocks would lose each other's updates.
__device__ void acquire_lock(int* lock) {
    if (threadIdx.x == 0) {
        cuda::atomic_ref<int, cuda::thread_scope_device> l(*lock);
        while (l.exchange(1, cuda::memory_order_acquire) != 0) {
        }
    }
    __syncthreads();
}
__device__ void release_lock(int* lock) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        cuda::atomic_ref<int, cuda::thread_scope_device>(*lock).store(0,
                                                                      cuda::memory_order_release);
}

template <typename T, typename W, int ITEMS>
__global__ void __launch_bounds__(512)
    backward_locked_partial_rows(Backward<T, W> p, int tpr, float* partial_dw, float* partial_db,
                                 int* locks, int lock_rows) {
    constexpr int VEC = Vec16<T>::kSize;
    __shared__ float scratch[32];
    const RowThreads at(tpr);
    float dw[ITEMS][VEC] = {}, db[ITEMS][VEC] = {};
    const long long groups = (p.rows + at.rows_per_block - 1) / at.rows_per_block;
    for (long long rg = blockIdx.x; rg < groups; rg += gridDim.x)
        backward_row<true>(p, at, rg * at.rows_per_block + at.group, scratch, dw, db);
    if (!p.dweight && !p.dbias) return;
    const int g = (int)(blockIdx.x % lock_rows);
    acquire_lock(&locks[g]);
    if (p.dweight) add_to_partial_row<T>(partial_dw + g * p.cols, dw, at, p.cols, false);
    if (p.dbias) add_to_partial_row<T>(partial_db + g * p.cols, db, at, p.cols, false);
    release_lock(&locks[g]);
}

// ---- Version 5: a persistent grid, a partial row per block. ----------------------------------
// dw_partial[b] = the column sums of block b; then dw = sum over b. The grid is sized to the
// GPU, not to M, so the (B, N) buffer stays small however many rows there are. Each block writes
// only its own partial row, with plain stores: no lock, no atomic, no clearing first; and the
// column sum adds in a fixed order, so dw and db are the same bits on every run.
template <typename T, typename W, int ITEMS>
__global__ void __launch_bounds__(512)
    backward_grid_partial_rows(Backward<T, W> p, int tpr, float* partial_dw, float* partial_db) {
    constexpr int VEC = Vec16<T>::kSize;
    __shared__ float scratch[32];
    const RowThreads at(tpr);
    float dw[ITEMS][VEC] = {}, db[ITEMS][VEC] = {};
    const long long groups = (p.rows + at.rows_per_block - 1) / at.rows_per_block;
    for (long long rg = blockIdx.x; rg < groups; rg += gridDim.x)
        backward_row<true>(p, at, rg * at.rows_per_block + at.group, scratch, dw, db);
    const long long b = blockIdx.x;
    if (p.dweight) add_to_partial_row<T>(partial_dw + b * p.cols, dw, at, p.cols, true);
    if (p.dbias) add_to_partial_row<T>(partial_db + b * p.cols, db, at, p.cols, true);
}

// ---- Versions 4 and 5: the column sum of R partial rows. -------------------------------------
// out[c] = sum over r of partial[r][c]. A block of 32 x 8 threads takes 32 columns; thread row s
// adds partial rows s, s + 8, s + 16, ... (eight rows' loads in flight per column, not one), and
// the eight sums are then added in order through shared memory: a fixed order, the same bits
// for the same R. blockIdx.y: 0 for dw, 1 for db. With R = 0 (no rows): zeros.
template <typename W>
__global__ void sum_partial_rows(const float* partial_dw, const float* partial_db, int R,
                                 long long cols, W* dw, W* db) {
    constexpr int kSlices = 8;
    __shared__ float tile[kSlices][kWarp + 1];
    const float* partial = blockIdx.y == 0 ? partial_dw : partial_db;
    W* out = blockIdx.y == 0 ? dw : db;
    if (!out) return;  // the whole block: no barrier is skipped by some threads only
    const long long c = blockIdx.x * (long long)kWarp + threadIdx.x;
    float s = 0.0f;
    if (c < cols)
        for (int r = threadIdx.y; r < R; r += kSlices) s += __ldcg(partial + r * cols + c);
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= cols) return;
    float total = 0.0f;
    for (int k = 0; k < kSlices; ++k) total += tile[k][threadIdx.x];
    out[c] = from_float<W>(total);
}

// ---- Host side. ------------------------------------------------------------------------------

constexpr int kThreads = 128;  // versions 1, 2: 128 rows (v1), 4 rows (v2) or 128 columns a block

unsigned blocks_for(long long items, long long per_block) {
    return (unsigned)((items + per_block - 1) / per_block);
}

void check_version(int version, const char* what) {
    if (version < 1 || version > kNormReferenceVersions)
        throw std::invalid_argument(std::string(what) + ": version must be 1 to " +
                                    std::to_string(kNormReferenceVersions) + ", got " +
                                    std::to_string(version));
}

// Calls f(T{}, W{}) with T the storage type of x and W that of the weights (float, or T).
template <typename F>
void with_norm_types(ScalarType x_type, ScalarType w_type, const char* what, F&& f) {
    if (w_type != ScalarType::f32 && w_type != x_type)
        throw std::invalid_argument(std::string(what) + ": weights must be f32 or x's type");
    with_float_type(x_type, what, [&](auto x_tag) {
        if (w_type == ScalarType::f32)
            f(x_tag, float{});
        else
            f(x_tag, x_tag);
    });
}

// Versions 3-5: how a row of `cols` values of `elem_bytes` is laid over threads. A row gets
// threads for `per_thread` vectors each (32 to 512 of them: a thread may then use 128
// registers), a block at least 256 threads. The forward takes two vectors a thread, the backward
// one: two vectors' sums in versions 4 and 5 cost so many registers that an SM held few threads,
// and one vector a thread leaves short forward rows' lanes idle (docs/norms.md section 3 has
// both measurements). A thread holds at most 8 vectors, so rows of more than 4096 vectors (32768
// bf16, 16384 f32 values) throw; versions 4 and 5 (`sums`) also keep two fp32 sums a column, at
// most 16 columns a thread: rows of at most 8192 values. The persistent grid of versions 4 and 5:
// as many blocks as the GPU holds at once by their thread count, at most one per row group (the
// count of threads only: registers may hold fewer at once, which the grid loop tolerates).
struct RegisterLayout {
    int vec = 1, tpr = 32, items = 1, threads = 256;
    long long groups = 0;  // row groups: blocks of version 3
    long long grid = 0;    // blocks of versions 4 and 5: B
    int lock_rows = 0;     // version 4's G
};

constexpr int kMaxThreadsARow = 512;  // the kernels' __launch_bounds__
constexpr int kMaxItems = 8;
constexpr int kMaxSumColumns = 16;

RegisterLayout register_layout(long long rows, long long cols, int elem_bytes, int per_thread,
                               bool sums, const char* what) {
    RegisterLayout l;
    l.vec = 16 / elem_bytes;
    const long long nvec = (cols + l.vec - 1) / l.vec;
    while (l.tpr < kMaxThreadsARow && (long long)l.tpr * per_thread < nvec) l.tpr *= 2;
    while (l.items * (long long)l.tpr < nvec) l.items *= 2;
    if (l.items > kMaxItems)
        throw std::invalid_argument(std::string(what) + ": versions 3-5 hold at most " +
                                    std::to_string(kMaxThreadsARow * kMaxItems * l.vec) +
                                    " values a row in registers, got " + std::to_string(cols));
    if (sums && l.items * l.vec > kMaxSumColumns)
        throw std::invalid_argument(std::string(what) +
                                    ": versions 4 and 5 keep the sums of at "
                                    "most 16 columns a thread, in rows of at most " +
                                    std::to_string(kMaxThreadsARow * kMaxSumColumns) +
                                    " values, got " + std::to_string(cols));
    l.threads = std::max(l.tpr, 256);
    const long long rows_per_block = l.threads / l.tpr;
    l.groups = (rows + rows_per_block - 1) / rows_per_block;
    const DeviceInfo& d = device_info();
    const long long resident =
        (long long)d.sm_count * std::max(1, d.max_threads_per_sm / l.threads);
    l.grid = std::max(1LL, std::min(l.groups, resident));
    l.lock_rows = (int)((l.grid + 1) / 2);
    return l;
}

// Calls f(std::integral_constant<int, ITEMS>{}) for ITEMS = items (1, 2, 4 or 8).
template <typename F>
void with_register_items(int items, F&& f) {
    switch (items) {
        case 1:
            f(std::integral_constant<int, 1>{});
            return;
        case 2:
            f(std::integral_constant<int, 2>{});
            return;
        case 4:
            f(std::integral_constant<int, 4>{});
            return;
        default:
            f(std::integral_constant<int, kMaxItems>{});
            return;
    }
}

bool aligned16(const void* p) {
    return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Partial rows of versions 4 (G) and 5 (B) in the workspace: dw's, then db's, then G locks.
struct PartialRows {
    float* dw;
    float* db;
    int* locks;
    long long rows;
};
PartialRows partial_rows_in(void* workspace, long long rows, long long cols) {
    float* base = static_cast<float*>(workspace);
    return {base, base + rows * cols, reinterpret_cast<int*>(base + 2 * rows * cols), rows};
}
long long partial_row_count(const RegisterLayout& l, int version) {
    return version == 4 ? l.lock_rows : version == 5 ? l.grid : 0;
}

}  // namespace

void norm_forward_reference(const NormForwardArgs& a, int version) {
    check_version(version, "norm_forward_reference");
    if (a.rows == 0 || a.cols == 0) return;
    with_norm_types(a.x_type, a.w_type, "norm_forward_reference", [&](auto x_tag, auto w_tag) {
        using T = decltype(x_tag);
        using W = decltype(w_tag);
        const Forward<T, W> p{a.rows,
                              a.cols,
                              a.eps,
                              a.kind == NormKind::layer,
                              a.zero_centered,
                              static_cast<const T*>(a.x),
                              static_cast<const T*>(a.residual),
                              static_cast<T*>(a.h_out),
                              static_cast<const W*>(a.weight),
                              static_cast<const W*>(a.bias),
                              static_cast<T*>(a.y),
                              a.mean,
                              a.rstd};
        if (version == 1) {
            forward_thread_per_row<T, W>
                <<<blocks_for(a.rows, kThreads), kThreads, 0, stream()>>>(p);
        } else if (version == 2) {
            forward_warp_per_row<T, W>
                <<<blocks_for(a.rows, kThreads / kWarp), kThreads, 0, stream()>>>(p);
        } else {  // versions 3-5 share the forward with the row in registers
            const RegisterLayout l =
                register_layout(a.rows, a.cols, sizeof(T), 2, false, "norm_forward_reference");
            bool vectors = a.cols % l.vec == 0;
            for (const void* ptr :
                 {a.x, a.residual, (const void*)a.h_out, (const void*)a.y, a.weight, a.bias})
                vectors = vectors && aligned16(ptr);
            with_register_items(l.items, [&](auto items) {
                forward_row_in_registers<T, W, decltype(items)::value>
                    <<<(unsigned)l.groups, l.threads, 0, stream()>>>(p, l.tpr, vectors);
            });
        }
        FG_LAUNCH_CHECK();
    });
}

std::size_t norm_backward_reference_workspace_bytes(const NormBackwardArgs& a, int version) {
    check_version(version, "norm_backward_reference_workspace_bytes");
    if (version < 4 || a.cols == 0 || (!a.dweight && !a.dbias)) return 0;
    const RegisterLayout l = register_layout(a.rows, a.cols, a.x_type == ScalarType::f32 ? 4 : 2,
                                             1, true, "norm_backward_reference");
    const long long rows = partial_row_count(l, version);
    return (std::size_t)rows * (2 * sizeof(float) * (std::size_t)a.cols + sizeof(int));
}

void norm_backward_reference(const NormBackwardArgs& a, int version) {
    check_version(version, "norm_backward_reference");
    if (a.cols == 0) return;
    const bool sums = a.dweight || a.dbias;
    if (version >= 4 && sums && !a.workspace)
        throw std::invalid_argument(
            "norm_backward_reference: versions 4 and 5 need a workspace "
            "(norm_backward_reference_workspace_bytes)");
    with_norm_types(a.x_type, a.w_type, "norm_backward_reference", [&](auto x_tag, auto w_tag) {
        using T = decltype(x_tag);
        using W = decltype(w_tag);
        Backward<T, W> p{a.rows,
                         a.cols,
                         a.kind == NormKind::layer,
                         a.zero_centered,
                         static_cast<const T*>(a.x),
                         static_cast<const T*>(a.dy),
                         static_cast<const T*>(a.dh),
                         static_cast<const W*>(a.weight),
                         a.mean,
                         a.rstd,
                         static_cast<T*>(a.dx),
                         static_cast<W*>(a.dweight),
                         static_cast<W*>(a.dbias),
                         false};
        RegisterLayout l;
        if (version >= 3) {
            l = register_layout(a.rows, a.cols, sizeof(T), 1, version >= 4,
                                "norm_backward_reference");
            p.vectors = a.cols % l.vec == 0;
            for (const void* ptr : {a.x, a.dy, a.dh, (const void*)a.dx, a.weight})
                p.vectors = p.vectors && aligned16(ptr);
        }
        if (version <= 3) {  // dx row by row, then dw / db by the column kernel
            if (a.rows > 0) {
                if (version == 1)
                    backward_thread_per_row<T, W>
                        <<<blocks_for(a.rows, kThreads), kThreads, 0, stream()>>>(p);
                else if (version == 2)
                    backward_warp_per_row<T, W>
                        <<<blocks_for(a.rows, kThreads / kWarp), kThreads, 0, stream()>>>(p);
                else
                    with_register_items(l.items, [&](auto items) {
                        backward_row_in_registers<T, W, decltype(items)::value>
                            <<<(unsigned)l.groups, l.threads, 0, stream()>>>(p, l.tpr);
                    });
                FG_LAUNCH_CHECK();
            }
            if (sums) {  // also with no rows: zeros
                weight_grads_thread_per_column<T, W>
                    <<<blocks_for(a.cols, kThreads), kThreads, 0, stream()>>>(p);
                FG_LAUNCH_CHECK();
            }
            return;
        }
        // Versions 4 and 5: the grid's pass (dx and the partial rows), then the column sum.
        PartialRows part{};
        if (sums) part = partial_rows_in(a.workspace, partial_row_count(l, version), a.cols);
        if (a.rows > 0) {
            if (version == 4 && sums)  // the rows and locks start at 0; in-stream, no host sync
                memset_device(part.dw, 0, part.rows * (2 * sizeof(float) * a.cols + sizeof(int)));
            with_register_items(l.items, [&](auto items) {
                constexpr int kItems = decltype(items)::value;
                // Only the shares register_layout allows are built (more would spill).
                if constexpr (kItems * Vec16<T>::kSize <= kMaxSumColumns) {
                    if (version == 4)
                        backward_locked_partial_rows<T, W, kItems>
                            <<<(unsigned)l.grid, l.threads, 0, stream()>>>(
                                p, l.tpr, part.dw, part.db, part.locks, l.lock_rows);
                    else
                        backward_grid_partial_rows<T, W, kItems>
                            <<<(unsigned)l.grid, l.threads, 0, stream()>>>(p, l.tpr, part.dw,
                                                                           part.db);
                }
            });
            FG_LAUNCH_CHECK();
        }
        if (sums) {
            const int partial_rows = a.rows > 0 ? (int)part.rows : 0;  // none: zeros
            sum_partial_rows<W>
                <<<dim3(blocks_for(a.cols, kWarp), 2), dim3(kWarp, 8), 0, stream()>>>(
                    part.dw, part.db, partial_rows, a.cols, p.dweight, p.dbias);
            FG_LAUNCH_CHECK();
        }
    });
}

}  // namespace fg::kernels
