// kernels/norm/common.cuh: device pieces the tuned norm kernels share (included from forward.cu
// and backward.cu only): 16-byte vector packs, a row's place in a block, sums over the threads
// that hold one row, the staging of row groups in shared memory, and the launch helpers that
// carry out a plan (the plans themselves are plan.h's; the float <-> storage conversions are
// float_types.cuh's).
//
// Geometry. A row of N values is held by `tpr` threads (a power of two, 4 to 1024). Thread `lane`
// of a row holds ITEMS vectors of VEC elements: vector i covers columns (i * tpr + lane) * VEC ..
// + VEC - 1, so neighbouring lanes read neighbouring 16 bytes (coalesced). A block has at least
// 128 threads, so rows of up to 64 threads share one (rows_per_block = threads / tpr).
// Rows too long to hold in registers go through the "looped" kernels, which stream the row in
// chunks and read it again (mostly from L2) instead of spilling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cooperative_groups.h>
#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/float_types.cuh"
#include "kernels/norm.h"
#include "kernels/norm/plan.h"
#include "kernels/runtime.h"

namespace fg::kernels::norm_detail {

using namespace norm_plan;  // RowLayout, StagedPlan, the kernels' limits (kForwardElems, ...)

// to_float / from_float: kernels/float_types.cuh.

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
    Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = to_float(pk.v[k]);
}

// VEC fp32 values rounded to T, as one pack.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> pack_of(const float (&in)[VEC]) {
    Pack<T, VEC> pk;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pk.v[k] = from_float<T>(in[k]);
    return pk;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
    *reinterpret_cast<Pack<T, VEC>*>(p) = pack_of<T, VEC>(in);
}

// Stores of values this kernel and the next will not read again (y, dx): st.global.cs, which
// allocates the lines evict-first in L1 and L2, so that they do not push out what will be read
// again (rows on their way, a looped row's first read, the weights).
template <typename T, int VEC>
__device__ __forceinline__ void store_vec_stream(T* p, const float (&in)[VEC]) {
    if constexpr (sizeof(Pack<T, VEC>) == 16) {
        const Pack<T, VEC> pk = pack_of<T, VEC>(in);
        uint4 u;
        memcpy(&u, &pk, sizeof(u));
        __stcs(reinterpret_cast<uint4*>(p), u);
    } else {
        store_vec<T, VEC>(p, in);  // smaller packs store plainly
    }
}

// What a kernel knows at compile time about y = x_hat * w' + b. kAffineAny: nothing; the weight,
// the bias and zero-centring are read at run time (every case: no weight, w' = 1; no bias,
// b = 0). kAffineWeight / kAffineWeightBias: the usual modules' case, a weight, not zero-centred,
// and no bias (RMSNorm) / a bias (LayerNorm): no defaults to build, no 0 or 1 added to every
// weight, no predicated loads: the run-time cases otherwise cost instructions on every vector
// a thread writes (rules F10 and B8, docs/norms.md).
constexpr int kAffineAny = 0, kAffineWeight = 1, kAffineWeightBias = 2;
// The usual case for a norm: LayerNorm with a bias, RMSNorm without one.
constexpr int usual_affine(bool layer) { return layer ? kAffineWeightBias : kAffineWeight; }

// Weight and bias of one vector of columns: w' (1 + w when zero-centred, 1 without a weight), b
// (0 without a bias); with AFFINE other than kAffineAny, the case it names (zc is not read).
template <typename W, int VEC, int AFFINE = kAffineAny>
__device__ __forceinline__ void load_affine(const W* weight, const W* bias, bool zc, long long col,
                                            float (&w)[VEC], float (&b)[VEC]) {
    if constexpr (AFFINE != kAffineAny) {
        load_vec<W, VEC>(weight + col, w);
        if constexpr (AFFINE == kAffineWeightBias) {
            load_vec<W, VEC>(bias + col, b);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) b[k] = 0.0f;
        }
        return;
    }
    if (weight) {
        load_vec<W, VEC>(weight + col, w);
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] += zc ? 1.0f : 0.0f;
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = 1.0f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) b[k] = 0.0f;
    if (bias) load_vec<W, VEC>(bias + col, b);
}

