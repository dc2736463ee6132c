// kernels/norm.h: fused RMSNorm / LayerNorm, forward and backward, for rows of N values.
//
// Forward, per row x (N values; with a fused residual, x is first replaced by h = x + r, and h is
// written out). Statistics and all accumulation in fp32:
//   RMSNorm:    rstd = 1 / sqrt(mean(x^2) + eps),                  x_hat = x * rstd
//   LayerNorm:  mu = mean(x), rstd = 1 / sqrt(mean((x - mu)^2) + eps), x_hat = (x - mu) * rstd
//   y = x_hat * w' + b,   w' = w, or 1 + w when the weight is zero-centred; w and b optional.
// Backward, with g = w' * dy (g = dy without a weight):
//   c1 = mean(x_hat * g);  c2 = mean(g) for LayerNorm, 0 for RMSNorm
//   dx = (g - x_hat * c1 - c2) * rstd  (+ dh, the gradient reaching h from its other uses)
//   dw = sum over rows of dy * x_hat;  db = sum over rows of dy
// dw and db are sums across rows: the reduction strategies below do that part.
//
// Types: x, r, h, y, dy, dh, dx in f32, bf16 or f16 (all the same); w, b, dw, db in f32 or that
// same type; mean and rstd are fp32 (rows values each). Pointers may be 16-byte unaligned (the
// kernels then fall back to scalar loads). No host synchronisation anywhere: workspaces are
// reset in-stream, so the launches can be captured in a CUDA graph.
//
// The implementation is in kernels/norm/: plan.h / plan.cpp decide how a call is launched (rules
// F1-F10 and B1-B8, measured in docs/norms.md's "Tuning rules" table), forward.cu and backward.cu
// hold the tuned kernels that carry a plan out, and reference.h the plain versions to read first.
#pragma once

#include <climits>
#include <cstddef>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

enum class NormKind : int { rms = 0, layer = 1 };

// How dw / db are summed across rows (see docs/norms.md).
enum class NormReduction : int {
    automatic = 0,  // pick per shape: rule B1 (kernels/norm/plan.cpp)
    locked = 1,     // (a) a persistent grid whose blocks add into G lock-guarded fp32 partial
                    //     rows, then a column reduction
    grid = 2,       // (b) a persistent grid, one fp32 partial row per block, then a column
                    //     reduction (on Hopper, by the staged grid itself); deterministic
};
const char* norm_reduction_name(NormReduction r);

