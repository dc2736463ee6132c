// kernels/norm/forward.cu: RMSNorm / LayerNorm forward (math in kernels/norm.h): the tuned
// kernels and the launchers that carry out a plan. Which kernel runs, and how its rows are laid
// over threads, blocks, stages and clusters, is decided by plan_forward (kernels/norm/plan.cpp,
// rules F1-F10); the pieces the kernels share are in common.cuh.
//
// Every kernel loads the row (adding the residual and writing h if fused), reduces the statistics
// over the row's threads and writes y. The register kernel holds the row in registers, a block
// per row group, and can have the rows of a later block brought into L2. The staged kernel
// (Hopper): persistent blocks have the copy engine stage their next row groups in shared memory
// while they work (rows too long for one block are split over a cluster). The looped kernel
// streams rows too long for registers, or that the plan sends to it, and reads them twice (the
// second time mostly from L2).
#include <algorithm>
#include <type_traits>

#include "kernels/norm/common.cuh"
#include "kernels/runtime.h"

namespace fg::kernels {
namespace {

using namespace norm_detail;

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

// x + r for one vector, rounded to T as h is stored and normalised.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> add_residual(Pack<T, VEC> x, const Pack<T, VEC>& r) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) x.v[k] = from_float<T>(to_float(x.v[k]) + to_float(r.v[k]));
    return x;
}

// The looped kernel's first read of a vector: x asked to stay in L2 for the second read, or, with
// the residual fused, x + r rounded to T and stored as h (which the second pass reads back).
template <typename T, typename W, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_input_keep(const ForwardParams<T, W>& p,
                                                        long long offset) {
    if (!p.residual) return load_pack_keep<T, VEC>(p.x + offset);
    const Pack<T, VEC> h =
        add_residual(*reinterpret_cast<const Pack<T, VEC>*>(p.x + offset),
                     *reinterpret_cast<const Pack<T, VEC>*>(p.residual + offset));
    *reinterpret_cast<Pack<T, VEC>*>(p.h_out + offset) = h;
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

// Register kernels whose threads hold the most values (kForwardElems) with 2-byte weights have
// the fewest registers to spare (1024-thread blocks, 64 a thread): they spill (-Xptxas -v, sm_90)
// with the usual-affine path (load_affine's kAffineWeight(Bias); rule F10) beside the run-time
// one, or with all of a thread's residual vectors loaded beside x (they load r a vector at a
// time).
template <typename W, int VEC, int ITEMS>
constexpr bool register_tight() {
    return sizeof(W) == 2 && ITEMS * VEC == kForwardElems;
}
template <typename W, int VEC, int ITEMS>
constexpr bool register_usual_path() {
    return !register_tight<W, VEC, ITEMS>();
}

// The register forward: reference version 3 (the row in registers, 16-byte vectors; reference.cu)
// with rows per block and threads a row from the plan, x kept in its storage type, one reduction
// of shifted sums for LayerNorm's mean and variance, prefetching and the usual-affine path.
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
    // Every load of the row (x, the residual, and LayerNorm's shift: the row's first value) is
    // issued before any h is stored, but r a vector at a time where registers are tight: the
    // compiler may not move a load past a store that could alias it, so loading and storing
    // vector by vector would keep one vector in flight.
    Pack<T, VEC> v[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = (i * tpr + lane) * VEC;
        if (col < cols) {
            v[i] = *reinterpret_cast<const Pack<T, VEC>*>(p.x + base + col);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[i].v[k] = from_float<T>(0.0f);
        }
    }
    const float shift = LAYER && active ? row_first(p, base) : 0.0f;
    if (p.residual) {  // h = x + r, rounded to T, stored and normalised; r in chunks of vectors
        constexpr int kChunk = register_tight<W, VEC, ITEMS>() ? 1 : ITEMS;
#pragma unroll
        for (int i0 = 0; i0 < ITEMS; i0 += kChunk) {
            Pack<T, VEC> r[kChunk];
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
                const int col = ((i0 + j) * tpr + lane) * VEC;
                if (i0 + j < ITEMS && col < cols)
                    r[j] = *reinterpret_cast<const Pack<T, VEC>*>(p.residual + base + col);
            }
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
                const int col = ((i0 + j) * tpr + lane) * VEC;
                if (i0 + j >= ITEMS || col >= cols) continue;
                v[i0 + j] = add_residual(v[i0 + j], r[j]);
                *reinterpret_cast<Pack<T, VEC>*>(p.h_out + base + col) = v[i0 + j];
            }
        }
    }
    float s = 0.0f;  // RMSNorm: sum x^2
    if (!LAYER)
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += to_float(v[i].v[k]) * to_float(v[i].v[k]);
    // LayerNorm: one reduction of shifted sums (row_statistics); the data are in registers.
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

