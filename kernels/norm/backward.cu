// kernels/norm/backward.cu: RMSNorm / LayerNorm backward (math in kernels/norm.h): the tuned
// kernels and the launchers that carry out a plan. The strategy, the kernel and how its rows are
// laid over threads, blocks, stages and clusters are decided by plan_backward
// (kernels/norm/plan.cpp, rules B1-B8); the pieces the kernels share are in common.cuh.
//
// dx is per row: one pass over x and dy (held in registers), two row sums (c1, c2), one write.
// dw and db are sums over rows; every kernel here first sums its own rows in fp32 registers, then
// hands its sums to one of two cross-row reductions:
//
//  (b) grid (the default, rule B1): P persistent blocks (as many as fit on the device at once,
//      not from M). Block p takes row groups p, p + P, p + 2P, ... and, at the end, writes its
//      sums as partial row p. A second, column-parallel kernel adds the P partial rows. Every run
//      adds in the same order: the result is bitwise deterministic. On Hopper, where two row
//      groups fit in shared memory, norm_backward_staged_kernel has the copy engine bring groups
//      into shared memory several groups ahead (rule B4; one block per SM), and rows too long for
//      one block are split over a cluster of 2-8 blocks (rule B3); its grid, launched
//      cooperatively, then adds the partial rows itself after a grid-wide barrier
//      (grid_column_sums, rule B7), with no second kernel. Elsewhere norm_backward_kernel holds
//      its rows in registers and prefetches the next group into L2 (rule B6).
//  (a) locked: the same kind of persistent grid (half the threads an SM holds, and never more
//      blocks than fit at once: rule B5); block b adds its sums into partial row b mod G (G: half
//      the blocks, rule B5) while holding spin lock b mod G (the first writer stores, later ones
//      add). Then the same column kernel adds the G rows. The order in which blocks take a lock
//      varies, so the last bits of dw/db vary from run to run; the blocks finish together and
//      queue on the locks, the deeper the smaller G. (The looped kernel takes lock r mod G for
//      each row r, and adds that row's sums into partial row r mod G.)
//
// Lock protocol: one thread spins on atomicCAS, __threadfence, __syncthreads, then all threads
// read (bypassing L1: another SM wrote the row) and write; one thread marks the row written; then
// every thread __threadfence (its stores visible), __syncthreads (all done), and one thread
// releases the lock.
#include <algorithm>
#include <type_traits>

#include "kernels/norm/common.cuh"
#include "kernels/runtime.h"

namespace fg::kernels {
namespace {

using namespace norm_detail;


template <typename T, typename W>
struct BackwardParams {
    long long rows, cols;
    bool zero_centered;
    const T* x;
    const T* dy;
    const T* dh;
    const W* weight;
    const float* mean;
    const float* rstd;
    T* dx;
    float* partial_dw;  // R x cols
    float* partial_db;  // R x cols
    int* locks;         // G (locked strategy)
    int* written;       // G: 0 until a block first writes the partial row
    int lock_rows;      // G
    // dw and db (null: not wanted, and no partial row kept for it). The kernels write them only
    // when the staged grid adds the partial rows itself (launched cooperatively; see
    // grid_column_sums); else the column kernel does.
    W* dw;
    W* db;
    bool grid_sums;
};

// Lock-guarded partial rows: acquire / release partial row `gi` for the whole block.
__device__ __forceinline__ bool acquire_partial_row(int* locks, int* written, int gi, int* flag) {
    if (threadIdx.x == 0) {
        while (atomicCAS(&locks[gi], 0, 1) != 0) {
        }
        __threadfence();
        *flag = *reinterpret_cast<volatile int*>(&written[gi]) == 0;
    }
    __syncthreads();
    return *flag != 0;
}

// The "written" mark must be visible before the lock is free: it is stored before the fence, like
// the partial row itself. (Two atomics to different addresses, with no fence between them, may be
// seen in either order by another SM: the next block could then see the lock free but the row
// "unwritten", and overwrite it: dw/db errors that move from run to run, and may show only under
// another scheduling, a compute-sanitizer run's say.)
__device__ __forceinline__ void release_partial_row(int* locks, int* written, int gi) {
    if (threadIdx.x == 0) *reinterpret_cast<volatile int*>(&written[gi]) = 1;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(&locks[gi], 0);
}

// Adds v[0..VEC) into the VEC partial-row elements at ptr (aligned as VEC floats), which other
// SMs also write; the first writer stores v (in quads, 0 + v: the same value, -0 stored as +0).
// L2 only (ld.global.cg / st.global.cg), never a stale L1 line; one element at a time when VEC
// is 1, else in 16-byte quads (a quarter of the L2 requests).
template <int VEC>
__device__ __forceinline__ void locked_add(float* ptr, const float* v, bool first) {
    if constexpr (VEC == 1) {
        __stcg(ptr, first ? v[0] : __ldcg(ptr) + v[0]);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k += 4) {
            float4* q = reinterpret_cast<float4*>(ptr + k);
            const float4 o = first ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : __ldcg(q);
            __stcg(q, make_float4(o.x + v[k], o.y + v[k + 1], o.z + v[k + 2], o.w + v[k + 3]));
        }
    }
}

// Writes one block's column sums `acc` (per thread: its columns; per row group: its rows) as a
// single partial row `dst`: row groups are first added in order through shared memory.
template <int ITEMS, int VEC, bool LOCKED>
__device__ __forceinline__ void write_partial_row(const float (&acc)[ITEMS][VEC], float* dst,
                                                  long long cols, int tpr, float* group_sums,
                                                  bool first) {
    const RowPlace place = row_place(tpr);
    const int rpb = place.rows_per_block, group = place.group, lane = place.lane;
    if (rpb > 1) {
        __syncthreads();  // group_sums may still be read by the previous call
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            long long col = ((long long)i * tpr + lane) * VEC;
            if (col < cols)
#pragma unroll
                for (int k = 0; k < VEC; ++k) group_sums[group * cols + col + k] = acc[i][k];
        }
        __syncthreads();
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            float s = 0.0f;
            for (int r = 0; r < rpb; ++r) s += group_sums[r * cols + c];
            if (LOCKED)
                locked_add<1>(dst + c, &s, first);
            else
                dst[c] = s;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        long long col = ((long long)i * tpr + lane) * VEC;
        if (col >= cols) continue;
        if constexpr (LOCKED)
            locked_add<VEC>(dst + col, acc[i], first);
        else
            store_vec<float, VEC>(dst + col, acc[i]);
    }
}

