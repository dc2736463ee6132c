// kernels/norm_forward.cu: RMSNorm / LayerNorm forward (math in norm.h).
// One pass over x in registers: load the row (adding the residual and writing h if fused), reduce
// the statistics over the row's threads, write y. On Hopper, persistent blocks have the copy
// engine stage their next row groups in shared memory while they work (rows too long for one
// block are split over a cluster); elsewhere, or without 16-byte vectors, a block per row group
// holds its row in registers and has the rows of a block one wave later brought into L2. Rows
// too long for registers take the looped kernel, which reads the row twice (mostly from L2).
#include <algorithm>
#include <type_traits>

#include "norm_common.cuh"
#include "runtime.h"

namespace fg::kernels {
namespace {

using namespace norm_detail;

constexpr int kForwardElems = 32;  // the most a tuning may ask: elements of x per thread
NormTuning g_tuning;

template <typename T, typename W>
struct ForwardParams {
    long long rows, cols;
    float eps;
    float inv_n;  // 1 / cols, rounded once on the host
    bool zero_centered;
    // A weight, not zero-centred, and a bias exactly for LayerNorm (usual_affine): the kernels
    // take their compile-time path for that case (load_affine's kAffineWeight(Bias)).
    bool usual_affine;
    const T* x;
    const T* residual;
    T* h_out;
    const W* weight;
    const W* bias;
    T* y;
    float* mean;
    float* rstd;
};

// Loads x (+ residual, rounded to T and stored as h) for one vector, kept in the storage type
// (a bf16 vector of 8 takes 4 registers, not 8): the register kernel converts as it goes.
template <typename T, typename W, int VEC>
__device__ __forceinline__ void load_input_pack(const ForwardParams<T, W>& p, long long offset,
                                                Pack<T, VEC>& v) {
    v = *reinterpret_cast<const Pack<T, VEC>*>(p.x + offset);
    if (p.residual) {
        Pack<T, VEC> r = *reinterpret_cast<const Pack<T, VEC>*>(p.residual + offset);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v.v[k] = from_float<T>(to_float(v.v[k]) + to_float(r.v[k]));
        *reinterpret_cast<Pack<T, VEC>*>(p.h_out + offset) = v;  // normalise exactly this h
    }
}

// The looped kernel's first read of a vector: x asked to stay in L2 for the second read, or, with
// the residual fused, x + r rounded to T and stored as h (which the second pass reads back).
template <typename T, typename W, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_input_keep(const ForwardParams<T, W>& p,
                                                        long long offset) {
    if (!p.residual) return load_pack_keep<T, VEC>(p.x + offset);
    Pack<T, VEC> h;
    load_input_pack<T, W, VEC>(p, offset, h);
    return h;
}

// The row's first value as normalised (h when the residual is fused), for the shifted sums.
template <typename T, typename W>
__device__ __forceinline__ float row_first(const ForwardParams<T, W>& p, long long base) {
    if (!p.residual) return to_float(p.x[base]);
    return to_float(from_float<T>(to_float(p.x[base]) + to_float(p.residual[base])));
}

// The row group `ahead` groups after this block's (0: none) is brought into L2 while the block
// works: blocks start in about index order, so with `ahead` = the blocks resident at once, it is
// the group the block taking this one's place will need.
template <typename T, typename W>
__device__ __forceinline__ void prefetch_forward(const ForwardParams<T, W>& p, long long ahead,
                                                 int rpb) {
    if (ahead == 0) return;
    prefetch_row_group(p.x, blockIdx.x + ahead, rpb, p.rows, p.cols);
    prefetch_row_group(p.residual, blockIdx.x + ahead, rpb, p.rows, p.cols);
}

// The row's mean (LayerNorm; RMSNorm: 0) and rstd from its sums over the row's N values:
// LayerNorm, the shifted sums (sum d, sum d^2) of d = x - shift, any shift near the mean keeping
// var = E[d^2] - E[d]^2 exact enough (the kernels take the row's first value); RMSNorm, sum x^2.
template <bool LAYER>
__device__ __forceinline__ void row_statistics(float2 sums, float shift, float inv_n, float eps,
                                               float& mu, float& rstd) {
    float var;
    if (LAYER) {
        const float da = sums.x * inv_n;
        mu = shift + da;
        var = fmaxf(sums.y * inv_n - da * da, 0.0f);
    } else {
        mu = 0.0f;
        var = sums.x * inv_n;
    }
    // The hardware's reciprocal square root, within 2 ulp (1 / sqrtf would cost a correctly
    // rounded square root and a division per row).
    rstd = rsqrtf(var + eps);
}

// The row's sums over its tpr threads (row_statistics' input). Contains barriers when tpr > 32:
// call from every thread of the block.
template <bool LAYER>
__device__ __forceinline__ float2 forward_row_sums(float a, float q, int tpr, float* scratch) {
    if (LAYER) return group_sum2(make_float2(a, q), tpr, scratch);
    return make_float2(group_sum(a, tpr, scratch), 0.0f);
}

// Threads holding at most 64 bytes of the row (16 f32 or 32 bf16 values) fit in 64 registers, so
// 1024-thread blocks (rows of up to 16384 f32 / 32768 bf16 values) work; larger holdings use
// 512-thread blocks rather than spill. f32 weights for a bf16 / f16 row count at their size
// (their loads for all the thread's columns are in flight together at the end).
template <typename T, typename W>
constexpr int forward_bytes_per_elem() {
    return sizeof(W) > sizeof(T) ? (int)sizeof(W) : (int)sizeof(T);
}
template <typename T, typename W, int VEC, int ITEMS>
constexpr int forward_max_threads() {
    return ITEMS * VEC * forward_bytes_per_elem<T, W>() <= 64 ? 1024 : 512;
}

// Whether a register kernel has the usual-affine path (load_affine's kAffineWeight(Bias)) beside
// the run-time one: not for 2-byte weights on threads holding the most values (kForwardElems),
// where the second path spilled 16-28 bytes (-Xptxas -v, sm_90; bf16, 4 vectors a thread).
template <typename W, int VEC, int ITEMS>
constexpr bool register_usual_path() {
    return !(sizeof(W) == 2 && ITEMS * VEC == kForwardElems);
}

// TPR: the threads a row when known at compile time (4 to 128: the row sums are a fixed chain of
// shuffles, plus one exchange through shared memory over 32; the row place is two constant
// masks), or 0 for the run-time `tpr` (any power of two up to 1024). ITEMS need not be a power
// of two for TPR > 0 (a row of 48 vectors: 16 threads of 3). Columns within a row are 32-bit
// offsets from the row's start (a row held in registers has at most 2^16 values).
template <typename T, typename W, int VEC, int ITEMS, bool LAYER, int TPR>
__global__ void __launch_bounds__(forward_max_threads<T, W, VEC, ITEMS>(), 1)
    norm_forward_kernel(ForwardParams<T, W> p, int tpr_arg, long long prefetch_ahead) {
    __shared__ float scratch[64];
    const int tpr = TPR > 0 ? TPR : tpr_arg;
    const RowPlace place = row_place(tpr);
    const int rpb = place.rows_per_block, group = place.group, lane = place.lane;
    prefetch_forward(p, prefetch_ahead, rpb);
    const long long row = (long long)blockIdx.x * rpb + group;
    const bool active = row < p.rows;
    const long long base = row * p.cols;
    const int cols = active ? (int)p.cols : 0;  // an inactive row loads nothing
    Pack<T, VEC> v[ITEMS];
    float s = 0.0f;  // RMSNorm: sum x^2
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = (i * tpr + lane) * VEC;
        if (col < cols) {
            load_input_pack<T, W, VEC>(p, base + col, v[i]);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[i].v[k] = from_float<T>(0.0f);
        }
        if (!LAYER)
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += to_float(v[i].v[k]) * to_float(v[i].v[k]);
    }
    // LayerNorm: one reduction of shifted sums (row_statistics), the shift (the row's first
    // value) from L1; the data are in registers.
    const float shift = LAYER && active ? row_first(p, base) : 0.0f;
    float a = s, q = 0.0f;
    if (LAYER) {
        a = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int col = (i * tpr + lane) * VEC;
            if (col < cols) {
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = to_float(v[i].v[k]) - shift;
                    a += d;
                    q += d * d;
                }
            }
        }
    }
    float mu, rstd;
    row_statistics<LAYER>(forward_row_sums<LAYER>(a, q, tpr, scratch), shift,
                          p.inv_n, p.eps, mu, rstd);
    if (!active) return;
    if (lane == 0 && p.rstd) {
        p.rstd[row] = rstd;
        if (LAYER) p.mean[row] = mu;
    }
    auto write_row = [&](auto affine_tag) {  // y, with the affine case as a constant
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int col = (i * tpr + lane) * VEC;
            if (col >= cols) continue;
            float w[VEC], b[VEC], out[VEC];
            load_affine<W, VEC, decltype(affine_tag)::value>(p.weight, p.bias, p.zero_centered,
                                                             col, w, b);
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                out[k] = (to_float(v[i].v[k]) - mu) * rstd * w[k] + b[k];
            store_vec_stream<T, VEC>(p.y + base + col, out);
        }
    };
    if constexpr (register_usual_path<W, VEC, ITEMS>()) {
        if (p.usual_affine) write_row(std::integral_constant<int, usual_affine(LAYER)>{});
        else write_row(std::integral_constant<int, kAffineAny>{});
    } else {
        write_row(std::integral_constant<int, kAffineAny>{});  // (p.usual_affine not read)
    }
}

