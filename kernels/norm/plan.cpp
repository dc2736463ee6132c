// kernels/norm/plan.cpp: see plan.h. Rule ids (F1, B2, ...) are the rows of docs/norms.md's
// "Tuning rules" table, where the measurements behind each choice are.
#include "plan.h"

#include <algorithm>

namespace fg::kernels {

const char* norm_reduction_name(NormReduction r) {
    switch (r) {
        case NormReduction::locked:
            return "locked";
        case NormReduction::grid:
            return "grid";
        default:
            return "auto";
    }
}

}  // namespace fg::kernels

namespace fg::kernels::norm_plan {

long long pow2_ceil(long long v) {
    long long p = 1;
    while (p < v) p *= 2;
    return p;
}

long long pow2_floor(long long v) {
    long long p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}

std::size_t round256(std::size_t b) { return (b + 255) / 256 * 256; }

RowLayout row_layout(long long cols, int elem_bytes, bool vector_ok, int max_elems, int wide_bytes,
                     int wide_items, int target_items) {
    RowLayout l;
    l.vec = vector_ok ? 16 / elem_bytes : 1;
    long long nvec = (cols + l.vec - 1) / l.vec;
    int max_items = max_elems / l.vec < 1 ? 1 : max_elems / l.vec;
    if (max_items > 8) max_items = 8;
    auto pow2_items = [&](int tpr) {
        long long items = (nvec + tpr - 1) / tpr;
        int it = 1;
        while (it < items) it *= 2;
        return it;
    };
    // Aim for about target_items vectors a thread (enough loads in flight, few idle lanes), then
    // widen the row to more threads while a thread would hold more than its register budget.
    auto too_long = [&](int tpr) { return (nvec + tpr - 1) / tpr > max_items; };
    long long want = (nvec + target_items - 1) / target_items;
    int tpr = 4;
    while (tpr < want && tpr < 512) tpr *= 2;
    while (too_long(tpr) && tpr < 512) tpr *= 2;
    const int wide = pow2_items(1024);  // 1024 threads, when 512 are too few and the share fits
    if (too_long(tpr) && !too_long(1024) && wide <= wide_items &&
        wide * l.vec * elem_bytes <= wide_bytes)
        tpr = 1024;
    if (too_long(tpr)) {  // too long for registers: stream it
        l.looped = true;
        l.tpr = l.threads = 512;
        l.items = 1;
        return l;
    }
    l.items = pow2_items(tpr);
    l.tpr = tpr;
    l.threads = tpr >= 128 ? tpr : 128;
    return l;
}

// Needs 16-byte vectors. Blocks of up to `max_threads` threads (a power of two, at most 512); a
// stage aims at `stage_target` bytes (whole rows), two to `max_stages` stages must fit in
// `smem_budget`, and a thread holds at most max_elems columns in at most 4 vectors (more spill).
StagedLayout staged_layout(long long cols, int elem_bytes, int streams, int max_elems,
                           std::size_t stage_target, std::size_t smem_budget, int max_threads,
                           int max_stages) {
    StagedLayout s;
    const int vec = 16 / elem_bytes;
    const long long nvec = cols / vec;
    const int max_items = std::max(1, std::min(4, max_elems / vec));
    int tpr = 4;  // the fewest threads that can hold the row...
    while (tpr < max_threads && (nvec + tpr - 1) / tpr > max_items) tpr *= 2;
    if ((nvec + tpr - 1) / tpr > max_items) return s;
    // ... then more, while the stage could not hold enough rows to fill the block.
    const std::size_t row_bytes = (std::size_t)cols * elem_bytes * streams;
    long long rows_fit = 1;
    while ((std::size_t)(rows_fit * 2) * row_bytes <= stage_target) rows_fit *= 2;
    long long wide = std::max<long long>(tpr, max_threads / rows_fit);
    tpr = (int)std::min<long long>(std::max<long long>(tpr, std::min(wide, pow2_ceil(nvec))),
                                   max_threads);
    const int rpb = (int)std::min<long long>(max_threads / tpr, rows_fit);
    s.rows.vec = vec;
    s.rows.tpr = tpr;
    s.rows.threads = tpr * rpb;
    s.rows.items = (int)pow2_ceil((nvec + tpr - 1) / tpr);
    s.stage_bytes = (std::size_t)rpb * row_bytes;
    s.stages = (int)std::min<std::size_t>(max_stages, smem_budget / s.stage_bytes);
    if (s.stages < 2) s.stages = 0;
    return s;
}

// The plan takes the first candidate that divides the row and fits; none: the row is staged
// whole, or not at all. kAuto: a row a block stages well whole (`whole_ok`) is not split; longer
// rows go in the fewest slices of at most `slice_vectors` vectors, then (`finer`) in more, then in
// fewer. A tuning's split_blocks p >= 2: p, 2p, ..., kMaxSplit, for any row; 1: never.
SplitOrder split_candidates(long long nvec, bool whole_ok, int split_blocks,
                            long long slice_vectors, bool finer) {
    SplitOrder order;
    if (split_blocks == 1) return order;
    if (split_blocks != NormTuning::kAuto) {
        for (int p = std::max(2, split_blocks); p <= kMaxSplit; p *= 2) order.add(p);
        return order;
    }
    if (whole_ok || nvec <= slice_vectors) return order;
    int first = 2;
    while (first < kMaxSplit && nvec > first * slice_vectors) first *= 2;
    for (int p = first; p <= (finer ? kMaxSplit : first); p *= 2) order.add(p);
    for (int p = first / 2; p >= 2; p /= 2) order.add(p);
    return order;
}

// A row is staged whole when a block can hold it with at most `whole_elems` columns a thread;
// otherwise it is split over a cluster (one slice of one row a stage); otherwise not staged.
StagedPlan plan_staged(long long cols, int elem_bytes, int streams, const StagedRules& rules,
                       const NormDevice& device, const NormTuning& tuning) {
    StagedPlan plan;
    if (tuning.stage_bytes <= 0) return plan;
    const int vec = 16 / elem_bytes;
    // The opt-in limit less a KiB for the kernels' static shared memory.
    const std::size_t budget = (std::size_t)device.smem_per_block_optin - 1024;
    const int max_stages = tuning.stages == NormTuning::kAuto
                               ? rules.max_stages
                               : std::max(2, std::min(kMaxStages, tuning.stages));
    // Shared memory the kernel keeps besides its stages, for a layout and a slice of the row.
    auto extra = [&](const StagedLayout& l, long long slice_cols) -> std::size_t {
        return rules.output_streams * l.stage_bytes / streams +
               (std::size_t)rules.affine_tensors * slice_cols * rules.weight_bytes;
    };
    auto layout_for = [&](long long c) {
        const bool whole = c == cols;
        const std::size_t target =
            whole ? (std::size_t)tuning.stage_bytes : (std::size_t)c * elem_bytes * streams;
        StagedLayout l =
            staged_layout(c, elem_bytes, streams, rules.max_elems, target, budget,
                          whole ? rules.whole_threads : rules.split_threads, max_stages);
        if (l.stages > 0) {  // room for the kernel's other buffers too
            const std::size_t more = extra(l, c);
            const std::size_t left = budget > more ? budget - more : 0;
            l.stages = (int)std::min<std::size_t>(l.stages, left / l.stage_bytes);
            if (l.stages < 2) l.stages = 0;
        }
        return l;
    };
    StagedLayout sl = layout_for(cols);
    const bool whole_ok = sl.stages > 0 && sl.rows.items * vec <= rules.whole_elems;
    for (int parts : split_candidates(cols / vec, whole_ok, tuning.split_blocks,
                                      rules.slice_vectors, rules.finer)) {
        if (cols % ((long long)parts * vec) != 0) continue;  // 16-byte slices
        StagedLayout slice = layout_for(cols / parts);
        if (slice.stages > 0 && slice.rows.rows_per_block() == 1) {
            sl = slice;
            plan.split = parts;
            break;
        }
    }
    if (sl.stages > 0) {
        plan.rows = sl.rows;
        plan.stages = sl.stages;
        plan.smem = sl.stages * sl.stage_bytes + extra(sl, cols / plan.split);
    }
    return plan;
}

// ---- the forward ----------------------------------------------------------------------------
namespace {

// F7: row groups prefetched this many waves ahead: one for register rows of 2-byte values or of
// at least 16384 values, none for the looped kernel or other register rows.
int forward_prefetch(bool looped, int elem_bytes, long long cols, const NormTuning& t) {
    if (t.prefetch_distance != NormTuning::kAuto) return t.prefetch_distance;
    return !looped && (elem_bytes == 2 || cols >= 16384) ? 1 : 0;
}

// F4: whether the rows two looped blocks an SM have in flight would take more than the L2 share.
bool rows_over_l2_share(long long cols, int elem_bytes, const NormDevice& d) {
    const double two_blocks_an_sm = 2.0 * d.sm_count * (double)cols * elem_bytes;
    return two_blocks_an_sm > kNormRules.looped_l2_share * d.l2_bytes;
}

// F5: the rows the looped kernel takes by default (NormTuning::forward_loop_cols = kAuto): rows
// of 16-byte vectors from forward_loop_vectors vectors; with a residual up to the residual limit;
// else up to forward_loop_step_vectors, and up to forward_loop_max_vectors for LayerNorm and for
// RMSNorm rows over the L2 share. Shorter rows keep the register kernel; longer ones are staged,
// or looped when they cannot be held.
bool loop_by_default(long long cols, int vec, bool layer, bool residual, bool over_l2) {
    const long long nvec = cols / vec;
    if (vec == 1 || nvec < kNormRules.forward_loop_vectors) return false;
    if (residual) return nvec <= kNormRules.forward_loop_max_vectors_residual;
    if (nvec <= kNormRules.forward_loop_step_vectors) return true;
    return nvec <= kNormRules.forward_loop_max_vectors && (layer || over_l2);
}

// F4, F8: the looped block. A step covers the row where 1024 threads of 4 vectors can (nvec / 4
// threads, at least 32, of 4 vectors); longer rows go in steps of 1024 threads of up to 8
// vectors, but rows looped by default in steps of 1024 x 4 (two blocks an SM) unless over the L2
// share (then 1024 x 8, one block an SM). Pass two loads two vectors at once, one for LayerNorm
// of 2-byte values and for scalar rows.
void looped_shape(ForwardPlan& p, long long cols, bool layer, int elem_bytes, bool by_default,
                  bool over_l2, const NormTuning& t) {
    const long long nvec = (cols + p.vec - 1) / p.vec;
    const int most_vectors = by_default && !over_l2 ? 4 : 8;
    p.loop_threads = (int)std::min<long long>(1024, std::max<long long>(32, pow2_floor(nvec / 4)));
    p.loop_vectors = (int)std::min<long long>(
        most_vectors, std::max<long long>(1, pow2_floor(nvec / p.loop_threads)));
    if (t.forward_loop_threads != NormTuning::kAuto)
        p.loop_threads = std::min(1024, std::max(32, (int)pow2_ceil(t.forward_loop_threads)));
    if (t.forward_loop_vectors != NormTuning::kAuto)
        p.loop_vectors = std::min(8, std::max(1, (int)pow2_ceil(t.forward_loop_vectors)));
    if (p.vec == 1) p.loop_vectors = 4;  // scalar rows: one kernel, four values a step
    const int unroll = p.loop_vectors;
    int batch = unroll > 4 ? 4 : (layer && elem_bytes == 2) || p.vec == 1 ? 1 : 2;
    if (t.forward_loop_batch != NormTuning::kAuto)
        batch = (int)pow2_ceil(std::min(8, std::max(1, t.forward_loop_batch)));
    p.loop_batch = std::min(batch, max_loop_batch(unroll));  // only these are built
}

// F6: the vectors a register-forward thread aims to hold: two, but four for LayerNorm of 2-byte
// values (except rows of exactly 128 or 256 vectors) and for rows without 16-byte vectors; one
// for 2-byte rows with a residual (four streams: more threads, each with fewer loads in flight).
int row_vectors(bool layer, int elem_bytes, bool vector_ok, bool residual, long long cols,
                const NormTuning& t) {
    if (t.forward_row_vectors != NormTuning::kAuto) return std::max(1, t.forward_row_vectors);
    if (!vector_ok) return 4;
    if (residual && elem_bytes == 2) return 1;
    if (!layer || elem_bytes != 2) return 2;
    const long long nvec = cols * elem_bytes / 16;
    const bool pow2 = (nvec & (nvec - 1)) == 0;
    return pow2 && nvec >= kNormRules.layer_two_vectors_min &&
                   nvec <= kNormRules.layer_two_vectors_max
               ? 2
               : 4;
}

}  // namespace

ForwardPlan plan_forward(const NormCall& c, const NormDevice& d, const NormTuning& t) {
    ForwardPlan p;
    const bool layer = c.kind == NormKind::layer;
    // F10: the usual modules' weight and bias (a weight, not zero-centred, a bias exactly for
    // LayerNorm) take a path built for them.
    p.usual_affine = t.usual_affine && c.weight && !c.zero_centered && c.bias == layer;
    const int vec = 16 / c.elem_bytes;
    const bool over_l2 = rows_over_l2_share(c.cols, c.elem_bytes, d);
    const bool loop_default =
        loop_by_default(c.cols, c.vector_ok ? vec : 1, layer, c.residual, over_l2);
    auto looped = [&] {
        p.kernel = ForwardKernel::looped;
        p.vec = c.vector_ok ? vec : 1;
        looped_shape(p, c.cols, layer, c.elem_bytes, loop_default, over_l2, t);
        p.prefetch_waves = forward_prefetch(true, c.elem_bytes, c.cols, t);
        return p;
    };
    if (t.forward_loop_cols == NormTuning::kAuto ? loop_default : c.cols >= t.forward_loop_cols)
        return looped();
    // F1, F2, F3: long rows staged in shared memory where the device can.
    const long long stage_from = t.forward_stage_cols == NormTuning::kAuto
                                     ? kNormRules.forward_stage_cols
                                     : t.forward_stage_cols;
    if (c.vector_ok && c.cols >= stage_from && d.staging) {
        StagedRules rules;
        rules.max_elems = std::min(kStagedForwardElems, t.forward_elems);
        rules.whole_elems = kStagedForwardElems;
        rules.slice_vectors = kNormRules.forward_slice_vectors;
        rules.max_stages = kNormRules.forward_stages;
        rules.output_streams = 2;  // two buffers of y
        rules.affine_tensors = (c.weight ? 1 : 0) + (c.bias ? 1 : 0);
        rules.weight_bytes = c.weight_bytes;
        p.staged = plan_staged(c.cols, c.elem_bytes, c.residual ? 2 : 1, rules, d, t);
        if (p.staged.stages > 0) {
            p.kernel = ForwardKernel::staged;
            p.vec = vec;
            return p;
        }
    }
    // Registers. A thread holding at most 64 bytes of the row fits in 64 registers, so
    // 1024-thread blocks work; f32 weights of a 16-bit row count at their size.
    const int bytes_per_elem = std::max(c.elem_bytes, c.weight_bytes);
    p.rows = row_layout(c.cols, c.elem_bytes, c.vector_ok, std::min(kForwardElems, t.forward_elems),
                        64 * c.elem_bytes / bytes_per_elem, 8,
                        row_vectors(layer, c.elem_bytes, c.vector_ok, c.residual, c.cols, t));
    if (p.rows.looped) return looped();
    p.kernel = ForwardKernel::registers;
    p.vec = p.rows.vec;
    p.prefetch_waves = forward_prefetch(false, c.elem_bytes, c.cols, t);
    // F9: rows of 16-byte vectors on at most 128 threads of at most 4 vectors take the kernel
    // built for their threads a row and exactly the vectors the row needs.
    p.fixed_items = (int)((c.cols / p.vec + p.rows.tpr - 1) / p.rows.tpr);
    p.fixed_row = p.vec > 1 && p.rows.tpr <= 128 && p.fixed_items <= 4 && t.forward_fixed_rows;
    return p;
}

// ---- the backward ---------------------------------------------------------------------------
namespace {

// B3, B4: blocks and stages of the staged backward for rows of `nvec` vectors.
StagedRules backward_staged_rules(int max_elems, int elem_bytes, long long nvec) {
    StagedRules r;
    r.max_elems = max_elems;
    r.whole_elems = kHeldElems;
    r.slice_vectors = kNormRules.backward_slice_vectors;
    r.finer = true;
    r.whole_threads = 512;
    r.split_threads = kNormRules.backward_split_threads;
    r.max_stages = kNormRules.backward_stages;
    if (elem_bytes == 2 && nvec <= kNormRules.backward_half_block_vectors) {
        r.whole_threads = 256;
        r.max_elems = std::min(max_elems, kHeldElems);
    }
    return r;
}

}  // namespace

BackwardPlan plan_backward(const NormCall& c, const NormDevice& d, const NormTuning& t) {
    BackwardPlan plan;
    const int eb = c.elem_bytes, vec = 16 / eb;
    plan.vector_ok = c.vector_ok;
    // B1: the grid strategy wherever `automatic` is asked (it wins at every measured shape).
    plan.reduction = c.reduction == NormReduction::automatic ? NormReduction::grid : c.reduction;
    plan.grid_threads_per_sm = t.grid_threads_per_sm;
    // B2: short rows go fastest at one vector a thread.
    int elems = t.backward_elems;
    if (elems == NormTuning::kAuto) {
        long long nvec = plan.vector_ok ? c.cols / vec : c.cols;
        bool short_row = nvec <= kNormRules.backward_short_row_vectors;
        elems = short_row ? (plan.vector_ok ? vec : 1) : kBackwardElems;
    }
    plan.layout = row_layout(c.cols, eb, plan.vector_ok, std::min(kBackwardElems, elems), 16, 1);
    plan.partials = c.partials;
    if (plan.reduction == NormReduction::grid && plan.vector_ok && d.staging) {
        const int staged_elems = t.backward_elems == NormTuning::kAuto
                                     ? kStagedElems
                                     : std::min(kStagedElems, t.backward_elems);
        plan.staged = plan_staged(c.cols, eb, c.dh ? 3 : 2,
                                  backward_staged_rules(staged_elems, eb, c.cols / vec), d, t);
        if (plan.staged.stages > 0) {
            plan.layout = plan.staged.rows;
            plan.smem = plan.staged.smem;
        }
    }
    const RowLayout& l = plan.layout;
    long long groups = l.looped ? c.rows : (c.rows + l.rows_per_block() - 1) / l.rows_per_block();
    // Both strategies stride a grid of blocks over the row groups, each block summing its rows'
    // dw / db in registers. Grid: the launch sizes P from occupancy; the workspace is sized for
    // the most it can be (split rows: P counts clusters, each one partial row).
    int threads_per_sm = std::min(t.grid_threads_per_sm, d.max_threads_per_sm);
    // B5: locked, half the threads an SM: fewer blocks finishing together, shorter lock queues
    // (the launch also keeps to the blocks that fit at once: backward.cu's launch_backward).
    if (plan.reduction == NormReduction::locked) threads_per_sm = std::max(1, threads_per_sm / 2);
    long long per_sm = std::max(1, threads_per_sm / l.threads);
    // Staged blocks are held back by shared memory first: an upper bound that ignores static
    // and reserved shared memory, so never below what the launch's occupancy query finds.
    if (plan.smem > 0)
        per_sm = std::min<long long>(per_sm,
                                     std::max<long long>(1, d.smem_per_sm / (long long)plan.smem));
    plan.blocks = std::max(1LL, std::min<long long>(groups, per_sm * d.sm_count / plan.staged.split));
    plan.lock_rows = t.lock_rows;
    plan.partial_rows = plan.reduction == NormReduction::locked
                            ? locked_partial_rows(plan.blocks, t.lock_rows) : (int)plan.blocks;
    if (plan.staged.stages == 0 && !l.looped && l.rows_per_block() > 1 && plan.partials)
        plan.smem = sizeof(float) * (std::size_t)l.rows_per_block() * (std::size_t)c.cols;
    // B7: the staged grid adds its own partial rows (cooperative launch; its stages hold the
    // float4 a thread it needs).
    plan.grid_sums = plan.partials && plan.staged.stages > 0 && t.grid_column_sums != 0 &&
                     d.cooperative_launch && plan.smem >= 16 * (std::size_t)l.threads;
    // B6: one iteration ahead for the register kernel with several vectors a thread.
    plan.prefetch = t.prefetch_distance != NormTuning::kAuto ? t.prefetch_distance
                    : l.looped || l.items == 1                ? 0
                                                              : 1;
    // B8: the usual module's weight (present, not zero-centred) as a constant, staged kernel.
    plan.plain_weight = t.usual_affine && c.weight && !c.zero_centered;
    return plan;
}

// B5: two blocks share each of the G partial rows (the blocks finish together, so every lock's
// queue is as deep as the blocks sharing it; one row an SM queued 8-16 deep).
int locked_partial_rows(long long blocks, int lock_rows) {
    return (int)std::min<long long>(
        blocks, lock_rows == NormTuning::kAuto ? (blocks + 1) / 2 : std::max(1, lock_rows));
}

std::size_t backward_workspace_bytes(const BackwardPlan& plan, long long cols) {
    if (!plan.partials) return 0;
    return 2 * round256(sizeof(float) * (std::size_t)plan.partial_rows * cols) +
           round256(2 * sizeof(int) * plan.partial_rows);
}

}  // namespace fg::kernels::norm_plan