// The column sums of the R partial rows of a grid whose every block has written its rows, added
// by that grid (called by every thread of every block, after a grid-wide barrier). dw's and db's
// partial rows are taken as one row of 2 x cols columns (db's after dw's; a null dw or db is
// left out), in 16-byte quads of 4 fp32 columns: block b of G takes the b-th of G equal shares of
// the quads. Its threads are lanes x slices: lane l sums quad q0 + l (then q0 + l + lanes, ...),
// slice s the rows s, s + S, s + 2S, ... (four loads in flight, from L2: other SMs wrote them);
// the S slice sums of a quad are then added in slice order through shared memory. The order is
// fixed by G, R and the block size: the same shape gives the same bits. cols % 4 == 0;
// `scratch` holds blockDim.x float4.
//   dw[c] = sum over r of partial_dw[r][c], db likewise
template <typename W>
__device__ void grid_column_sums(const float* partial_dw, const float* partial_db, W* dw, W* db,
                                 int R, long long cols, float4* scratch) {
    const long long quads = cols / 4;  // of each output
    const long long all = (dw ? quads : 0) + (db ? quads : 0);
    const long long q0 = all * blockIdx.x / gridDim.x, q1 = all * (blockIdx.x + 1) / gridDim.x;
    // Lanes: enough for the share in two passes or fewer, leaving 8 to 32 slices (blocks of
    // fewer than 32 threads, as a split row's short slices get: one lane, a slice a thread).
    const int threads = (int)blockDim.x;
    int lanes = max(1, threads / 32);
    while (lanes < threads / 8 && 2LL * lanes < q1 - q0) lanes *= 2;
    const int slices = threads / lanes;
    const int lane = (int)threadIdx.x % lanes, slice = (int)threadIdx.x / lanes;
    // Block sizes are powers of two (staged_layout), so lanes x slices is the whole block. (Were
    // it not, the threads left over would add rows nobody reads: slice `slices` is never summed.)
    auto add = [](float4& a, const float4 b) {
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    };
    for (long long first = q0; first < q1; first += lanes) {  // the same count in every thread
        const long long q = first + lane;
        // Quad q of the joint row: of dw (when dw is wanted) while q < quads, else of db.
        const bool of_dw = dw != nullptr && q < quads;
        const long long at = of_dw || dw == nullptr ? q : q - quads;
        const float4* rows = reinterpret_cast<const float4*>(of_dw ? partial_dw : partial_db);
        float4 s[4] = {};
        if (q < q1) {
            int r = slice;
            for (; r + 3 * slices < R; r += 4 * slices)
#pragma unroll
                for (int k = 0; k < 4; ++k) add(s[k], __ldcg(rows + (r + k * slices) * quads + at));
            for (; r < R; r += slices) add(s[0], __ldcg(rows + r * quads + at));
            add(s[0], s[1]);
            add(s[2], s[3]);
            add(s[0], s[2]);
        }
        scratch[slice * lanes + lane] = s[0];
        __syncthreads();
        if (slice == 0 && q < q1) {
            float4 t = scratch[lane];
            for (int k = 1; k < slices; ++k) add(t, scratch[k * lanes + lane]);
            const float v[4] = {t.x, t.y, t.z, t.w};
            W* out = (of_dw ? dw : db) + 4 * at;
#pragma unroll
            for (int k = 0; k < 4; ++k)
                out[k] = from_float<W>(v[k]);
        }
        __syncthreads();  // scratch is free for the next pass
    }
}