// The most vectors a looped thread loads at once in its second pass, for UNROLL vectors a step:
// at two blocks an SM (UNROLL <= 4, 32 registers a thread) 2 (a batch of 4 spills), at one block
// an SM (UNROLL = 8, 64 registers) 4.
constexpr int max_loop_batch(int unroll) { return unroll > 4 ? 4 : unroll < 2 ? unroll : 2; }

// Whether the looped kernel has the usual-affine path beside the run-time one: for RMSNorm, and
// for LayerNorm of 2-byte values and weights one vector a batch. Not for LayerNorm of 2-byte
// values with f32 weights or two vectors a batch, where its unconditional w and b loads spilled
// 4-96 bytes at 32 registers (-Xptxas -v, sm_90) and the run-time path, in the same kernel,
// measured 5-8 points of copy lower (H200, bf16 LayerNorm 4096 x 8192 and longer); nor for f32
// LayerNorm, level at one step a row and a point lower at two (1024 x 32768: 74.0-74.2 against
// 74.9-75.0 on the H200 over two runs, 78.8 against 79.6 on the H100; bench_norm --sweep).
template <typename T, typename W, bool LAYER, int BATCH>
constexpr bool looped_usual_path() {
    return !LAYER || (sizeof(T) == 2 && sizeof(W) == 2 && BATCH == 1);
}