// Where a thread sits when rows of tpr threads (a power of two) share a block: its row group
// (rows_per_block of them), its lane within the row. Shifts and masks: a division by a value
// known only at run time costs some twenty instructions.
struct RowPlace {
    int rows_per_block, group, lane;
};
__device__ __forceinline__ RowPlace row_place(int tpr) {
    const int shift = __ffs(tpr) - 1;
    return {(int)blockDim.x >> shift, (int)threadIdx.x >> shift, (int)threadIdx.x & (tpr - 1)};
}

// Sum of v over the `width` lanes (a power of two, at most 32) of each aligned lane group of
// the warp, by xor shuffles; every lane of a group gets the same bits.
__device__ __forceinline__ float warp_sum(float v, int width) {
    for (int offset = width / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum of v over the tpr threads (a power of two) of this row group; every one of them gets the
// same bits. tpr <= 32: xor shuffles within the lanes of the group. tpr > 32: shuffles, then each
// warp's sum through `scratch` (one float per warp of the block), and every warp of the group adds
// the group's warp sums again by shuffles, lane l taking warp sum l mod (tpr / 32): the same sums
// in the same order in every warp. (An xor shuffle hands lanes l and l ^ o the same two values, and
// a + b == b + a exactly, so every lane ends with the same bits.) Contains barriers when tpr > 32:
// call from every thread of the block.
__device__ __forceinline__ float group_sum(float v, int tpr, float* scratch) {
    v = warp_sum(v, tpr < 32 ? tpr : 32);
    if (tpr <= 32) return v;
    const int warps = tpr >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // scratch may still be read by the previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(scratch[(warp & ~(warps - 1)) + (lane & (warps - 1))], warps);
}

// Two sums at once (one set of barriers for both); `scratch` holds 64 floats.
__device__ __forceinline__ float2 group_sum2(float2 v, int tpr, float* scratch) {
    const int width = tpr < 32 ? tpr : 32;
    v.x = warp_sum(v.x, width);
    v.y = warp_sum(v.y, width);
    if (tpr <= 32) return v;
    const int warps = tpr >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v.x;
        scratch[32 + warp] = v.y;
    }
    __syncthreads();
    const int slot = (warp & ~(warps - 1)) + (lane & (warps - 1));
    return make_float2(warp_sum(scratch[slot], warps), warp_sum(scratch[32 + slot], warps));
}

// The 16 bytes of a vector load as a Pack (the cache-hinted loads below read into a uint4).
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> pack_from_bits(const uint4& bits) {
    Pack<T, VEC> out;
    static_assert(sizeof(out) == sizeof(bits));
    memcpy(&out, &bits, sizeof(bits));
    return out;
}

// Loads of a row that is read twice (the looped forward): the first read asks L1 and L2 to keep
// the lines (evict_last in both), so that the second still finds them, in L1 if it can; the
// second reads them as last used (ld.global.cs) and gives them back their normal L2 priority.
// 16-byte packs carry the hints; smaller ones load plainly. (The hint is for L1 as well as L2:
// with y stored evict-first, the second read then finds the row in L1 or L2, so the row is read
// from DRAM once.)
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack_keep(const T* p) {
    if constexpr (sizeof(Pack<T, VEC>) == 16) {
        std::uint64_t policy;
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
        uint4 r;
        asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(__cvta_generic_to_global(p)), "l"(policy)
                     : "memory");
        return pack_from_bits<T, VEC>(r);
    } else {
        return *reinterpret_cast<const Pack<T, VEC>*>(p);
    }
}
// Gives the 128-byte line holding p back its normal L2 priority.
__device__ __forceinline__ void l2_evict_normal(const void* p) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(
        __cvta_generic_to_global(p) & ~std::uint64_t{127}));
}
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack_last_use(const T* p) {
    if constexpr (sizeof(Pack<T, VEC>) == 16) {
        const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
        // Lines marked evict_last stay so after this read (ld.cs, and a load with an evict_first
        // policy, leave a line's priority as it was): a flush that writes twice the L2 then cannot
        // evict them, and they crowd later kernels out of L2, slowing whatever runs next. The
        // thread holding the start of a 128-byte line hands it back to normal priority (see also
        // row_last_use).
        if ((reinterpret_cast<std::uintptr_t>(p) & 127) == 0) l2_evict_normal(p);
        return pack_from_bits<T, VEC>(r);
    } else {
        return *reinterpret_cast<const Pack<T, VEC>*>(p);
    }
}
// After a row's second read with load_pack_last_use: a row that does not start on a 128-byte
// line shares its first line with the row before, whose block demoted that line, perhaps before
// this row's first read marked it evict_last again. The thread holding the row's first vector
// demotes it once more. (Every block demotes after it marks, so whatever the order of the two
// blocks, the line ends at normal priority.)
template <typename T, int VEC>
__device__ __forceinline__ void row_last_use(const T* row_start) {
    if constexpr (sizeof(Pack<T, VEC>) == 16)
        if ((reinterpret_cast<std::uintptr_t>(row_start) & 127) != 0) l2_evict_normal(row_start);
}