// The row's two sums from each thread's share over the tpr threads of its row: of x_hat * g
// (s1) and, for LayerNorm, of g (s2; RMSNorm: 0). Contains barriers when tpr > 32 (group_sum):
// call from every thread of the block.
template <bool LAYER>
__device__ __forceinline__ float2 row_sums(float s1, float s2, int tpr, float* scratch) {
    if (LAYER) return group_sum2(make_float2(s1, s2), tpr, scratch);
    return make_float2(group_sum(s1, tpr, scratch), 0.0f);
}

// The row's two means: c1 = mean(x_hat * g), c2 = mean(g) for LayerNorm (RMSNorm: 0).
template <bool LAYER>
__device__ __forceinline__ void row_means(float s1, float s2, int tpr, float inv_n, float* scratch,
                                          float& c1, float& c2) {
    float2 s = row_sums<LAYER>(s1, s2, tpr, scratch);
    c1 = s.x * inv_n;
    c2 = s.y * inv_n;
}

// The rows a block will handle `prefetch` iterations ahead (rule B6), brought into L2 while it
// works.
template <typename T, typename W>
__device__ __forceinline__ void prefetch_backward(const BackwardParams<T, W>& p, long long rg,
                                                  int rpb) {
    prefetch_row_group(p.x, rg, rpb, p.rows, p.cols);
    prefetch_row_group(p.dy, rg, rpb, p.rows, p.cols);
    prefetch_row_group(p.dh, rg, rpb, p.rows, p.cols);
}

// A thread holding one 16-byte vector (its x and dy as stored, two fp32 sums per element) fits in
// 64 registers without spilling, so 1024-thread blocks work (rows of 4096 f32 / 8192 bf16
// values); a larger share gets 512-thread blocks.
template <int VEC, int ITEMS>
constexpr int backward_max_threads() {
    return ITEMS == 1 ? 1024 : 512;
}

// The register backward: reference version 5 (LOCKED: version 4), the row in registers and the
// rows' dw / db sums in registers across a persistent grid, with the plan's layout, x and dy kept
// in their storage type, c1 and c2 in one reduction, and the next row group prefetched into L2.
template <typename T, typename W, int VEC, int ITEMS, bool LAYER, bool LOCKED>
__global__ void __launch_bounds__(backward_max_threads<VEC, ITEMS>(), 1)
    norm_backward_kernel(BackwardParams<T, W> p, int tpr, int prefetch) {
    extern __shared__ float group_sums[];  // rows_per_block x cols, when several rows per block
    __shared__ float scratch[64];
    __shared__ int first_flag;
    const RowPlace place = row_place(tpr);
    const int rpb = place.rows_per_block, group = place.group, lane = place.lane;
    const float inv_n = 1.0f / (float)p.cols;

    // w' is read again (from L1) for each row and phase rather than held: registers go to the
    // row and the column sums.
    auto weight = [&](long long col, float(&w)[VEC]) {
        float unused[VEC];
        load_affine<W, VEC>(p.weight, (const W*)nullptr, p.zero_centered, col, w, unused);
    };
    float acc_w[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc_w[i][k] = acc_b[i][k] = 0.0f;

    const long long groups = (p.rows + rpb - 1) / rpb;
    for (int d = 1; d < prefetch; ++d)
        prefetch_backward(p, blockIdx.x + (long long)d * gridDim.x, rpb);
    for (long long rg = blockIdx.x; rg < groups; rg += gridDim.x) {
        if (prefetch > 0) prefetch_backward(p, rg + (long long)prefetch * gridDim.x, rpb);
        const long long row = rg * rpb + group;
        const bool active = row < p.rows;
        const long long base = row * p.cols;
        const float mu = (LAYER && active) ? p.mean[row] : 0.0f;
        const float rs = active ? p.rstd[row] : 0.0f;
        // x and dy stay in their storage type (a bf16 vector of 8: 4 registers); x_hat and g are
        // formed again where needed.
        Pack<T, VEC> xs[ITEMS], dys[ITEMS];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            long long col = ((long long)i * tpr + lane) * VEC;
            if (active && col < p.cols) {
                xs[i] = *reinterpret_cast<const Pack<T, VEC>*>(p.x + base + col);
                dys[i] = *reinterpret_cast<const Pack<T, VEC>*>(p.dy + base + col);
                float w[VEC];
                weight(col, w);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float dyv = to_float(dys[i].v[k]), xh = (to_float(xs[i].v[k]) - mu) * rs;
                    float g = w[k] * dyv;
                    s1 += xh * g;
                    s2 += g;
                    acc_w[i][k] += dyv * xh;
                    acc_b[i][k] += dyv;
                }
            }
        }
        float c1, c2;
        row_means<LAYER>(s1, s2, tpr, inv_n, scratch, c1, c2);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            long long col = ((long long)i * tpr + lane) * VEC;
            if (!active || col >= p.cols) continue;
            float out[VEC], w[VEC];
            weight(col, w);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                float xh = (to_float(xs[i].v[k]) - mu) * rs, g = w[k] * to_float(dys[i].v[k]);
                out[k] = (g - xh * c1 - c2) * rs;
            }
            if (p.dh) {
                float d[VEC];
                load_vec<T, VEC>(p.dh + base + col, d);
#pragma unroll
                for (int k = 0; k < VEC; ++k) out[k] += d[k];
            }
            store_vec_stream<T, VEC>(p.dx + base + col, out);
        }
    }
    if (!p.dw && !p.db) return;

    // This block's sums of dy * x_hat and dy -> one partial row (locked: added under the lock).
    int gi = (int)(blockIdx.x % p.lock_rows);
    float* row_dw = p.partial_dw + (LOCKED ? (long long)gi : (long long)blockIdx.x) * p.cols;
    float* row_db = p.partial_db + (LOCKED ? (long long)gi : (long long)blockIdx.x) * p.cols;
    bool first = true;
    if (LOCKED) first = acquire_partial_row(p.locks, p.written, gi, &first_flag);
    if (p.dw)
        write_partial_row<ITEMS, VEC, LOCKED>(acc_w, row_dw, p.cols, tpr, group_sums, first);
    if (p.db)
        write_partial_row<ITEMS, VEC, LOCKED>(acc_b, row_db, p.cols, tpr, group_sums, first);
    if (LOCKED) release_partial_row(p.locks, p.written, gi);
}