// Rows streamed twice through one block (rows too long for registers, and rows where this
// measured faster): the row goes by in steps of blockDim * VEC * UNROLL values, a thread having
// UNROLL vectors in flight at once. Pass one reads x (adding the residual and writing h, if
// fused) for the statistics, asking L2 to keep the lines; pass two reads x (or h) again, mostly
// from L2, marks the lines as last used and writes y, in batches of BATCH vectors a thread, all
// of a batch's loads issued before any y is stored (the compiler may not move a load past a
// store that could alias it). Columns are 32-bit offsets from the row's start (norm_forward
// takes rows of at most kNormMaxCols values).
template <typename T, typename W, int VEC, int UNROLL, bool LAYER, int BATCH>
__global__ void __launch_bounds__(1024, UNROLL <= 4 ? 2 : 1)
    norm_forward_looped_kernel(ForwardParams<T, W> p, long long prefetch_ahead) {
    static_assert(BATCH >= 1 && BATCH <= max_loop_batch(UNROLL));
    __shared__ float scratch[64];
    prefetch_forward(p, prefetch_ahead, 1);
    const long long row = blockIdx.x;
    const long long base = row * p.cols;
    const int cols = (int)p.cols;
    const int step = (int)blockDim.x * VEC;  // one vector of every thread
    const int first = (int)threadIdx.x * VEC;
    const T* const x_row = p.x + base;
    // After the first pass, read h back.
    const T* const src_row = (p.residual ? p.h_out : p.x) + base;
    T* const y_row = p.y + base;
    const float shift = LAYER ? row_first(p, base) : 0.0f;
    float s = 0.0f, q = 0.0f;  // RMSNorm: s = sum x^2; LayerNorm: s, q = sums of d, d^2, d = x - shift
    auto add = [&](const Pack<T, VEC>& v) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float x = to_float(v.v[k]), d = x - shift;
            s += LAYER ? d : x * x;
            q += d * d;
        }
    };
    int col = first;
    // Whole steps of x alone (a fused residual, two loads a vector, goes one vector at a time).
    if (!p.residual) {
        for (; col + (UNROLL - 1) * step < cols; col += UNROLL * step) {
            Pack<T, VEC> v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)  // every load issued before any is used
                v[u] = load_pack_keep<T, VEC>(x_row + col + u * step);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) add(v[u]);
        }
    }
    for (; col < cols; col += step) add(load_input_keep<T, W, VEC>(p, base + col));  // the rest
    float mu, rstd;  // shifted sums, as in the register kernel: one pass for both statistics
    row_statistics<LAYER>(forward_row_sums<LAYER>(s, q, blockDim.x, scratch), shift,
                          p.inv_n, p.eps, mu, rstd);
    if (threadIdx.x == 0 && p.rstd) {
        p.rstd[row] = rstd;
        if (LAYER) p.mean[row] = mu;
    }
    // Pass two, with the affine case as a constant.
    auto pass_two = [&](auto affine_tag) {
        auto write = [&](const Pack<T, VEC>& v, int c) {
            float w[VEC], b[VEC], out[VEC];
            load_affine<W, VEC, decltype(affine_tag)::value>(p.weight, p.bias, p.zero_centered,
                                                             c, w, b);
#pragma unroll
            for (int k = 0; k < VEC; ++k) out[k] = (to_float(v.v[k]) - mu) * rstd * w[k] + b[k];
            store_vec_stream<T, VEC>(y_row + c, out);
        };
        int c = first;
        for (; c + (BATCH - 1) * step < cols; c += BATCH * step) {  // whole batches
            Pack<T, VEC> v[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; ++u)
                v[u] = load_pack_last_use<T, VEC>(src_row + c + u * step);
#pragma unroll
            for (int u = 0; u < BATCH; ++u) write(v[u], c + u * step);
        }
        for (; c < cols; c += step) write(load_pack_last_use<T, VEC>(src_row + c), c);
    };
    if constexpr (looped_usual_path<T, W, LAYER, BATCH>()) {
        if (p.usual_affine) pass_two(std::integral_constant<int, usual_affine(LAYER)>{});
        else pass_two(std::integral_constant<int, kAffineAny>{});
    } else {
        pass_two(std::integral_constant<int, kAffineAny>{});  // (p.usual_affine not read)
    }
    if (threadIdx.x == 0) row_last_use<T, VEC>(src_row);
}