// Tuning knobs, for benchmarks and tests that sweep them (bench_norm --sweep). A tuning is an
// argument of one call; the defaults, and kAuto, leave each choice to its rule in
// kernels/norm/plan.cpp (the rule ids are the rows of docs/norms.md's "Tuning rules").
struct NormTuning {
    // The persistent grid of the backward gets as many blocks per SM as fit at once, but at
    // most this many threads per SM (strategy (a): half that many, rule B5).
    int grid_threads_per_sm = 2048;
    // Strategy (a)'s G: the partial rows its blocks share under locks (1 to the blocks). kAuto:
    // rule B5 (kernels/norm/plan.cpp).
    int lock_rows = kAuto;
    int forward_elems = 32;  // elements of x a forward thread holds in registers
    // ... a backward thread (it also holds dy and two sums per element). kAuto: rule B2 for the
    // register kernels, rule B4 for staged rows (kernels/norm/plan.cpp); staged rows never take
    // more than the staged kernel is built for (norm_plan::kStagedElems, at most 4 vectors).
    int backward_elems = kAuto;
    // Rows prefetched into L2 ahead of use (0: none). Backward (b): the row group a persistent
    // block handles this many iterations later. Forward: the group this many waves of blocks on.
    // kAuto: rule F7 for the forward, rule B6 for the backward (kernels/norm/plan.cpp).
    int prefetch_distance = kAuto;
    // Hopper and later: backward (b) and the forward stage row groups of about this many bytes in
    // shared memory with bulk copies, where two groups fit (plan_staged in kernels/norm/plan.cpp,
    // the staging in kernels/norm/common.cuh); 0: never, use the register kernels.
    int stage_bytes = 32 * 1024;
    // Row groups a staged block has in shared memory at once, the one it works on included (2 to
    // 4). kAuto: rule F3 for the forward, rule B4 for the backward (kernels/norm/plan.cpp).
    int stages = kAuto;
    // The forward stages rows of at least this many values (shorter rows: the register kernel).
    // kAuto: rule F1 (kernels/norm/plan.cpp).
    int forward_stage_cols = kAuto;
    // The forward streams rows of at least this many values through the looped kernel (the row
    // read twice, the second time from L2) instead of holding them in registers or staging them.
    // kAuto: rule F5 (kernels/norm/plan.cpp). Rows too long for registers that are not staged
    // are looped whatever this says.
    int forward_loop_cols = kAuto;
    // Threads of a looped forward block (a power of two, 32 to 1024), and the 16-byte vectors
    // each of them has in flight per step (1, 2, 4 or 8). kAuto: rules F4 and F8
    // (kernels/norm/plan.cpp).
    int forward_loop_threads = kAuto;
    int forward_loop_vectors = kAuto;
    // Of those vectors, how many a looped thread loads at once in its second pass, before it
    // stores any y: 1 or 2 (4 at 8 vectors a step; larger asks are cut to that, the most that is
    // built). kAuto: rule F8 (kernels/norm/plan.cpp).
    int forward_loop_batch = kAuto;
    // Vectors a forward thread aims to hold when the row is held in registers (more: fewer
    // threads a row, more work each). kAuto: rule F6 (kernels/norm/plan.cpp).
    int forward_row_vectors = kAuto;
    // 1: rows of 16-byte vectors held by at most 128 threads, at most 4 vectors each, take
    // register kernels built for their threads a row and vectors a thread (compile-time
    // constants); 0: the kernel that reads the threads a row at run time, holding a power of two
    // of vectors. Rule F9 (kernels/norm/plan.cpp).
    int forward_fixed_rows = 1;
    // 1: the register and looped forwards take a path built for the usual modules' affine case
    // (a weight, not zero-centred, a bias for LayerNorm and none for RMSNorm) when the call is
    // that case, and the staged backward one for a weight that is not zero-centred; 0: every call
    // reads weight, bias and zero-centring at run time. Rules F10 and B8 (kernels/norm/plan.cpp).
    int usual_affine = 1;
    // 1: the staged backward of strategy (b) also adds the partial rows up: its persistent grid,
    // launched cooperatively, waits for every block's partial row (a grid-wide barrier) and then
    // each block sums a slice of the columns; 0: the column kernel does it after the grid, as
    // for the other kernels. Rule B7 (kernels/norm/plan.cpp; grid_column_sums in
    // kernels/norm/backward.cu).
    int grid_column_sums = 1;
    // Staged rows may be split over a cluster of 2, 4 or 8 blocks (one SM each), every block
    // staging its slice of the row; the row sums meet in distributed shared memory. kAuto: rows
    // a block cannot stage well whole are split, by rule F2 in the forward and rule B3 in the
    // backward (kernels/norm/plan.cpp, split_candidates); 1: never (rows too long for two stages
    // then go to the register or looped kernels); 2, 4, 8: that many blocks (or more, where the
    // slices would not fit), for every staged row.
    int split_blocks = kAuto;
    static constexpr int kAuto = -1;
    // forward_stage_cols / forward_loop_cols: no row by that rule (rows too long for registers
    // that cannot be staged are still looped).
    static constexpr int kNever = INT_MAX;
};

struct NormForwardArgs {
    NormKind kind = NormKind::rms;
    ScalarType x_type = ScalarType::f32;
    ScalarType w_type = ScalarType::f32;
    long long rows = 0, cols = 0;
    float eps = 1e-5f;
    bool zero_centered = false;
    const void* x = nullptr;
    const void* residual = nullptr;  // optional: normalise h = x + residual
    void* h_out = nullptr;           // required with residual: receives h
    const void* weight = nullptr;    // optional (no weight: w' = 1)
    const void* bias = nullptr;      // optional
    void* y = nullptr;
    float* mean = nullptr;  // LayerNorm statistics; both may be null when no backward follows
    float* rstd = nullptr;
    const NormTuning* tuning = nullptr;  // null: the defaults (NormTuning{})
};
// The longest row the forward takes (its columns are 32-bit offsets within a row): 2^30 values,
// 4 GiB of f32. Longer rows throw.
constexpr long long kNormMaxCols = 1LL << 30;
void norm_forward(const NormForwardArgs& a);

struct NormBackwardArgs {
    NormKind kind = NormKind::rms;
    ScalarType x_type = ScalarType::f32;
    ScalarType w_type = ScalarType::f32;
    long long rows = 0, cols = 0;
    bool zero_centered = false;
    NormReduction reduction = NormReduction::grid;
    const void* x = nullptr;  // the normalised input (h when the residual add was fused)
    const void* dy = nullptr;
    const void* dh = nullptr;      // optional: added into dx
    const void* weight = nullptr;  // optional
    const float* mean = nullptr;   // LayerNorm
    const float* rstd = nullptr;
    void* dx = nullptr;
    void* dweight = nullptr;  // optional (needs weight)
    void* dbias = nullptr;    // optional
    void* workspace = nullptr;
    const NormTuning* tuning = nullptr;  // null: the defaults (NormTuning{})
};

// Bytes of workspace norm_backward needs (0 when neither dweight nor dbias is asked for).
std::size_t norm_backward_workspace_bytes(const NormBackwardArgs& a);
void norm_backward(const NormBackwardArgs& a);

}  // namespace fg::kernels