// The staged backward: reference version 5 (a persistent grid's partial rows) fed by the copy
// engine, its grid adding its own partial rows (rule B7).
// Strategy (b) with the rows staged in shared memory (Hopper; see common.cuh; which rows, their
// split and their stages: rules B3, B4): the same per-row math as norm_backward_kernel, but x, dy
// (and dh) of each row group arrive by bulk copy into one of `stages` buffers, up to `stages`
// groups ahead, and are read from there in both passes. A thread holds only its columns' sums
// of dy * x_hat and dy. The statistics of the next group are loaded while this one is worked on.
// Stage s of a block, for `streams` tensors:
//     [ x: rpb rows | dy: rpb rows | dh: rpb rows ]   (rows of cols values, as in global memory)
// SPLIT: rows too long for two stages are shared by the `parts` blocks of a cluster (one row per
// stage, rpb = 1). Block `part` stages and works on columns [part * cols, (part + 1) * cols) of
// every row its cluster takes; the row sums are completed across the cluster (cluster_row_sums)
// and each block writes its slice of the cluster's partial row. The persistent grid is then
// one of clusters: cluster u takes rows u, u + U, u + 2U, ... and owns partial row u.
// AFFINE: kAffineWeight when the call has a weight that is not zero-centred (w' = w as loaded,
// the usual module's case; rule B8), else kAffineAny (load_affine).
// p.grid_sums (the launch is cooperative; rule B7): once every block has written its partial
// row, the grid waits for all of them and adds them up (grid_column_sums): dw and db are written
// here.
template <typename T, typename W, int VEC, int ITEMS, bool LAYER, bool SPLIT, int AFFINE>
__global__ void __launch_bounds__(512, 1)
    norm_backward_staged_kernel(BackwardParams<T, W> p, int tpr, int stages) {
#ifdef FG_NORM_STAGED
    extern __shared__ __align__(128) unsigned char stage_smem[];
    __shared__ StagedSync sync;
    using V = Pack<T, VEC>;
    const RowPlace place = row_place(tpr);
    const int rpb = place.rows_per_block, group = place.group, lane = place.lane;
    const float inv_n = 1.0f / (float)p.cols;
    const int streams = p.dh ? 3 : 2;
    const StagedPlace at = staged_place<SPLIT>(p.cols);  // this block's columns and place
    const long long unit = at.unit, units = at.units, cols = at.cols, c0 = at.c0;
    const long long group_elems = (long long)rpb * cols;  // per tensor and stage
    auto staged = [&](int s, int tensor) {
        return reinterpret_cast<T*>(stage_smem) + (long long)(s * streams + tensor) * group_elems;
    };
    const long long groups = (p.rows + rpb - 1) / rpb;
    const T* const tensors[3] = {p.x, p.dy, p.dh};
    auto fill = [&](int s, long long rg) {  // thread 0: row group rg -> stage s
        stage_fill(staged(s, 0), tensors, rg, rpb, p.rows, p.cols, c0, cols, &sync.full[s]);
    };
    staged_start<SPLIT>(sync, stages, at, groups, fill, [] {});

    auto weight = [&](long long col, float(&w)[VEC]) {
        float unused[VEC];
        load_affine<W, VEC, AFFINE>(p.weight, (const W*)nullptr, p.zero_centered, c0 + col, w,
                                    unused);
    };
    auto statistics = [&](long long rg, float& mu, float& rs) {
        const long long row = rg * rpb + group;
        mu = (LAYER && row < p.rows) ? p.mean[row] : 0.0f;
        rs = row < p.rows ? p.rstd[row] : 0.0f;
    };
    float acc_w[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc_w[i][k] = acc_b[i][k] = 0.0f;
    // With at most 16 columns a thread, x_hat and g from the first pass stay in registers for
    // the second (no second conversion, no second weight read); with more, they would spill.
    // (Split bf16 / f16 rows: at most 8, or a 16-column thread runs out of its 128 registers.)
    constexpr bool kHold = ITEMS * VEC <= (SPLIT && sizeof(T) == 2 ? 8 : kHeldElems);
    float held_xh[kHold ? ITEMS : 1][VEC], held_g[kHold ? ITEMS : 1][VEC];

    float mu_next, rs_next;
    statistics(unit, mu_next, rs_next);
    int it = 0;
    for (long long rg = unit; rg < groups; rg += units, ++it) {
        const int s = it % stages;
        const float mu = mu_next, rs = rs_next;
        statistics(rg + units, mu_next, rs_next);  // on its way while this group is worked on
        const long long row = rg * rpb + group;
        const bool active = row < p.rows;
        const long long base = row * p.cols + c0;
        const V* xs = reinterpret_cast<const V*>(staged(s, 0) + (long long)group * cols);
        const V* dys = reinterpret_cast<const V*>(staged(s, 1) + (long long)group * cols);
        const V* dhs = reinterpret_cast<const V*>(staged(s, 2) + (long long)group * cols);
        stage_wait(&sync.full[s], (unsigned)(it / stages) & 1u);
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int v = i * tpr + lane;
            const long long col = (long long)v * VEC;
            if (active && col < cols) {
                const V xv = xs[v], dyv = dys[v];
                float w[VEC];
                weight(col, w);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float d = to_float(dyv.v[k]), xh = (to_float(xv.v[k]) - mu) * rs;
                    float g = w[k] * d;
                    s1 += xh * g;
                    s2 += g;
                    acc_w[i][k] += d * xh;
                    acc_b[i][k] += d;
                    if constexpr (kHold) {
                        held_xh[i][k] = xh;
                        held_g[i][k] = g;
                    }
                }
            }
        }
        float2 sums = row_sums<LAYER>(s1, s2, tpr, sync.scratch);
        if constexpr (SPLIT)
            sums = cluster_row_sums(sums, sync.cluster_slots, sync.cluster_full, it);
        const float c1 = sums.x * inv_n, c2 = sums.y * inv_n;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int v = i * tpr + lane;
            const long long col = (long long)v * VEC;
            if (!active || col >= cols) continue;
            float out[VEC];
            if constexpr (kHold) {
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    out[k] = (held_g[i][k] - held_xh[i][k] * c1 - c2) * rs;
            } else {  // formed again from the stage
                const V xv = xs[v], dyv = dys[v];
                float w[VEC];
                weight(col, w);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    float xh = (to_float(xv.v[k]) - mu) * rs, g = w[k] * to_float(dyv.v[k]);
                    out[k] = (g - xh * c1 - c2) * rs;
                }
            }
            if (p.dh) {
                const V dhv = dhs[v];
#pragma unroll
                for (int k = 0; k < VEC; ++k) out[k] += to_float(dhv.v[k]);
            }
            store_vec_stream<T, VEC>(p.dx + base + col, out);
        }
        __syncthreads();  // every thread is done with stage s: refill it
        const long long refill = rg + (long long)stages * units;
        if (threadIdx.x == 0 && refill < groups) fill(s, refill);
    }
    // (SPLIT: a block has received every block's sums of its last row before it gets here, so
    // nothing can still be sent to its shared memory once it leaves.)
    if (!p.dw && !p.db) return;
    // Every fill has been waited for: the stage buffers are free for the row groups' sums.
    float* group_sums = reinterpret_cast<float*>(stage_smem);
    float* row_dw = p.partial_dw + unit * p.cols + c0;
    float* row_db = p.partial_db + unit * p.cols + c0;
    if (p.dw) write_partial_row<ITEMS, VEC, false>(acc_w, row_dw, cols, tpr, group_sums, true);
    if (p.db) write_partial_row<ITEMS, VEC, false>(acc_b, row_db, cols, tpr, group_sums, true);
    if (!p.grid_sums) return;  // the column kernel adds the partial rows
    // Every block's partial row written and visible (the grid barrier orders memory too); the
    // shared memory is free again (every thread of this block has passed the barrier).
    cooperative_groups::this_grid().sync();
    float4* scratch = reinterpret_cast<float4*>(stage_smem);
    grid_column_sums(p.partial_dw, p.partial_db, p.dw, p.db, (int)units, p.cols, scratch);