// Rows staged in shared memory (Hopper; see norm_common.cuh). A persistent block has the copy
// engine bring x (and the residual) of its row groups into one of `stages` buffers, up to
// `stages` groups ahead; its threads take their vectors from the stage into registers (h = x + r
// rounded to T, and written out, when the residual is fused) and hand the stage back for a later
// group at once, before the row sums: the copy engine keeps loading while the threads reduce and
// write y. y goes out the same way: the threads write it into one of two output buffers and
// thread 0 has the copy engine store it (cp.async.bulk shared -> global). The block's columns of
// weight and bias are copied in once and kept. Dynamic shared memory of a block:
//   [ stage 0 .. stage stages-1 | y buffer 0 | y buffer 1 | w' columns | b columns ]
//   stage s: [ x: rpb rows | residual: rpb rows ];  y buffer: rpb rows
// SPLIT: rows too long for a block are shared by the `parts` blocks of a cluster, block `part`
// staging columns [part * cols, (part + 1) * cols) of every row its cluster takes (one row per
// stage); the row sums are completed across the cluster (cluster_row_sums). LayerNorm's shift,
// the row's first value, comes from the stage, or, for a split row (only block 0 stages that
// value), from global memory one row group ahead, so that every block shifts by the same value.
template <typename T, typename W, int VEC, int ITEMS, bool LAYER, bool SPLIT>
__global__ void __launch_bounds__(512, 1)
    norm_forward_staged_kernel(ForwardParams<T, W> p, int tpr, int stages) {
#ifdef FG_NORM_STAGED
    extern __shared__ __align__(128) unsigned char stage_smem[];
    __shared__ StagedSync sync;
    __shared__ std::uint64_t affine_full;  // the block's slices of weight and bias have landed
    using V = Pack<T, VEC>;
    const RowPlace place = row_place(tpr);
    const int rpb = place.rows_per_block, group = place.group, lane = place.lane;
    const StagedPlace at = staged_place<SPLIT>(p.cols);  // this block's columns and place
    const int part = at.part;
    const long long unit = at.unit, units = at.units, cols = at.cols, c0 = at.c0;
    T* const stage_base = reinterpret_cast<T*>(stage_smem);
    const long long stage_elems = (long long)(p.residual ? 2 : 1) * rpb * cols;
    const long long groups = (p.rows + rpb - 1) / rpb;
    const T* const tensors[2] = {p.x, p.residual};
    T* const out_base = stage_base + stages * stage_elems;  // two buffers of y, rpb rows each
    const long long out_elems = (long long)rpb * cols;
    // This block's columns of the weight and bias, read once and kept (in shared memory: the
    // stages leave L1 too small to keep them, and LayerNorm's would come from L2 every row).
    W* const w_smem = reinterpret_cast<W*>(out_base + 2 * out_elems);
    W* const b_smem = w_smem + (p.weight ? cols : 0);
    const W* const w_kept = p.weight ? w_smem : nullptr;
    const W* const b_kept = p.bias ? b_smem : nullptr;
    auto fill = [&](int s, long long rg) {  // thread 0: row group rg -> stage s
        stage_fill(stage_base + s * stage_elems, tensors, rg, rpb, p.rows, p.cols, c0, cols,
                   &sync.full[s]);
    };
    const unsigned affine_bytes = (unsigned)(cols * (long long)sizeof(W));
    staged_start<SPLIT>(sync, stages, at, groups, fill, [&] {
        stage_barriers_init(&affine_full, 1);
        stage_expect(&affine_full, affine_bytes * ((p.weight ? 1 : 0) + (p.bias ? 1 : 0)));
        if (p.weight) stage_copy(w_smem, p.weight + c0, affine_bytes, &affine_full);
        if (p.bias) stage_copy(b_smem, p.bias + c0, affine_bytes, &affine_full);
    });
    stage_wait(&affine_full, 0);

    // LayerNorm's shift, the row's first value as normalised: from the stage, or, for a split
    // row (whose first value only block 0 has), from global memory one row group ahead.
    auto shift_of = [&](long long rg) {
        const long long row = rg * rpb + group;
        return SPLIT && LAYER && row < p.rows ? row_first(p, row * p.cols) : 0.0f;
    };
    float shift_next = shift_of(unit);
    int it = 0;
    for (long long rg = unit; rg < groups; rg += units, ++it) {
        const int s = it % stages;
        float shift = shift_next;
        shift_next = shift_of(rg + units);  // on its way while this group is worked on
        const long long row = rg * rpb + group;
        const bool active = row < p.rows;
        const long long base = row * p.cols + c0;  // this block's slice of the row (for h_out)
        const T* stage = stage_base + s * stage_elems + (long long)group * cols;
        const V* xs = reinterpret_cast<const V*>(stage);
        const V* rs = reinterpret_cast<const V*>(stage + (long long)rpb * cols);
        stage_wait(&sync.full[s], (unsigned)(it / stages) & 1u);
        if (LAYER && !SPLIT && active) {
            shift = to_float(xs[0].v[0]);
            if (p.residual) shift = to_float(from_float<T>(shift + to_float(rs[0].v[0])));
        }
        V h[ITEMS];
        float a = 0.0f, q = 0.0f;  // RMSNorm: a = sum x^2; LayerNorm: sums of d, d^2
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int v = i * tpr + lane;
            const long long col = (long long)v * VEC;
            if (active && col < cols) {
                h[i] = xs[v];
                if (p.residual) {
                    const V r = rs[v];
#pragma unroll
                    for (int k = 0; k < VEC; ++k)
                        h[i].v[k] = from_float<T>(to_float(h[i].v[k]) + to_float(r.v[k]));
                    *reinterpret_cast<V*>(p.h_out + base + col) = h[i];  // normalise exactly h
                }
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float d = to_float(h[i].v[k]) - shift;
                    a += LAYER ? d : d * d;
                    q += d * d;
                }
            }
        }
        __syncthreads();  // every thread has its share of stage s in registers: refill it
        const long long refill = rg + (long long)stages * units;
        if (threadIdx.x == 0 && refill < groups) fill(s, refill);
        float2 sums = forward_row_sums<LAYER>(a, q, tpr, sync.scratch);
        if constexpr (SPLIT)
            sums = cluster_row_sums(sums, sync.cluster_slots, sync.cluster_full, it);
        float mu, rstd;
        row_statistics<LAYER>(sums, shift, p.inv_n, p.eps, mu, rstd);
        // y goes to output buffer it & 1, then out by one bulk copy; thread 0 made sure (below,
        // two rows ago) that the copy out of this buffer two groups ago has read it.
        T* const out = out_base + (it & 1) * out_elems;
        if (active) {
            if (part == 0 && lane == 0 && p.rstd) {
                p.rstd[row] = rstd;
                if (LAYER) p.mean[row] = mu;
            }
            V* const ys = reinterpret_cast<V*>(out + (long long)group * cols);
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                const int v = i * tpr + lane;
                if ((long long)v * VEC >= cols) continue;
                float w[VEC], b[VEC];
                load_affine<W, VEC>(w_kept, b_kept, p.zero_centered, (long long)v * VEC, w, b);
                V y;
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    y.v[k] = from_float<T>((to_float(h[i].v[k]) - mu) * rstd * w[k] + b[k]);
                ys[v] = y;
            }
        }
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // visible to the copy engine
        __syncthreads();
        if (threadIdx.x == 0) {
            const long long first = rg * rpb;
            const unsigned bytes =
                (unsigned)(std::min<long long>(rpb, p.rows - first) * cols * (long long)sizeof(T));
            cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                                     p.y + first * p.cols + c0, out, bytes);
            cuda::ptx::cp_async_bulk_commit_group();
            // The copy out of the other buffer (the previous group) has read it: it can be
            // written again next group (after that group's first barrier).
            cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
        }
    }
    // Bulk copies read shared memory until they complete: the block waits for its last ones.
    // (SPLIT: a block has received every block's sums of its last row before it gets here, so
    // nothing can still be sent to its shared memory once it leaves.)
    if (threadIdx.x == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
#else
    (void)p, (void)tpr, (void)stages;
    __trap();  // the host launches this only where the device code has it (staging_supported)
#endif
}