// Whether the looped kernel has the usual-affine path (rule F10) beside the run-time one: for
// RMSNorm, and for LayerNorm of 2-byte values and weights one vector a batch. Not for LayerNorm
// of 2-byte values with f32 weights or two vectors a batch: there its unconditional w and b loads
// spill at 32 registers (-Xptxas -v, sm_90), which slows the run-time path built into the same
// kernel too. Nor for f32 LayerNorm, where the path is no faster at one step a row and slower
// at two (docs/norms.md).
template <typename T, typename W, bool LAYER, int BATCH>
constexpr bool looped_usual_path() {
    return !LAYER || (sizeof(T) == 2 && sizeof(W) == 2 && BATCH == 1);
}

// The looped forward: reference version 2's passes over a row (sums, then y), by a block of 16-byte
// vectors rather than a warp of values, the second pass served by L1 and L2.
// Rows streamed twice through one block (rows too long for registers, and the rows rule F5 sends
// here): the row goes by in steps of blockDim * VEC * UNROLL values, a thread having UNROLL
// vectors in flight at once. Pass one reads x (adding the residual and writing h, if fused) for
// the statistics, asking L2 to keep the lines; pass two reads x (or h) again, mostly from L2,
// marks the lines as last used and writes y, in batches of BATCH vectors a thread, all of a
// batch's loads issued before any y is stored (the compiler may not move a load past a store
// that could alias it). Columns are 32-bit offsets from the row's start (norm_forward takes rows
// of at most kNormMaxCols values).
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

// The staged forward: the register forward (reference version 3's idea) fed by the copy engine.
// Rows staged in shared memory (Hopper; see common.cuh; which rows, their split and their
// stages: rules F1-F3). A persistent block has the copy engine bring x (and the residual) of its
// row groups into one of `stages` buffers, up to `stages` groups ahead; its threads take their
// vectors from the stage into registers (h = x + r rounded to T, and written out, when the
// residual is fused) and hand the stage back for a later group at once, before the row sums: the
// copy engine keeps loading while the threads reduce and write y. y goes out the same way: the
// threads write it into one of two output buffers and thread 0 has the copy engine store it
// (cp.async.bulk shared -> global). The block's columns of weight and bias are copied in once and
// kept. Dynamic shared memory of a block:
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