#else
    (void)p, (void)tpr, (void)stages;
    __trap();  // the host launches this only where the device code has it (staging_supported)
#endif
}

// The looped backward: reference version 2's two passes over a row, by a block of 16-byte vectors,
// with version 5's (LOCKED: version 4's) partial rows, updated row by row.
// Long rows: one block per row, streamed in two passes (sums, then dx). The block's partial row
// is updated a vector at a time in pass 2 (grid: a row it owns alone; locked: under the lock).
template <typename T, typename W, int VEC, bool LAYER, bool LOCKED>
__global__ void __launch_bounds__(512, 1)
    norm_backward_looped_kernel(BackwardParams<T, W> p, int prefetch) {
    __shared__ float scratch[64];
    __shared__ int first_flag;
    const long long step = (long long)blockDim.x * VEC;
    const float inv_n = 1.0f / (float)p.cols;
    for (int d = 1; d < prefetch; ++d)
        prefetch_backward(p, blockIdx.x + (long long)d * gridDim.x, 1);
    for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
        if (prefetch > 0) prefetch_backward(p, row + (long long)prefetch * gridDim.x, 1);
        const long long base = row * p.cols;
        const float mu = LAYER ? p.mean[row] : 0.0f;
        const float rs = p.rstd[row];
        float s1 = 0.0f, s2 = 0.0f;
        for (long long col = (long long)threadIdx.x * VEC; col < p.cols; col += step) {
            float xv[VEC], dyv[VEC], w[VEC], unused[VEC];
            load_vec<T, VEC>(p.x + base + col, xv);
            load_vec<T, VEC>(p.dy + base + col, dyv);
            load_affine<W, VEC>(p.weight, (const W*)nullptr, p.zero_centered, col, w, unused);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                float xh = (xv[k] - mu) * rs, g = w[k] * dyv[k];
                s1 += xh * g;
                s2 += g;
            }
        }
        float c1, c2;
        row_means<LAYER>(s1, s2, blockDim.x, inv_n, scratch, c1, c2);
        const bool partials = p.dw || p.db;
        int gi = (int)(row % p.lock_rows);
        bool first = row == blockIdx.x;  // grid: the first row this block handles
        if (LOCKED && partials) first = acquire_partial_row(p.locks, p.written, gi, &first_flag);
        float* row_dw = p.partial_dw + (LOCKED ? (long long)gi : (long long)blockIdx.x) * p.cols;
        float* row_db = p.partial_db + (LOCKED ? (long long)gi : (long long)blockIdx.x) * p.cols;
        for (long long col = (long long)threadIdx.x * VEC; col < p.cols; col += step) {
            float xv[VEC], dyv[VEC], w[VEC], unused[VEC], out[VEC];
            load_vec<T, VEC>(p.x + base + col, xv);
            load_vec<T, VEC>(p.dy + base + col, dyv);
            load_affine<W, VEC>(p.weight, (const W*)nullptr, p.zero_centered, col, w, unused);
            float d[VEC] = {};
            if (p.dh) load_vec<T, VEC>(p.dh + base + col, d);
            float pw[VEC], pb[VEC];   // this block's partial dw, db for these columns
            if (!LOCKED && !first) {  // grid: a row this block alone owns, vector loads
                if (p.dw) load_vec<float, VEC>(row_dw + col, pw);
                if (p.db) load_vec<float, VEC>(row_db + col, pb);
            }
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                float xh = (xv[k] - mu) * rs, g = w[k] * dyv[k];
                out[k] = (g - xh * c1 - c2) * rs + d[k];
                pw[k] = (LOCKED || first ? 0.0f : pw[k]) + dyv[k] * xh;
                pb[k] = (LOCKED || first ? 0.0f : pb[k]) + dyv[k];
            }
            if (LOCKED) {  // this row's terms added under the lock
                if (p.dw) locked_add<VEC>(row_dw + col, pw, first);
                if (p.db) locked_add<VEC>(row_db + col, pb, first);
            } else {
                if (p.dw) store_vec<float, VEC>(row_dw + col, pw);
                if (p.db) store_vec<float, VEC>(row_db + col, pb);
            }
            store_vec_stream<T, VEC>(p.dx + base + col, out);
        }
        if (LOCKED && partials) release_partial_row(p.locks, p.written, gi);
    }
}