// Waves ahead to prefetch. Measured on an H200 (bench_norm --sweep): one wave ahead helps bf16
// rows held in registers (+1 to +4 points of copy bandwidth at N = 1024 to 16384), costs f32
// rows of 1024 to 8192 values a point or three, and costs the looped kernel up to 7 points.
int forward_prefetch(bool looped, int elem_bytes, long long cols) {
    if (g_tuning.prefetch_distance != NormTuning::kAuto) return g_tuning.prefetch_distance;
    return !looped && (elem_bytes == 2 || cols >= 16384) ? 1 : 0;
}

// Blocks the register kernel, or the looped one, has resident on the device at once, times
// `waves` (0 when `waves` is 0): how far ahead prefetch_forward looks.
long long prefetch_ahead(int waves, const void* kernel, int threads) {
    if (waves == 0) return 0;
    return (long long)waves * resident_blocks_per_sm(kernel, threads, 0) * device_info().sm_count;
}

// Calls f(integral_constant<int, TPR>, integral_constant<int, ITEMS>) for rows of tpr = 4 to 128
// threads (a power of two) holding 1 to 4 vectors each: the register kernels built with those
// constants.
template <typename F>
void with_fixed_row(int tpr, int items, F&& f) {
    auto items_of = [&](auto tpr_tag) {
        switch (items) {
            case 1: f(tpr_tag, std::integral_constant<int, 1>{}); break;
            case 2: f(tpr_tag, std::integral_constant<int, 2>{}); break;
            case 3: f(tpr_tag, std::integral_constant<int, 3>{}); break;
            default: f(tpr_tag, std::integral_constant<int, 4>{}); break;
        }
    };
    switch (tpr) {
        case 4: items_of(std::integral_constant<int, 4>{}); break;
        case 8: items_of(std::integral_constant<int, 8>{}); break;
        case 16: items_of(std::integral_constant<int, 16>{}); break;
        case 32: items_of(std::integral_constant<int, 32>{}); break;
        case 64: items_of(std::integral_constant<int, 64>{}); break;
        default: items_of(std::integral_constant<int, 128>{}); break;
    }
}

// One block per row group (blocks come and go; that measured faster here than a persistent
// grid). Each block prefetches the group some waves ahead of its own (forward_prefetch). Rows of
// 16-byte vectors on at most 128 threads, at most 4 vectors each, take the kernel built for
// their threads a row, holding exactly the vectors the row needs (row_layout rounds them up to a
// power of two: a row of 48 vectors on 16 threads holds 3, not 4) unless the tuning says
// otherwise. Measured on an H200 (bench_norm --sweep, 'run-time tpr' against the defaults, % of
// copy, docs/norms-history.md session 13): bf16 LayerNorm 16384 x 384 43 -> 46,
// 32768 x 1024 78 -> 80, 8192 x 512 33 -> 35; f32 LayerNorm 16384 x 384 63 -> 65.5,
// 8192 x 512 56 -> 58; bf16 RMSNorm 16384 x 384 47.7 -> 49.5; the rest within a point.
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward(const ForwardParams<T, W>& p, const RowLayout& l) {
    const int waves = forward_prefetch(false, (int)sizeof(T), p.cols);
    const unsigned blocks = (unsigned)((p.rows + l.rows_per_block() - 1) / l.rows_per_block());
    auto run = [&](auto kernel) {
        kernel<<<blocks, l.threads, 0, stream()>>>(
            p, l.tpr, prefetch_ahead(waves, (const void*)kernel, l.threads));
    };
    const int items = (int)((p.cols / VEC + l.tpr - 1) / l.tpr);  // the vectors a row needs
    if (VEC > 1 && l.tpr <= 128 && items <= 4 && g_tuning.forward_fixed_rows) {
        if constexpr (VEC > 1) {  // (scalar rows never get here: no kernels built for them)
            with_fixed_row(l.tpr, items, [&](auto tpr_tag, auto items_tag) {
                run(norm_forward_kernel<T, W, VEC, decltype(items_tag)::value, LAYER,
                                        decltype(tpr_tag)::value>);
            });
        }
    } else {
        with_items(l.items, [&](auto items_tag) {  // only what row_layout can choose is built
            constexpr int kItems = decltype(items_tag)::value;
            if constexpr (kItems * VEC <= kForwardElems)
                run(norm_forward_kernel<T, W, VEC, kItems, LAYER, 0>);
        });
    }
    FG_LAUNCH_CHECK();
}

// The looped kernel: one block of `threads` a row, `vectors` vectors a thread per step (1, 2, 4
// or 8; scalar rows, VEC = 1, always take 4). Pass two loads 2 of them at once (4 at 8 vectors a
// step), but 1 for LayerNorm of 2-byte values and for scalar rows; NormTuning::forward_loop_batch
// overrides that, up to max_loop_batch. Measured on an H200 (session 14, bench_norm --sweep, % of
// copy, 2 against 1, same build): f32 RMSNorm 2048 x 16384 89.6 against 85.8, 4096 x 8192 91.3
// against 89.7, 8192 x 4096 91.6 against 90.6, f32 LayerNorm 1024 x 32768 75.6 against 74.0,
// bf16 RMSNorm 2048 x 16384 80.0 against 78.9, 4096 x 8192 83.0 against 82.2; bf16 LayerNorm
// 0.2-1.0 lower at all four looped shapes (and on an H100 1.5-2.5 lower at 4096 x 8192 and
// 2048 x 16384). Scalar rows were not measured.
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward_looped(const ForwardParams<T, W>& p, int threads, int vectors) {
    const int waves = forward_prefetch(true, (int)sizeof(T), p.cols);
    const int unroll = VEC > 1 ? vectors : 4;
    int batch = unroll > 4 ? 4 : (LAYER && sizeof(T) == 2) || VEC == 1 ? 1 : 2;
    if (g_tuning.forward_loop_batch != NormTuning::kAuto)
        batch = (int)pow2_ceil(std::min(8, std::max(1, g_tuning.forward_loop_batch)));
    batch = std::min(batch, max_loop_batch(unroll));  // only these are built
    auto launch = [&](auto unroll_tag, auto batch_tag) {
        constexpr int kUnroll = decltype(unroll_tag)::value;
        constexpr int kBatch = decltype(batch_tag)::value;
        if constexpr ((VEC > 1 || kUnroll == 4) && kBatch <= max_loop_batch(kUnroll)) {
            auto kernel = norm_forward_looped_kernel<T, W, VEC, kUnroll, LAYER, kBatch>;
            kernel<<<(unsigned)p.rows, threads, 0, stream()>>>(
                p, prefetch_ahead(waves, (const void*)kernel, threads));
        }
    };
    with_items(unroll, [&](auto unroll_tag) {
        with_items(batch, [&](auto batch_tag) { launch(unroll_tag, batch_tag); });
    });
    FG_LAUNCH_CHECK();
}