// Asks the memory system to start bringing bytes [p, p + bytes) into L2 and returns at once: a
// hint that reads nothing into registers and makes no one wait, so a persistent block can have its
// next rows on the way while it works on this one. The range is shrunk inward to 16-byte
// boundaries (the bulk prefetch's unit); its 16 KiB chunks are shared out over the `n` calling
// threads, `i` being this one. Before Hopper: one 128-byte line per prefetch instruction.
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes, int i, int n) {
    std::uintptr_t lo = (reinterpret_cast<std::uintptr_t>(p) + 15) & ~std::uintptr_t(15);
    std::uintptr_t hi = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~std::uintptr_t(15);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr std::uintptr_t kChunk = 16384;
    for (std::uintptr_t c = lo + i * kChunk; c < hi; c += n * kChunk) {
        unsigned size = (unsigned)(hi - c < kChunk ? hi - c : kChunk);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                         __cvta_generic_to_global(reinterpret_cast<const void*>(c))),
                     "r"(size));
    }
#else
    for (std::uintptr_t c = lo + i * 128; c < hi; c += n * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(
            __cvta_generic_to_global(reinterpret_cast<const void*>(c))));
#endif
}

// Prefetches row group `rg` (rows rg * rpb .. rg * rpb + rpb - 1, clipped to `rows`) of a
// rows x cols tensor into L2, shared over the block's threads. Nothing when `t` is null or the
// group lies past the end.
template <typename T>
__device__ __forceinline__ void prefetch_row_group(const T* t, long long rg, int rpb,
                                                   long long rows, long long cols) {
    const long long first = rg * rpb;
    if (t == nullptr || first >= rows) return;
    const long long count = (rows - first < rpb ? rows - first : rpb);
    prefetch_l2(t + first * cols, count * cols * (long long)sizeof(T), threadIdx.x, blockDim.x);
}

// Staging row groups in shared memory (Hopper, sm_90, and later). A persistent block keeps up to
// kMaxStages row groups on their way at once: one thread asks the copy engine (TMA) for a group's
// bytes with cp.async.bulk, one instruction per tensor, and records how many bytes to expect on
// that stage's mbarrier; the other threads issue nothing. They wait on the barrier's phase, work
// from shared memory, and once all of them are done the stage is refilled with a later group.
// Memory is kept busy by the copy engine while the threads reduce and compute, which a block
// holding its rows in registers cannot do (its loads stop at its first row sum).
// Phases: a stage's barrier completes once per fill; the k-th fill of a stage is waited on with
// parity k & 1. FG_NORM_STAGED marks the device passes that have these instructions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FG_NORM_STAGED 1
#endif