// Column-parallel sum of R partial rows: block (32, 32) covers 32 columns, thread row ty adds
// rows ty, ty + 32, ... (four at a time, into four running sums, so four loads are in flight);
// the 32 sums are then added in order. blockIdx.y: 0 for dw, 1 for db. A fixed order throughout:
// the same R gives the same bits.
template <typename W>
__global__ void norm_partials_sum_kernel(const float* partial_dw, const float* partial_db, int R,
                                         long long cols, W* dw, W* db) {
    __shared__ float tile[32][33];
    const float* part = blockIdx.y == 0 ? partial_dw : partial_db;
    W* out = blockIdx.y == 0 ? dw : db;
    if (out == nullptr) return;
    long long c = blockIdx.x * 32LL + threadIdx.x;
    float s = 0.0f;
    if (c < cols) {
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int r = threadIdx.y;
        for (; r + 96 < R; r += 128)
#pragma unroll
            for (int k = 0; k < 4; ++k) s4[k] += part[(long long)(r + 32 * k) * cols + c];
        for (; r < R; r += 32) s4[0] += part[(long long)r * cols + c];
        s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    }
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.0f;
#pragma unroll 8
        for (int k = 0; k < 32; ++k) total += tile[k][threadIdx.x];
        out[c] = from_float<W>(total);
    }
}