// Staged forward: whether it can run here, and its launch.
constexpr int kStagedForwardElems = 32;  // columns a staged thread holds (at most 4 vectors)
// Rows of at least this many values are staged (NormTuning::forward_stage_cols = kAuto).
// Measured on an H100 (bench_norm --sweep, docs/norms-history.md): at N = 1024 to 8192 the
// register kernel, many blocks per SM, is 1-4 points of copy ahead (f32 93-94% against 89-92%);
// from N = 16384, where it needs 1024-thread blocks or the looped kernel, staging is 5 to 23 points
// ahead (f32 1024 x 32768: 84-85% against 61-62%).
constexpr long long kForwardStageCols = 16384;
// kAuto splits: a row a block can stage whole is not split; longer rows go in the fewest slices of
// at most 2048 vectors (a 512-thread block holding four vectors a thread), else in fewer, never
// in more: slices of 16 KiB measured 20-45 points below slices of 32 KiB on an H100 (every
// slice's row waits for the cluster's sums; the shorter the slice, the more that wait counts).
// A row whose plan does not fit is left to the register kernel.
constexpr long long kForwardSliceVectors = 2048;
// Row groups a staged forward block has in shared memory at once. Measured on an H200 (session
// 11, bench_norm --sweep, % of copy): two rather than four, f32 RMSNorm 1024 x 32768 81.5 -> 83.6
// (staged by default); where the staged forward is forced, f32 LayerNorm 8192 x 4096 81.6 -> 83.9,
// bf16 RMSNorm 4096 x 8192 74 -> 77; the rest level (within 1).
constexpr int kForwardStages = 2;

bool staging_supported() {
    static const bool ok =
        staging_built_for((const void*)norm_forward_looped_kernel<float, float, 4, 1, false, 1>);
    return ok;
}

template <typename T, typename W, int VEC, bool LAYER>
void launch_forward_staged(const ForwardParams<T, W>& p, const StagedPlan& plan) {
    auto launch = [&](auto items_tag) {
        constexpr int kItems = decltype(items_tag)::value;
        if constexpr (kItems <= 4) {
            if (plan.split > 1) {
                constexpr auto kernel = norm_forward_staged_kernel<T, W, VEC, kItems, LAYER, true>;
                allow_dynamic_smem<kernel>(plan.smem);
                launch_split<kernel>(p, plan, p.rows);
            } else {
                constexpr auto kernel = norm_forward_staged_kernel<T, W, VEC, kItems, LAYER, false>;
                allow_dynamic_smem<kernel>(plan.smem);
                const int rpb = plan.rows.rows_per_block();
                const unsigned blocks = persistent_blocks((const void*)kernel, plan.rows.threads,
                                                          plan.smem, (p.rows + rpb - 1) / rpb);
                kernel<<<blocks, plan.rows.threads, plan.smem, stream()>>>(p, plan.rows.tpr,
                                                                             plan.stages);
            }
        }
    };
    with_items(plan.rows.items, launch);
    FG_LAUNCH_CHECK();
}

// The rows that two looped blocks an SM have in flight, read once and asked to stay in L2 for the
// second read, may take up to this share of L2; where they would take more, rows go one block an
// SM (rows_over_l2_share). Measured on an H100 (session 17, bench_norm --sweep, forward % of
// copy, steps of 1024 x 4 vectors at two blocks an SM against 1024 x 8 at one): f32 rows of 32768
// values (33 MiB in flight at two blocks an SM; 50 MiB of L2) LayerNorm 1024 x 32768 81.0
// against 85.3, 2048 x 32768 85.1 against 90.9, RMSNorm 85.0 against 92.4 and 90.0 against 97.0,
// bf16 RMSNorm 1024 x 65536 79.0 against 88.7; f32 rows of 24576 values (24.75 MiB) stay at two
// blocks (RMSNorm 2048 x 24576 94.1 in steps of 1024 x 4, 1.5 steps a row; 76.9 in 1024 x 8,
// 0.75). On an H200, whose L2 takes those 33 MiB, steps of 1024 x 4 were ahead for LayerNorm
// (f32 1024 x 32768 75.9 against 70.5) and behind for RMSNorm (79.3 against 81.7, staged 83.3).
constexpr double kLoopedL2Share = 0.6;

bool rows_over_l2_share(long long cols, int elem_bytes) {
    const double two_blocks_an_sm = 2.0 * device_info().sm_count * (double)cols * elem_bytes;
    return two_blocks_an_sm > kLoopedL2Share * device_info().l2_bytes;
}