#ifdef FG_NORM_STAGED
// Thread 0 only: barriers with one arrival per phase (the thread that issues the copies), made
// visible to the copy engine before any copy signals them. Follow with __syncthreads().
__device__ __forceinline__ void stage_barriers_init(std::uint64_t* bars, int n) {
    for (int i = 0; i < n; ++i) cuda::ptx::mbarrier_init(&bars[i], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// Thread 0 only: this stage's next phase completes once `bytes` have landed.
__device__ __forceinline__ void stage_expect(std::uint64_t* bar, unsigned bytes) {
    (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                               cuda::ptx::space_shared, bar, bytes);
}

// Thread 0 only: copy `bytes` (a multiple of 16, both ends 16-byte aligned) global -> shared;
// the copy engine counts them off on `bar`.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, unsigned bytes,
                                           std::uint64_t* bar) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
}

// Every thread: returns once the phase with this parity has completed (its bytes are visible).
__device__ __forceinline__ void stage_wait(std::uint64_t* bar, unsigned parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

// Thread 0 only: row group `rg` (rows rg * rpb .., clipped to `rows`; of each row the columns
// [c0, c0 + cols) of `row_len`) of `n` tensors -> `stage`, one after the other, each taking
// rpb * cols elements; `bar`'s next phase completes when all of it has landed. The group's rows
// are contiguous in global memory unless a row is split (then rpb = 1): one bulk copy a tensor.
template <typename T, int n>
__device__ __forceinline__ void stage_fill(T* stage, const T* const (&tensors)[n], long long rg,
                                           int rpb, long long rows, long long row_len,
                                           long long c0, long long cols, std::uint64_t* bar) {
    const long long first = rg * rpb;
    const long long offset = first * row_len + c0;
    const long long elems = std::min<long long>(rpb, rows - first) * cols;
    const unsigned bytes = (unsigned)(elems * (long long)sizeof(T));
    int streams = 0;
    for (int t = 0; t < n; ++t) streams += tensors[t] != nullptr;
    stage_expect(bar, bytes * streams);
    for (int t = 0, s = 0; t < n; ++t)  // s: the tensor's place in the stage
        if (tensors[t])
            stage_copy(stage + (long long)(s++) * rpb * cols, tensors[t] + offset, bytes, bar);
}

// Where a staged block works: columns [c0, c0 + cols) of every row it takes (its slice, `part` of
// `parts`, of a row split over its cluster; unsplit: the whole row), and the unit `unit` of the
// `units` of the persistent grid (clusters when split, else blocks), which takes the row groups
// unit, unit + units, unit + 2 units, ...
struct StagedPlace {
    int part = 0, parts = 1;
    long long unit = 0, units = 1, cols = 0, c0 = 0;
};
template <bool SPLIT>
__device__ __forceinline__ StagedPlace staged_place(long long row_len) {
    StagedPlace at;
    if constexpr (SPLIT) {
        at.part = (int)cooperative_groups::this_cluster().block_rank();
        at.parts = (int)cooperative_groups::this_cluster().num_blocks();
    }
    at.unit = blockIdx.x / at.parts;
    at.units = gridDim.x / at.parts;
    at.cols = row_len / at.parts;
    at.c0 = (long long)at.part * at.cols;
    return at;
}

// The static shared memory of every staged kernel (declared `__shared__ StagedSync sync;`): the
// stages' barriers, the scratch of the row sums (group_sum2), and, for SPLIT rows, the slots and
// barriers of cluster_row_sums (each block's row sums, two sets).
struct StagedSync {
    std::uint64_t full[kMaxStages];  // stage s holds its row group
    std::uint64_t cluster_full[2];   // SPLIT: a set of slots is full
    float2 cluster_slots[2][kMaxSplit];
    float scratch[64];
};

// A staged kernel's start, every thread: thread 0 initialises the stages' barriers (and, SPLIT,
// the two of cluster_row_sums), has `more()` issue any copies of its own, and fills the stages
// with the block's first row groups (fill(stage, row group)). No thread goes on before then, and
// when SPLIT no block goes on before every block of its cluster has its barriers: none may send
// its row sums to a barrier that is not initialised yet.
template <bool SPLIT, typename Fill, typename More>
__device__ __forceinline__ void staged_start(StagedSync& sync, int stages, const StagedPlace& at,
                                             long long groups, Fill fill, More more) {
    if (threadIdx.x == 0) {
        stage_barriers_init(sync.full, stages);
        if (SPLIT) stage_barriers_init(sync.cluster_full, 2);
        more();
        for (int s = 0; s < stages && at.unit + (long long)s * at.units < groups; ++s)
            fill(s, at.unit + (long long)s * at.units);
    }
    if constexpr (SPLIT)
        cooperative_groups::this_cluster().sync();
    else
        __syncthreads();
}

// A row split over the blocks of a cluster (a slice of its columns each): each block's two
// partial row sums -> the row's, added in block-rank order by every block (so all of them get the
// same bits). Block r's thread 0 sends its sums to slot r of every block of the cluster (itself
// included) with st.async, a remote store that counts its 8 bytes off on the receiver's mbarrier;
// each block then waits for that barrier's phase, as for a stage. No cluster-wide barrier (whose
// release would wait for this thread's outstanding stores of the row's output) and no fence: a
// block moves on as soon as its own slots are full. Slots and barriers come in two sets, used by
// alternate rows (`it`: the block's row count so far): a block can only send row k + 2's sums
// once every block has sent row k + 1's, which each sends after reading row k's. Before the first
// call: the barriers initialised by stage_barriers_init(full, 2), then a cluster barrier.
__device__ __forceinline__ float2 cluster_row_sums(float2 mine, float2 (*slots)[kMaxSplit],
                                                   std::uint64_t* full, int it) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned parts = cluster.num_blocks(), rank = cluster.block_rank();
    const int set = it & 1;
    if (threadIdx.x == 0) {
        stage_expect(&full[set], parts * (unsigned)sizeof(float2));
        const float sums[2] = {mine.x, mine.y};
        for (unsigned r = 0; r < parts; ++r)
            cuda::ptx::st_async(
                reinterpret_cast<float*>(cluster.map_shared_rank(&slots[set][rank], r)), sums,
                cluster.map_shared_rank(&full[set], r));
    }
    stage_wait(&full[set], (unsigned)(it >> 1) & 1u);
    float2 total = make_float2(0.0f, 0.0f);
    for (unsigned r = 0; r < parts; ++r) {
        total.x += slots[set][r].x;
        total.y += slots[set][r].y;
    }
    return total;
}
#endif

