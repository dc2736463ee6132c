// kernels/norm/plan.h: the plan tier of the tuned norm kernels. Given one call (its shape, types,
// which operands it has and whether 16-byte vectors are possible), the device's properties and a
// tuning, the plan says which kernel runs and how the rows are laid over threads, blocks, shared
// memory stages and clusters. Host-only C++ with no CUDA header, so the CPU tests reach it
// (tests/test_norm_plan.cpp); the launchers in forward.cu and backward.cu only carry a plan out.
//
// The tuning (kernels/norm.h's NormTuning) is an argument, never a global: the defaults are the
// measured best, and a benchmark or test passes another one for one call. Every measured
// threshold is a row of NormRules below, and each row names the table of docs/norms.md
// ("Tuning rules", rows F1-F10 and B1-B8) whose measurement chose it.
#pragma once

#include <cstddef>

#include "kernels/norm.h"

namespace fg::kernels::norm_plan {

// What the kernels are instantiated for: the plans never ask for more.
constexpr int kForwardElems = 32;        // values of x a register-forward thread holds
constexpr int kStagedForwardElems = 32;  // columns a staged forward thread holds (<= 4 vectors)
constexpr int kBackwardElems = 16;       // values a register-backward thread holds (x, dy, 2 sums)
constexpr int kStagedElems = 32;         // columns a staged backward thread sums over
constexpr int kHeldElems = 16;           // staged backward: x_hat and g kept between its passes
constexpr int kMaxStages = 4;            // row groups a staged block has in shared memory
constexpr int kMaxSplit = 8;             // blocks a row may be split over (portable cluster)
// The most vectors a looped forward thread loads at once in its second pass, for `unroll`
// vectors a step: at two blocks an SM (unroll <= 4, 32 registers a thread) 2, at one block an
// SM (unroll 8, 64 registers) 4; more would spill.
constexpr int max_loop_batch(int unroll) { return unroll > 4 ? 4 : unroll < 2 ? unroll : 2; }

// The measured rules, one row each: the value, what it decides, and its row in docs/norms.md's
// "Tuning rules" table.
struct NormRules {
    long long forward_stage_cols = 16384;  // F1 staged forward from rows of this many values
    long long forward_slice_vectors = 2048;  // F2 split staged forward rows in slices <= this
    int forward_stages = 2;                // F3 row groups in flight, staged forward
    double looped_l2_share = 0.6;          // F4 looped rows in flight may take this share of L2
    long long forward_loop_vectors = 1024;  // F5 looped by default from this many vectors ...
    long long forward_loop_step_vectors = 6144;  // F5 ... to this (LayerNorm and RMSNorm) ...
    long long forward_loop_max_vectors = 8192;   // F5 ... to this (LayerNorm, RMSNorm over F4)
    long long forward_loop_max_vectors_residual = 4096;  // F5 ... to this with a residual
    long long layer_two_vectors_min = 128;  // F6 16-bit LayerNorm rows of 128 or 256 vectors
    long long layer_two_vectors_max = 256;  // F6 ... take two vectors a thread (others four)
    long long backward_short_row_vectors = 256;  // B2 grid: rows this short, one vector a thread
    long long backward_slice_vectors = 1024;  // B3 split staged backward rows in slices <= this
    int backward_stages = 2;                  // B4 row groups in flight, staged backward
    int backward_split_threads = 256;         // B4 threads of a block staging a row's slice
    long long backward_half_block_vectors = 512;  // B4 16-bit rows this short: 256 threads
};
inline constexpr NormRules kNormRules{};

// What a plan needs to know of the device (the launchers fill it from kernels/runtime.h).
struct NormDevice {
    int sm_count = 132;
    int l2_bytes = 50 << 20;
    int max_threads_per_sm = 2048;
    int smem_per_block_optin = 227 << 10;
    int smem_per_sm = 228 << 10;
    bool cooperative_launch = true;
    bool staging = true;  // Hopper or later, and the staged kernels built for it
};

// What a plan needs to know of a call (no pointers: `vector_ok` says whether every operand is
// 16-byte aligned and the row a whole number of 16-byte vectors).
struct NormCall {
    NormKind kind = NormKind::rms;
    int elem_bytes = 4;    // x, dy, ...: 4 (f32) or 2 (bf16, f16)
    int weight_bytes = 4;  // w, b, dw, db
    long long rows = 0, cols = 0;
    bool vector_ok = false;
    bool weight = false, bias = false, zero_centered = false;
    bool residual = false;  // forward: h = x + residual
    bool dh = false;        // backward: a gradient added into dx
    bool partials = false;  // backward: dw or db wanted
    NormReduction reduction = NormReduction::grid;  // backward
};

// How a row of `cols` elements is laid over threads: `tpr` threads a row, each holding `items`
// vectors of `vec` elements (vector i of lane `lane` covers columns (i * tpr + lane) * vec ..),
// rows_per_block() rows a block; `looped`: too long to hold, streamed through one block.
struct RowLayout {
    int vec = 1;
    int items = 1;
    int tpr = 32;
    int threads = 32;
    bool looped = false;
    int rows_per_block() const { return threads / tpr; }
};

// max_elems: values a thread may hold (its register budget). Rows take at most 512 threads; 1024
// when 512 cannot hold the row and a thread's share then fits `wide_items` vectors and
// `wide_bytes` bytes. target_items: the vectors a thread aims to hold when the budget allows.
RowLayout row_layout(long long cols, int elem_bytes, bool vector_ok, int max_elems, int wide_bytes,
                     int wide_items, int target_items = 4);

// Rows staged in shared memory: `stages` buffers of stage_bytes each (0 stages: does not fit).
struct StagedLayout {
    RowLayout rows;
    int stages = 0;
    std::size_t stage_bytes = 0;
};
StagedLayout staged_layout(long long cols, int elem_bytes, int streams, int max_elems,
                           std::size_t stage_target, std::size_t smem_budget, int max_threads,
                           int max_stages);

// Blocks to split a staged row of `nvec` vectors over, in order of preference (see plan.cpp).
struct SplitOrder {
    int parts[3] = {};  // at most 2, 4 and 8
    int count = 0;
    void add(int p) { parts[count++] = p; }
    const int* begin() const { return parts; }
    const int* end() const { return parts + count; }
};
SplitOrder split_candidates(long long nvec, bool whole_ok, int split_blocks,
                            long long slice_vectors, bool finer);

// A staged launch: the rows' layout over a block, how many stages (0: not staged), how many
// blocks of a cluster share each row (1: none), and the dynamic shared memory of a block.
struct StagedPlan {
    RowLayout rows;
    int stages = 0;
    int split = 1;
    std::size_t smem = 0;
};

// What a staged kernel asks of plan_staged.
struct StagedRules {
    int max_elems = 32;              // columns a thread sums or holds
    int whole_elems = 32;            // a row staged whole: at most this many columns a thread
    long long slice_vectors = 1024;  // split rows: slices of at most this many vectors
    bool finer = false;              // split_candidates: try finer splits after the first
    int whole_threads = 512;         // block threads when rows are staged whole
    int split_threads = 512;         // ... when a block stages a slice of a split row
    int max_stages = kMaxStages;     // NormTuning::stages, when set, overrides
    // Shared memory besides the stages: output buffers of this many streams' worth of a stage
    // (the forward's two y buffers), and `affine_tensors` slices of the weight and bias.
    int output_streams = 0;
    int affine_tensors = 0;
    int weight_bytes = 4;
};
StagedPlan plan_staged(long long cols, int elem_bytes, int streams, const StagedRules& rules,
                       const NormDevice& device, const NormTuning& tuning);

long long pow2_ceil(long long v);
long long pow2_floor(long long v);  // 1 for v < 1

// ---- the forward ----------------------------------------------------------------------------
enum class ForwardKernel { registers, looped, staged };

struct ForwardPlan {
    ForwardKernel kernel = ForwardKernel::registers;
    int vec = 1;                // elements of a vector (16 bytes), or 1: scalar loads
    RowLayout rows;             // registers: the layout
    bool fixed_row = false;     // registers: the kernel built for rows.tpr threads a row...
    int fixed_items = 0;        // ... of exactly this many vectors
    int loop_threads = 0;       // looped: block threads,
    int loop_vectors = 0;       // vectors a thread has in flight per step,
    int loop_batch = 0;         // and of those, loaded at once in the second pass
    StagedPlan staged;          // staged
    int prefetch_waves = 0;     // registers, looped: row groups this many waves ahead into L2
    bool usual_affine = false;  // the call is the usual modules' affine case (its own path)
};
ForwardPlan plan_forward(const NormCall& call, const NormDevice& device, const NormTuning& tuning);

// ---- the backward ---------------------------------------------------------------------------
struct BackwardPlan {
    RowLayout layout;
    bool vector_ok = false;
    NormReduction reduction = NormReduction::grid;
    long long blocks = 0;    // grid size of the main kernel, at most (occupancy decides)
    int partial_rows = 0;    // R: the most G (locked) or P (grid) can be; the launch may use fewer
    std::size_t smem = 0;    // dynamic shared memory of the main kernel
    bool partials = false;   // dw or db wanted
    StagedPlan staged;       // stages > 0: the staged kernel (grid only); split > 1: clusters
    bool grid_sums = false;  // the staged grid adds its partial rows (no column kernel)
    int prefetch = 0;        // register and looped kernels: row groups this many iterations ahead
    bool plain_weight = false;  // staged: a weight, not zero-centred (its own path)
    int grid_threads_per_sm = 2048;  // the persistent grid's cap (the tuning's)
    int lock_rows = NormTuning::kAuto;  // locked: the tuning's G (locked_partial_rows)
};
BackwardPlan plan_backward(const NormCall& call, const NormDevice& device,
                           const NormTuning& tuning);
// B5: strategy (a)'s G for a grid of `blocks`: two blocks a partial row, or the tuning's
// `lock_rows`, at most one a block. The plan sizes the workspace for its own grid; the launch,
// which may run fewer blocks (occupancy), asks again for the grid it runs.
int locked_partial_rows(long long blocks, int lock_rows);
// Bytes of workspace the plan's partial rows and locks take (0 without dw and db).
std::size_t backward_workspace_bytes(const BackwardPlan& plan, long long cols);
std::size_t round256(std::size_t bytes);

}  // namespace fg::kernels::norm_plan