// Whether the staged kernels are in this binary and the device can run them (common.cuh).
bool staging_supported() {
    static const bool ok = staging_built_for((const void*)norm_partials_sum_kernel<float>);
    return ok;
}

// The plan of one backward call: what the call is (pointers' alignment included), planned for
// this device under the call's tuning.
BackwardPlan plan_for(const NormBackwardArgs& a) {
    const int eb = elem_bytes(a.x_type), wb = a.w_type == ScalarType::f32 ? 4 : 2;
    const int vec = 16 / eb;
    NormCall call;
    call.kind = a.kind;
    call.elem_bytes = eb;
    call.weight_bytes = wb;
    call.rows = a.rows;
    call.cols = a.cols;
    call.weight = a.weight != nullptr;
    call.zero_centered = a.zero_centered;
    call.dh = a.dh != nullptr;
    call.partials = a.dweight != nullptr || a.dbias != nullptr;
    call.reduction = a.reduction;
    call.vector_ok = a.cols % vec == 0;
    for (const void* ptr : {a.x, a.dy, a.dh, (const void*)a.dx})
        call.vector_ok = call.vector_ok && aligned_to(ptr, 16);
    call.vector_ok = call.vector_ok && aligned_to(a.weight, wb * vec);
    static const NormDevice device = norm_device(staging_supported());
    return plan_backward(call, device, a.tuning ? *a.tuning : NormTuning{});
}

// Launches the main kernel; returns the partial rows it wrote. Both strategies run as many
// blocks as fit on the device at once (occupancy), at most plan.blocks: grid (b) one partial row
// a block (P), locked (a) the G that rule B5 gives the grid it runs (a plan sized by threads
// alone would give a kernel of many registers a second wave of blocks, which then queue on the
// locks behind the first).
template <typename T, typename W, int VEC, bool LAYER, bool LOCKED>
int launch_backward(BackwardParams<T, W> p, const BackwardPlan& plan) {
    const RowLayout& l = plan.layout;
    const int prefetch = plan.prefetch;
    unsigned blocks = (unsigned)std::max(1LL, plan.blocks);
    auto size_grid = [&](const void* kernel) {
        blocks = persistent_blocks(kernel, l.threads, plan.smem, plan.blocks,
                                   plan.grid_threads_per_sm);
        if (LOCKED) p.lock_rows = locked_partial_rows(blocks, plan.lock_rows);
    };
    if constexpr (!LOCKED && VEC > 1) {
        const StagedPlan& staged = plan.staged;
        if (staged.stages > 0) {
            auto launch = [&](auto items_tag, auto affine_tag) {
                constexpr int kItems = decltype(items_tag)::value;
                constexpr int kAffine = decltype(affine_tag)::value;
                if constexpr (kItems <= 4 && kItems * VEC <= kStagedElems) {
                    if (staged.split > 1) {
                        constexpr auto kernel =
                            norm_backward_staged_kernel<T, W, VEC, kItems, LAYER, true, kAffine>;
                        allow_dynamic_smem((const void*)kernel, staged.smem);
                        blocks = launch_split<kernel>(p, staged, plan.blocks, p.grid_sums);
                    } else {
                        constexpr auto kernel =
                            norm_backward_staged_kernel<T, W, VEC, kItems, LAYER, false, kAffine>;
                        allow_dynamic_smem((const void*)kernel, staged.smem);
                        size_grid((const void*)kernel);
                        launch_staged<kernel>(p, staged, blocks, p.grid_sums);
                    }
                }
            };
            // The usual module's weight (present, not zero-centred) as a constant (rule B8).
            const bool plain_weight = plan.plain_weight;
            with_items(l.items, [&](auto items_tag) {
                if (plain_weight) launch(items_tag, std::integral_constant<int, kAffineWeight>{});
                else launch(items_tag, std::integral_constant<int, kAffineAny>{});
            });
            FG_LAUNCH_CHECK();
            return (int)blocks;
        }
    }
    if (l.looped) {
        auto kernel = norm_backward_looped_kernel<T, W, VEC, LAYER, LOCKED>;
        size_grid((const void*)kernel);
        kernel<<<blocks, l.threads, 0, stream()>>>(p, prefetch);
    } else {
        // Only the configurations row_layout can choose (at most kBackwardElems elements per
        // thread) are instantiated: the larger ones would not fit in registers.
        auto launch = [&](auto items_tag) {
            constexpr int kItems = decltype(items_tag)::value;
            if constexpr (kItems * VEC <= kBackwardElems) {
                auto kernel = norm_backward_kernel<T, W, VEC, kItems, LAYER, LOCKED>;
                size_grid((const void*)kernel);
                kernel<<<blocks, l.threads, plan.smem, stream()>>>(p, l.tpr, prefetch);
            }
        };
        with_items(l.items, launch);
    }
    FG_LAUNCH_CHECK();
    return LOCKED ? p.lock_rows : (int)blocks;
}