// Calls f(std::integral_constant<int, items>{}) for a layout's items (1, 2, 4 or 8): the kernels
// are templates on it, and each launcher instantiates only the counts it can be given.
template <typename F>
void with_items(int items, F&& f) {
    switch (items) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

// Blocks of a persistent grid: as many as fit on the device at once (at most threads_per_sm, the
// tuning's cap, per SM), never more than there are row groups.
inline unsigned persistent_blocks(const void* kernel, int threads, std::size_t smem,
                                  long long groups, int threads_per_sm) {
    int per_sm = std::min(resident_blocks_per_sm(kernel, threads, smem),
                          std::max(1, threads_per_sm / threads));
    return (unsigned)std::max(1LL, std::min(groups, (long long)per_sm * device_info().sm_count));
}

// Whether staged kernels can run: a Hopper-or-later device, and device code built for it (a
// binary built only for sm_80 runs its sm_80 code, without bulk copies, on an H100 too). `kernel`:
// any kernel of the calling file (its binary version is that of the whole file).
inline bool staging_built_for(const void* kernel) {
    if (device_info().compute_major < 9) return false;
    cudaFuncAttributes attr{};
    FG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.binaryVersion >= 90;
}

// The device as the plans see it (plan.h); `staging`: staging_built_for one of the caller's
// kernels.
inline NormDevice norm_device(bool staging) {
    const DeviceInfo& d = device_info();
    NormDevice n;
    n.sm_count = d.sm_count;
    n.l2_bytes = d.l2_bytes;
    n.max_threads_per_sm = d.max_threads_per_sm;
    n.smem_per_block_optin = d.smem_per_block_optin;
    n.smem_per_sm = d.smem_per_sm;
    n.cooperative_launch = d.cooperative_launch;
    n.staging = staging;
    return n;
}

// The launch attribute that makes a grid cooperative: the driver starts it only if all of its
// blocks are resident at once, so they may wait for each other (cooperative_groups grid sync).
inline cudaLaunchAttribute cooperative_attribute() {
    cudaLaunchAttribute a{};
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
    return a;
}

// A staged kernel's launch: `blocks` blocks of the plan's threads and shared memory, on the
// stream, no attributes yet.
inline cudaLaunchConfig_t staged_config(const StagedPlan& plan, unsigned blocks) {
    cudaLaunchConfig_t config{};
    config.blockDim = dim3((unsigned)plan.rows.threads);
    config.gridDim = dim3(blocks);
    config.dynamicSmemBytes = plan.smem;
    config.stream = stream();
    return config;
}

// Launches a staged kernel, kernel(p, tpr, stages), as `blocks` blocks of the plan's threads, on
// the stream; `cooperative`: with cooperative_attribute (the grid is sized to fit at once).
template <auto kernel, typename Params>
void launch_staged(const Params& p, const StagedPlan& plan, unsigned blocks, bool cooperative) {
    cudaLaunchConfig_t config = staged_config(plan, blocks);
    cudaLaunchAttribute attr = cooperative_attribute();
    config.attrs = &attr;
    config.numAttrs = cooperative ? 1 : 0;
    FG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, plan.rows.tpr, plan.stages));
}