// One block per row group (blocks come and go). Each block prefetches the group some waves
// ahead of its own (plan.prefetch_waves, rule F7). A fixed row (plan.fixed_row, rule F9) takes
// the kernel built for its threads a row and exactly the vectors the row needs; other rows the
// kernel that reads the threads a row at run time, holding a power of two of vectors.
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward(const ForwardParams<T, W>& p, const ForwardPlan& plan) {
    const RowLayout& l = plan.rows;
    const unsigned blocks = (unsigned)((p.rows + l.rows_per_block() - 1) / l.rows_per_block());
    auto run = [&](auto kernel) {
        kernel<<<blocks, l.threads, 0, stream()>>>(
            p, l.tpr, prefetch_ahead(plan.prefetch_waves, (const void*)kernel, l.threads));
    };
    if (plan.fixed_row) {
        if constexpr (VEC > 1) {  // (scalar rows are never fixed: no kernels built for them)
            with_fixed_row(l.tpr, plan.fixed_items, [&](auto tpr_tag, auto items_tag) {
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

// The looped kernel: one block of plan.loop_threads a row, plan.loop_vectors vectors a thread
// per step, plan.loop_batch of them loaded at once in the second pass (rules F4, F8).
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward_looped(const ForwardParams<T, W>& p, const ForwardPlan& plan) {
    const int threads = plan.loop_threads;
    auto launch = [&](auto unroll_tag, auto batch_tag) {
        constexpr int kUnroll = decltype(unroll_tag)::value;
        constexpr int kBatch = decltype(batch_tag)::value;
        if constexpr ((VEC > 1 || kUnroll == 4) && kBatch <= max_loop_batch(kUnroll)) {
            auto kernel = norm_forward_looped_kernel<T, W, VEC, kUnroll, LAYER, kBatch>;
            kernel<<<(unsigned)p.rows, threads, 0, stream()>>>(
                p, prefetch_ahead(plan.prefetch_waves, (const void*)kernel, threads));
        }
    };
    with_items(plan.loop_vectors, [&](auto unroll_tag) {
        with_items(plan.loop_batch, [&](auto batch_tag) { launch(unroll_tag, batch_tag); });
    });
    FG_LAUNCH_CHECK();
}

// Whether the staged kernels are in this binary and the device can run them (common.cuh).
bool staging_supported() {
    static const bool ok =
        staging_built_for((const void*)norm_forward_looped_kernel<float, float, 4, 1, false, 1>);
    return ok;
}

// The staged forward: a persistent grid (as many blocks as fit at once), or, for split rows,
// as many clusters as fit.
template <typename T, typename W, int VEC, bool LAYER>
void launch_forward_staged(const ForwardParams<T, W>& p, const StagedPlan& plan,
                           int threads_per_sm) {
    auto launch = [&](auto items_tag) {
        constexpr int kItems = decltype(items_tag)::value;
        if constexpr (kItems <= 4) {
            if (plan.split > 1) {
                constexpr auto kernel = norm_forward_staged_kernel<T, W, VEC, kItems, LAYER, true>;
                allow_dynamic_smem((const void*)kernel, plan.smem);
                launch_split<kernel>(p, plan, p.rows);
            } else {
                constexpr auto kernel = norm_forward_staged_kernel<T, W, VEC, kItems, LAYER, false>;
                allow_dynamic_smem((const void*)kernel, plan.smem);
                const int rpb = plan.rows.rows_per_block();
                const unsigned blocks =
                    persistent_blocks((const void*)kernel, plan.rows.threads, plan.smem,
                                      (p.rows + rpb - 1) / rpb, threads_per_sm);
                kernel<<<blocks, plan.rows.threads, plan.smem, stream()>>>(p, plan.rows.tpr,
                                                                             plan.stages);
            }
        }
    };
    with_items(plan.rows.items, launch);
    FG_LAUNCH_CHECK();
}

template <typename T, typename W>
void forward_typed(const NormForwardArgs& a) {
    const NormTuning tuning = a.tuning ? *a.tuning : NormTuning{};
    constexpr int kVec = 16 / sizeof(T);
    NormCall call;
    call.kind = a.kind;
    call.elem_bytes = (int)sizeof(T);
    call.weight_bytes = (int)sizeof(W);
    call.rows = a.rows;
    call.cols = a.cols;
    call.weight = a.weight != nullptr;
    call.bias = a.bias != nullptr;
    call.zero_centered = a.zero_centered;
    call.residual = a.residual != nullptr;
    call.vector_ok = a.cols % kVec == 0;
    for (const void* ptr : {a.x, a.residual, (const void*)a.h_out, (const void*)a.y})
        call.vector_ok = call.vector_ok && aligned_to(ptr, 16);
    for (const void* ptr : {a.weight, a.bias})
        call.vector_ok = call.vector_ok && aligned_to(ptr, sizeof(W) * kVec);
    static const NormDevice device = norm_device(staging_supported());
    const ForwardPlan plan = plan_forward(call, device, tuning);

    ForwardParams<T, W> p{a.rows, a.cols, a.eps, 1.0f / (float)a.cols, a.zero_centered,
                          plan.usual_affine, static_cast<const T*>(a.x),
                          static_cast<const T*>(a.residual), static_cast<T*>(a.h_out),
                          static_cast<const W*>(a.weight), static_cast<const W*>(a.bias),
                          static_cast<T*>(a.y), a.mean, a.rstd};
    const bool layer = a.kind == NormKind::layer;
    switch (plan.kernel) {
        case ForwardKernel::staged:
            if (layer) launch_forward_staged<T, W, kVec, true>(p, plan.staged, tuning.grid_threads_per_sm);
            else launch_forward_staged<T, W, kVec, false>(p, plan.staged, tuning.grid_threads_per_sm);
            break;
        case ForwardKernel::looped:
            if (plan.vec == 1) {
                if (layer) launch_forward_looped<T, W, 1, true>(p, plan);
                else launch_forward_looped<T, W, 1, false>(p, plan);
            } else if (layer) {
                launch_forward_looped<T, W, kVec, true>(p, plan);
            } else {
                launch_forward_looped<T, W, kVec, false>(p, plan);
            }
            break;
        case ForwardKernel::registers:
            if (plan.vec > 1) {
                if (layer) launch_forward<T, W, kVec, true>(p, plan);
                else launch_forward<T, W, kVec, false>(p, plan);
            } else {
                if (layer) launch_forward<T, W, 1, true>(p, plan);
                else launch_forward<T, W, 1, false>(p, plan);
            }
            break;
    }
}

template <typename T>
void forward_weight(const NormForwardArgs& a) {
    if (a.w_type == ScalarType::f32) forward_typed<T, float>(a);
    else forward_typed<T, T>(a);
}

}  // namespace

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