// Returns the number of partial rows the main kernel wrote.
template <typename T, typename W, int VEC, bool LAYER>
int launch_backward_strategy(const BackwardParams<T, W>& p, const BackwardPlan& plan) {
    const bool locked = plan.reduction == NormReduction::locked;
    return locked ? launch_backward<T, W, VEC, LAYER, true>(p, plan)
                  : launch_backward<T, W, VEC, LAYER, false>(p, plan);
}

template <typename T, typename W>
void backward_typed(const NormBackwardArgs& a) {
    const BackwardPlan plan = plan_for(a);
    BackwardParams<T, W> p{};
    p.rows = a.rows;
    p.cols = a.cols;
    p.zero_centered = a.zero_centered;
    p.x = static_cast<const T*>(a.x);
    p.dy = static_cast<const T*>(a.dy);
    p.dh = static_cast<const T*>(a.dh);
    p.weight = static_cast<const W*>(a.weight);
    p.mean = a.mean;
    p.rstd = a.rstd;
    p.dx = static_cast<T*>(a.dx);
    p.lock_rows = plan.partial_rows;
    p.grid_sums = plan.grid_sums;
    p.dw = static_cast<W*>(a.dweight);
    p.db = static_cast<W*>(a.dbias);
    if (plan.partials) {
        char* ws = static_cast<char*>(a.workspace);
        std::size_t part = round256(sizeof(float) * (std::size_t)plan.partial_rows * a.cols);
        p.partial_dw = reinterpret_cast<float*>(ws);
        p.partial_db = reinterpret_cast<float*>(ws + part);
        p.locks = reinterpret_cast<int*>(ws + 2 * part);
        p.written = p.locks + plan.partial_rows;
        if (plan.reduction == NormReduction::locked)  // in-stream reset: graph-safe, no host sync
            memset_device(p.locks, 0, 2 * sizeof(int) * plan.partial_rows);
    }
    constexpr int kVec = 16 / sizeof(T);
    bool layer = a.kind == NormKind::layer;
    int written_rows;
    if (plan.vector_ok) {
        written_rows = layer ? launch_backward_strategy<T, W, kVec, true>(p, plan)
                             : launch_backward_strategy<T, W, kVec, false>(p, plan);
    } else {
        written_rows = layer ? launch_backward_strategy<T, W, 1, true>(p, plan)
                             : launch_backward_strategy<T, W, 1, false>(p, plan);
    }
    if (plan.partials && !plan.grid_sums) {
        dim3 grid((unsigned)((a.cols + 31) / 32), 2);
        norm_partials_sum_kernel<W><<<grid, dim3(32, 32), 0, stream()>>>(
            p.partial_dw, p.partial_db, written_rows, a.cols, static_cast<W*>(a.dweight),
            static_cast<W*>(a.dbias));
        FG_LAUNCH_CHECK();
    }
}

template <typename T>
void backward_weight(const NormBackwardArgs& a) {
    if (a.w_type == ScalarType::f32)
        backward_typed<T, float>(a);
    else
        backward_typed<T, T>(a);
}

// dw / db of zero rows: zero.
void zero_gradients(const NormBackwardArgs& a) {
    if (a.dweight) fill(a.dweight, a.w_type, 0.0, a.cols);
    if (a.dbias) fill(a.dbias, a.w_type, 0.0, a.cols);
}

}  // namespace

std::size_t norm_backward_workspace_bytes(const NormBackwardArgs& a) {
    if (a.rows == 0 || a.cols == 0) return 0;
    return backward_workspace_bytes(plan_for(a), a.cols);
}

void norm_backward(const NormBackwardArgs& a) {
    if (a.cols == 0) return;
    if (a.rows == 0) {
        zero_gradients(a);
        return;
    }
    switch (a.x_type) {
        case ScalarType::f32:
            backward_typed<float, float>(a);
            break;
        case ScalarType::bf16:
            backward_weight<__nv_bfloat16>(a);
            break;
        case ScalarType::f16:
            backward_weight<__half>(a);
            break;
        default:
            throw CudaError("[norm] unsupported dtype for the norm kernels");
    }
}

}  // namespace fg::kernels