// Launches a staged kernel, kernel(p, tpr, stages), for rows split over clusters of plan.split
// blocks; returns the number of clusters: as many as fit on the device at once, at most
// `max_clusters` (each one a unit of the persistent grid). `cooperative`: as launch_staged.
template <auto kernel, typename Params>
unsigned launch_split(const Params& p, const StagedPlan& plan, long long max_clusters,
                      bool cooperative = false) {
    cudaLaunchConfig_t config = staged_config(plan, (unsigned)plan.split);  // one cluster, to ask
    cudaLaunchAttribute attrs[2] = {{}, cooperative_attribute()};
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = (unsigned)plan.split;
    attrs[0].val.clusterDim.y = attrs[0].val.clusterDim.z = 1;
    config.attrs = attrs;
    config.numAttrs = 1;  // the occupancy query: the cluster alone
    // The occupancy query costs more than the launch: remembered (per kernel) for the last
    // threads, shared memory and split it was asked for.
    static std::size_t known_smem = 0;
    static int known_threads = 0, known_split = 0, known_clusters = 0;
    if (known_smem != plan.smem || known_threads != plan.rows.threads ||
        known_split != plan.split) {
        FG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&known_clusters, kernel, &config));
        known_smem = plan.smem;
        known_threads = plan.rows.threads;
        known_split = plan.split;
    }
    if (known_clusters < 1)
        throw CudaError("[norm] no cluster of " + std::to_string(plan.split) + " blocks with " +
                        std::to_string(plan.smem) +
                        " bytes of shared memory each fits on this device (set "
                        "NormTuning::split_blocks = 1 to use the unsplit kernels)");
    const unsigned clusters = (unsigned)std::min<long long>(known_clusters, max_clusters);
    config.gridDim = dim3(clusters * (unsigned)plan.split);
    config.numAttrs = cooperative ? 2 : 1;
    FG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, plan.rows.tpr, plan.stages));
    return clusters;
}

inline bool aligned_to(const void* p, int bytes) {
    return p == nullptr || (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}

inline int elem_bytes(ScalarType t) { return t == ScalarType::f32 ? 4 : 2; }

}  // namespace fg::kernels::norm_detail