// Which rows the looped kernel takes when NormTuning::forward_loop_cols is kAuto: rows of 16-byte
// vectors, from kForwardLoopVectors to kForwardLoopMaxVectors of them (f32 N = 4096 to 32768,
// bf16 / f16 N = 8192 to 65536), each in about one step (looped_shape). Measured on an H200
// (bench_norm --sweep, docs/norms-history.md): the second read costs little from L2, and 32
// registers a thread let two 1024-thread blocks, or eight of 256, share an SM, so more rows are on
// their way than the register kernel (which keeps the row) or the staged one (one block an SM) can
// have: f32 RMSNorm 2048 x 16384 89% of copy against 82% staged, LayerNorm 4096 x 8192 88% against
// 79% in registers, bf16 RMSNorm 4096 x 8192 82% against 76%. Shorter rows keep the register
// kernel, several rows a block (one row a block is too little work); longer ones are staged, or
// looped when they cannot be (too long for registers). Rows of 4097 to kForwardLoopStepVectors
// vectors (most of a step of 1024 x 4, or more than one): LayerNorm's since session 10 (H200,
// against the staged forward: f32 1024 x 32768 74% against 67%, 1365 x 24576 75% against 56%),
// RMSNorm's since session 17 (against the staged forward: H100 f32 1024 x 24576 88.0% against
// 85.0%, 1024 x 20480 88.5% against 83.1%; H200 78.2% against 72.1%, 79.6% against 62.8%). Longer
// rows fill most of a step of 1024 x 8: LayerNorm's are looped, RMSNorm's where they are over the
// L2 share (the staged forward was ahead of both looped shapes for them on an H200, above; on an
// H100 f32 RMSNorm 1024 x 32768 92.4% looped against 84.8% staged, bf16 1024 x 65536 88.7% against
// 83.2%). Rows of 16384 vectors stay staged (H100, f32 RMSNorm 1024 x 65536 89.7% staged, 77.6%
// looped). Measured without a fused residual, which the looped kernel adds one vector at a time:
// with one, rows of more than kForwardLoopMaxVectorsResidual vectors stay staged.
constexpr long long kForwardLoopVectors = 1024;
constexpr long long kForwardLoopStepVectors = 6144;
constexpr long long kForwardLoopMaxVectors = 8192;
constexpr long long kForwardLoopMaxVectorsResidual = 4096;

// `over_l2`: rows_over_l2_share for these rows (the caller asks once; looped_shape needs it too).
bool loop_by_default(long long cols, int vec, bool layer, bool residual, bool over_l2) {
    const long long nvec = cols / vec;
    if (vec == 1 || nvec < kForwardLoopVectors) return false;
    if (residual) return nvec <= kForwardLoopMaxVectorsResidual;
    if (nvec <= kForwardLoopStepVectors) return true;
    return nvec <= kForwardLoopMaxVectors && (layer || over_l2);
}

// The looped kernel's block: `threads` threads, `vectors` vectors each in flight per step. kAuto:
// a step covers the row where 1024 threads of 4 vectors can (nvec / 4 threads, at least 32, of
// 4 vectors, up to 1024 threads); longer rows go in steps of 1024 threads of up to 8 vectors,
// but rows loop_by_default takes (`by_default`) in steps of 1024 x 4, two blocks an SM, unless
// those blocks' rows would take more than kLoopedL2Share of L2: then in steps of 1024 x 8, one
// block an SM.
struct LoopedShape {
    int threads = 1024, vectors = 8;
};
LoopedShape looped_shape(long long cols, int vec, bool by_default, bool over_l2) {
    const long long nvec = (cols + vec - 1) / vec;
    LoopedShape s;
    const int most_vectors = by_default && !over_l2 ? 4 : 8;
    s.threads = (int)std::min<long long>(1024, std::max<long long>(32, pow2_floor(nvec / 4)));
    s.vectors = (int)std::min<long long>(most_vectors,
                                         std::max<long long>(1, pow2_floor(nvec / s.threads)));
    if (g_tuning.forward_loop_threads != NormTuning::kAuto)
        s.threads = std::min(1024, std::max(32, (int)pow2_ceil(g_tuning.forward_loop_threads)));
    if (g_tuning.forward_loop_vectors != NormTuning::kAuto)
        s.vectors = std::min(8, std::max(1, (int)pow2_ceil(g_tuning.forward_loop_vectors)));
    return s;
}

// Vectors a thread of the register kernel aims to hold (row_layout's target_items). Measured on
// an H200 (bench_norm --sweep, docs/norms-history.md, session 9): two vectors a thread (twice
// the threads a row) beat four for RMSNorm and for f32 LayerNorm (N = 1024: f32 RMSNorm 89% -> 93%
// of copy, f32 LayerNorm 88% -> 92%, bf16 RMSNorm 80% -> 83%; bf16 RMSNorm N = 4096 80% -> 82%),
// but not for LayerNorm of 2-byte values (bf16 N = 1024 76% -> 71%, N = 4096 72% -> 65%), which
// kept four, as do rows without 16-byte vectors (not measured). Measured again in session 18
// (same sweep, today's kernels, four against two vectors, f32 / bf16 weights): on an H100 two
// now win for bf16 LayerNorm at N = 1024 (32768 x 1024: 85.2 -> 88.5 / 83.9 -> 88.9) and
// N = 2048 (16384 x 2048: 85.1 -> 87.8 / 83.5 -> 89.2), and at N = 4096 (8192 x 4096: 85.0 ->
// 87.8), but lose a point at N = 384; on an H200 they are level or ahead at N = 1024-2048
// (32768 x 1024: 79.1 -> 79.0 / 79.2 -> 80.8; 16384 x 2048: 79.3 -> 78.7 / 79.6 -> 81.0) and far
// behind at N = 512-768 and 4096-6144 (8192 x 4096: 79.3 -> 66.4 / 79.1 -> 70.0), and at
// N = 1536 (16384 x 1536: 75.2 -> 68.4 / 77.4 -> 68.2), whose 192 vectors two a thread spread
// over 128 threads with a quarter of them idle (four a thread: 64 threads of exactly 3). So
// rows of 128 or 256 vectors (kLayerTwoVectorsMin..Max, a power of two: bf16 / f16 N = 1024 and
// 2048), which two vectors a thread cover exactly, take two.
constexpr long long kLayerTwoVectorsMin = 128, kLayerTwoVectorsMax = 256;

int row_vectors(bool layer, int elem_bytes, bool vector_ok, long long cols) {
    if (g_tuning.forward_row_vectors != NormTuning::kAuto)
        return std::max(1, g_tuning.forward_row_vectors);
    if (!vector_ok) return 4;
    if (!layer || elem_bytes != 2) return 2;
    const long long nvec = cols * elem_bytes / 16;
    const bool pow2 = (nvec & (nvec - 1)) == 0;
    return pow2 && nvec >= kLayerTwoVectorsMin && nvec <= kLayerTwoVectorsMax ? 2 : 4;
}

template <typename T, typename W>
void forward_typed(const NormForwardArgs& a) {
    const bool layer = a.kind == NormKind::layer;
    // The usual modules' weight and bias on their own path (load_affine). Measured on an H200
    // (session 15, bench_norm --sweep, 'any affine' against the default, forward % of copy): with
    // bf16 weights bf16 RMSNorm 8192 x 4096 78.7 -> 83.8, 4096 x 8192 81.6 -> 84.7, 1024 x 32768
    // 75.9 -> 79.5, bf16 LayerNorm 1024 x 32768 66.4 -> 70.3; with f32 weights bf16 RMSNorm
    // 8192 x 4096 80.7 -> 83.3; f32 within a point (where the path is built: looped_usual_path).
    const bool usual = g_tuning.usual_affine && a.weight && !a.zero_centered &&
                       (a.bias != nullptr) == layer;
    ForwardParams<T, W> p{a.rows, a.cols, a.eps, 1.0f / (float)a.cols, a.zero_centered, usual,
                          static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                          static_cast<T*>(a.h_out), static_cast<const W*>(a.weight),
                          static_cast<const W*>(a.bias), static_cast<T*>(a.y), a.mean, a.rstd};
    constexpr int kVec = 16 / sizeof(T);
    bool vector_ok = a.cols % kVec == 0;
    for (const void* ptr : {a.x, a.residual, (const void*)a.h_out, (const void*)a.y})
        vector_ok = vector_ok && aligned_to(ptr, 16);
    for (const void* ptr : {a.weight, a.bias}) vector_ok = vector_ok && aligned_to(ptr, sizeof(W) * kVec);
    const int looped_vec = vector_ok ? kVec : 1;
    const bool over_l2 = rows_over_l2_share(a.cols, (int)sizeof(T));
    const bool loop_default =
        loop_by_default(a.cols, looped_vec, layer, a.residual != nullptr, over_l2);
    const LoopedShape looped = looped_shape(a.cols, looped_vec, loop_default, over_l2);
    auto run_looped = [&] {
        if (!vector_ok) {
            if (layer) launch_forward_looped<T, W, 1, true>(p, looped.threads, 4);
            else launch_forward_looped<T, W, 1, false>(p, looped.threads, 4);
        } else if (layer) {
            launch_forward_looped<T, W, kVec, true>(p, looped.threads, looped.vectors);
        } else {
            launch_forward_looped<T, W, kVec, false>(p, looped.threads, looped.vectors);
        }
    };
    if (g_tuning.forward_loop_cols == NormTuning::kAuto ? loop_default
                                                         : a.cols >= g_tuning.forward_loop_cols)
        return run_looped();
    const long long stage_from = g_tuning.forward_stage_cols == NormTuning::kAuto
                                     ? kForwardStageCols
                                     : g_tuning.forward_stage_cols;
    if (vector_ok && a.cols >= stage_from && staging_supported()) {
        const int streams = a.residual ? 2 : 1;
        // Besides the stages: two buffers of y, and the block's slices of weight and bias.
        auto extra = [&](const StagedLayout& l, long long slice_cols) {
            const int affine = (a.weight ? 1 : 0) + (a.bias ? 1 : 0);
            return 2 * l.stage_bytes / streams + affine * slice_cols * sizeof(W);
        };
        StagedRules rules;
        rules.max_elems = std::min(kStagedForwardElems, g_tuning.forward_elems);
        rules.whole_elems = kStagedForwardElems;
        rules.slice_vectors = kForwardSliceVectors;
        rules.max_stages = kForwardStages;
        const StagedPlan plan = plan_staged(a.cols, sizeof(T), streams, rules, extra);
        if (plan.stages > 0) {
            if (layer) launch_forward_staged<T, W, kVec, true>(p, plan);
            else launch_forward_staged<T, W, kVec, false>(p, plan);
            return;
        }
    }
    RowLayout l = row_layout(a.cols, sizeof(T), vector_ok,
                             std::min(kForwardElems, g_tuning.forward_elems),
                             64 * (int)sizeof(T) / forward_bytes_per_elem<T, W>(), 8,
                             row_vectors(layer, sizeof(T), vector_ok,
                                         a.cols));  // see forward_max_threads
    if (l.looped) return run_looped();
    if (vector_ok) {
        if (layer) launch_forward<T, W, kVec, true>(p, l);
        else launch_forward<T, W, kVec, false>(p, l);
    } else {
        if (layer) launch_forward<T, W, 1, true>(p, l);
        else launch_forward<T, W, 1, false>(p, l);
    }
}

template <typename T>
void forward_weight(const NormForwardArgs& a) {
    if (a.w_type == ScalarType::f32) forward_typed<T, float>(a);
    else forward_typed<T, T>(a);
}

}  // namespace

void set_norm_tuning(const NormTuning& t) { g_tuning = t; }
NormTuning norm_tuning() { return g_tuning; }

void norm_forward(const NormForwardArgs& a) {
    if (a.rows == 0 || a.cols == 0) return;
    if (a.cols > kNormMaxCols)
        throw CudaError("[norm] forward: rows of " + std::to_string(a.cols) +
                        " values; the kernels take at most 2^30 a row");
    switch (a.x_type) {
        case ScalarType::f32: forward_typed<float, float>(a); break;
        case ScalarType::bf16: forward_weight<__nv_bfloat16>(a); break;
        case ScalarType::f16: forward_weight<__half>(a); break;
        default: throw CudaError("[norm] unsupported dtype for the norm kernels");
    }
}

}  // namespace fg::kernels
