// tests/test_norm_plan.cpp: the plan tier of the norm kernels (kernels/norm/plan.h) on the CPU:
// the kernel each measured rule picks at the shapes of docs/norms.md on an H100-like device, the
// tuning's overrides, and, over a sweep of shapes, types, options and tunings, that no plan asks
// a kernel for more than it is built for (values a thread, threads a block, shared memory,
// cluster sizes, second-pass batches) or sizes a workspace too small for its partial rows; and
// the plan in words (cli/norm_plan.h) against the plans themselves.
#include "catch.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cli/norm_plan.h"
#include "kernels/norm/plan.h"

using namespace fg::kernels;
using namespace fg::kernels::norm_plan;

namespace {

NormDevice h100() {
    NormDevice d;
    d.sm_count = 132;
    d.l2_bytes = 50 << 20;
    d.max_threads_per_sm = 2048;
    d.smem_per_block_optin = 227 << 10;
    d.smem_per_sm = 228 << 10;
    d.cooperative_launch = true;
    d.staging = true;
    return d;
}

NormCall call(NormKind kind, int elem_bytes, long long rows, long long cols) {
    NormCall c;
    c.kind = kind;
    c.elem_bytes = elem_bytes;
    c.weight_bytes = 4;
    c.rows = rows;
    c.cols = cols;
    c.vector_ok = cols * elem_bytes % 16 == 0;
    c.weight = true;
    c.bias = kind == NormKind::layer;
    c.partials = true;
    return c;
}

bool pow2(long long v) { return v > 0 && (v & (v - 1)) == 0; }

// What every forward plan must respect, whatever the call and tuning.
void check_forward(const NormCall& c, const NormDevice& d, const ForwardPlan& p) {
    const int vec = c.vector_ok ? 16 / c.elem_bytes : 1;
    REQUIRE(p.vec == vec);
    switch (p.kernel) {
        case ForwardKernel::registers:
            REQUIRE_FALSE(p.rows.looped);
            REQUIRE(pow2(p.rows.tpr));
            REQUIRE(p.rows.threads <= 1024);
            REQUIRE(p.rows.items * p.vec <= kForwardElems);
            REQUIRE(p.rows.tpr * p.rows.items * p.vec >= c.cols);  // the row is held whole
            if (p.fixed_row) {
                REQUIRE(p.vec > 1);
                REQUIRE(p.rows.tpr <= 128);
                REQUIRE(p.fixed_items >= 1);
                REQUIRE(p.fixed_items <= 4);
                REQUIRE(p.rows.tpr * p.fixed_items * p.vec >= c.cols);
            }
            break;
        case ForwardKernel::looped:
            REQUIRE(pow2(p.loop_threads));
            REQUIRE(p.loop_threads >= 32);
            REQUIRE(p.loop_threads <= 1024);
            REQUIRE(pow2(p.loop_vectors));
            REQUIRE(p.loop_vectors <= 8);
            REQUIRE(p.loop_batch >= 1);
            REQUIRE(p.loop_batch <= max_loop_batch(p.loop_vectors));
            if (p.vec == 1) REQUIRE(p.loop_vectors == 4);
            break;
        case ForwardKernel::staged: {
            REQUIRE(c.vector_ok);
            REQUIRE(d.staging);
            const StagedPlan& s = p.staged;
            REQUIRE(s.stages >= 2);
            REQUIRE(s.stages <= kMaxStages);
            REQUIRE((s.split == 1 || s.split == 2 || s.split == 4 || s.split == 8));
            REQUIRE(c.cols % (s.split * vec) == 0);
            REQUIRE(s.smem <= static_cast<std::size_t>(d.smem_per_block_optin));
            REQUIRE(s.rows.items <= 4);
            REQUIRE(s.rows.items * vec <= kStagedForwardElems);
            REQUIRE(s.rows.threads <= 512);
            if (s.split > 1) REQUIRE(s.rows.rows_per_block() == 1);
            break;
        }
    }
}

void check_backward(const NormCall& c, const NormDevice& d, const BackwardPlan& p) {
    const int vec = c.vector_ok ? 16 / c.elem_bytes : 1;
    REQUIRE(p.reduction != NormReduction::automatic);
    REQUIRE(p.partial_rows >= 1);
    REQUIRE(p.layout.threads <= 1024);
    if (p.staged.stages > 0) {
        REQUIRE(p.reduction == NormReduction::grid);
        REQUIRE(c.vector_ok);
        REQUIRE(p.staged.rows.items * vec <= kStagedElems);
        REQUIRE(p.staged.rows.items <= 4);
        REQUIRE(p.smem <= static_cast<std::size_t>(d.smem_per_block_optin));
        REQUIRE(c.cols % (p.staged.split * vec) == 0);
    } else if (!p.layout.looped) {
        REQUIRE(p.layout.items * p.layout.vec <= kBackwardElems);
        REQUIRE(p.layout.tpr * p.layout.items * p.layout.vec >= c.cols);
    }
    if (p.reduction == NormReduction::locked) {
        REQUIRE(p.partial_rows <= std::max(1LL, p.blocks));
        // The launch's G, for any grid occupancy leaves it, fits the plan's workspace.
        for (long long b : {1LL, (p.blocks + 1) / 2, p.blocks})
            REQUIRE(locked_partial_rows(b, p.lock_rows) <= p.partial_rows);
    }
    if (p.grid_sums) REQUIRE(p.staged.stages > 0);
    const std::size_t ws = backward_workspace_bytes(p, c.cols);
    if (c.partials)
        REQUIRE(ws >= 2 * sizeof(float) * static_cast<std::size_t>(p.partial_rows) * c.cols +
                          2 * sizeof(int) * static_cast<std::size_t>(p.partial_rows));
    else
        REQUIRE(ws == 0);
}

}  // namespace

TEST_CASE("norm plans: the measured rules pick their kernels at docs/norms.md's shapes",
          "[norm_plan]") {
    const NormDevice d = h100();
    const NormTuning t;
    // Short rows: held in registers, on the kernels built for their threads a row (F6, F9).
    ForwardPlan p = plan_forward(call(NormKind::rms, 4, 16384, 384), d, t);
    CHECK(p.kernel == ForwardKernel::registers);
    CHECK(p.fixed_row);
    CHECK(p.rows.tpr == 64);  // 96 vectors, two a thread aimed at
    CHECK(p.fixed_items == 2);
    CHECK(p.prefetch_waves == 0);  // F7: f32 rows this short are not prefetched
    CHECK(p.usual_affine);
    p = plan_forward(call(NormKind::layer, 2, 32768, 1024), d, t);  // 128 vectors: two each (F6)
    CHECK(p.kernel == ForwardKernel::registers);
    CHECK(p.rows.tpr == 64);
    CHECK(p.prefetch_waves == 1);  // F7: 2-byte rows are
    p = plan_forward(call(NormKind::layer, 2, 16384, 1536), d, t);  // 192 vectors: three each
    CHECK(p.rows.tpr == 64);
    CHECK(p.fixed_items == 3);
    // GPT-2's norms in a block: 96 vectors of a 2-byte row, 32 threads of three (F6), but with the
    // residual fused one vector a thread, 128 threads; f32 rows with a residual keep the aim of
    // two (192 vectors: 128 threads, not 256).
    NormCall block = call(NormKind::layer, 2, 65536, 768);
    CHECK(plan_forward(block, d, t).rows.tpr == 32);
    block.residual = true;
    p = plan_forward(block, d, t);
    CHECK(p.kernel == ForwardKernel::registers);
    CHECK(p.rows.tpr == 128);
    CHECK(p.fixed_items == 1);
    block.kind = NormKind::rms;
    CHECK(plan_forward(block, d, t).rows.tpr == 128);
    block.elem_bytes = 4;
    CHECK(plan_forward(block, d, t).rows.tpr == 128);  // 192 vectors, two a thread
    // Rows of 1024 to 6144 vectors: looped, steps of up to 1024 x 4 (F5, F8).
    p = plan_forward(call(NormKind::rms, 4, 4096, 8192), d, t);
    CHECK(p.kernel == ForwardKernel::looped);
    CHECK(p.loop_threads == 512);
    CHECK(p.loop_vectors == 4);
    CHECK(p.loop_batch == 2);
    p = plan_forward(call(NormKind::layer, 2, 4096, 8192), d, t);  // 16-bit LayerNorm: batch 1
    CHECK(p.kernel == ForwardKernel::looped);
    CHECK(p.loop_batch == 1);
    // f32 RMSNorm of 32768: over the L2 share on this device, so looped in steps of 1024 x 8 (F4).
    p = plan_forward(call(NormKind::rms, 4, 1024, 32768), d, t);
    CHECK(p.kernel == ForwardKernel::looped);
    CHECK(p.loop_threads == 1024);
    CHECK(p.loop_vectors == 8);
    CHECK(p.loop_batch == 4);
    // ... on a device with twice the L2 it is staged instead (F1), split over a cluster (F2).
    NormDevice big_l2 = d;
    big_l2.l2_bytes = 100 << 20;
    p = plan_forward(call(NormKind::rms, 4, 1024, 32768), big_l2, t);
    CHECK(p.kernel == ForwardKernel::staged);
    CHECK(p.staged.split == 4);  // 8192 vectors in slices of at most 2048
    CHECK(p.staged.stages == 2);  // F3
    // Without staging (before Hopper), rows too long for registers are looped.
    NormDevice ampere = d;
    ampere.staging = false;
    p = plan_forward(call(NormKind::rms, 4, 256, 65536), ampere, t);
    CHECK(p.kernel == ForwardKernel::looped);
    // A misaligned row: scalar loads, run-time threads a row.
    NormCall odd = call(NormKind::rms, 4, 37, 1001);
    p = plan_forward(odd, d, t);
    CHECK(p.kernel == ForwardKernel::registers);
    CHECK(p.vec == 1);
    CHECK_FALSE(p.fixed_row);

    // The backward: grid by default (B1), staged on Hopper; one vector a thread for short rows
    // without staging (B2); the locked strategy's G (B5).
    NormCall b = call(NormKind::layer, 2, 32768, 1024);
    b.reduction = NormReduction::automatic;
    BackwardPlan bp = plan_backward(b, d, t);
    CHECK(bp.reduction == NormReduction::grid);
    CHECK(bp.staged.stages == 2);  // B4
    CHECK(bp.staged.rows.threads == 256);  // B4: 16-bit rows of <= 512 vectors
    CHECK(bp.grid_sums);  // B7
    CHECK(bp.plain_weight);  // B8
    bp = plan_backward(b, ampere, t);
    CHECK(bp.staged.stages == 0);
    CHECK(bp.layout.items == 1);  // B2: 128 vectors, one each
    CHECK(bp.prefetch == 0);  // B6: one vector a thread: no prefetch
    NormCall bl = call(NormKind::rms, 4, 8192, 4096);
    bl.reduction = NormReduction::locked;
    bp = plan_backward(bl, d, t);
    CHECK(bp.reduction == NormReduction::locked);
    CHECK(bp.blocks == 132 * 1024 / bp.layout.threads);  // B5: half the grid the GPU holds
    CHECK(bp.partial_rows == (bp.blocks + 1) / 2);       // B5: two blocks a partial row
    // The launch asks the same rule for the grid occupancy lets it run.
    CHECK(locked_partial_rows(bp.blocks, NormTuning::kAuto) == bp.partial_rows);
    CHECK(locked_partial_rows(264, NormTuning::kAuto) == 132);
    CHECK(locked_partial_rows(7, NormTuning::kAuto) == 4);
    CHECK(locked_partial_rows(264, 33) == 33);
    CHECK(locked_partial_rows(20, 33) == 20);  // at most one partial row a block
    CHECK(locked_partial_rows(20, 0) == 1);
    CHECK(bp.staged.stages == 0);  // the locked strategy is never staged
    CHECK(bp.prefetch == 1);  // B6: several vectors a thread
    NormCall split = call(NormKind::layer, 4, 1024, 32768);
    bp = plan_backward(split, d, t);
    CHECK(bp.staged.split == 8);  // B3: 8192 vectors in slices of at most 1024
}

TEST_CASE("norm plans: the tuning overrides the rules", "[norm_plan]") {
    const NormDevice d = h100();
    NormTuning loop_all;
    loop_all.forward_loop_cols = 1;
    loop_all.forward_loop_threads = 256;
    loop_all.forward_loop_vectors = 2;
    loop_all.forward_loop_batch = 1;
    ForwardPlan p = plan_forward(call(NormKind::rms, 4, 10, 384), d, loop_all);
    CHECK(p.kernel == ForwardKernel::looped);
    CHECK(p.loop_threads == 256);
    CHECK(p.loop_vectors == 2);
    CHECK(p.loop_batch == 1);
    NormTuning stage_all;
    stage_all.forward_stage_cols = 1;
    stage_all.forward_loop_cols = NormTuning::kNever;
    p = plan_forward(call(NormKind::layer, 2, 10, 8192), d, stage_all);
    CHECK(p.kernel == ForwardKernel::staged);
    NormTuning split4 = stage_all;
    split4.split_blocks = 4;
    p = plan_forward(call(NormKind::layer, 2, 10, 8192), d, split4);
    CHECK(p.kernel == ForwardKernel::staged);
    CHECK(p.staged.split == 4);
    NormTuning registers_only;
    registers_only.stage_bytes = 0;
    p = plan_forward(call(NormKind::rms, 4, 256, 65536), d, registers_only);
    CHECK(p.kernel != ForwardKernel::staged);
    CHECK(plan_backward(call(NormKind::rms, 4, 256, 65536), d, registers_only).staged.stages == 0);
    NormTuning run_time;
    run_time.usual_affine = 0;
    run_time.forward_fixed_rows = 0;
    run_time.grid_column_sums = 0;
    run_time.prefetch_distance = 3;
    p = plan_forward(call(NormKind::rms, 2, 16384, 384), d, run_time);
    CHECK_FALSE(p.usual_affine);
    CHECK_FALSE(p.fixed_row);
    CHECK(p.prefetch_waves == 3);
    BackwardPlan bp = plan_backward(call(NormKind::layer, 2, 32768, 1024), d, run_time);
    CHECK_FALSE(bp.grid_sums);
    CHECK_FALSE(bp.plain_weight);
    CHECK(bp.prefetch == 3);
    NormTuning four = {};
    four.forward_row_vectors = 4;
    CHECK(plan_forward(call(NormKind::rms, 4, 16384, 384), d, four).rows.tpr == 32);
}

TEST_CASE("norm plans never ask a kernel for more than it is built for", "[norm_plan]") {
    std::vector<NormTuning> tunings(5);
    tunings[1].forward_loop_cols = 1;
    tunings[1].forward_loop_vectors = 8;
    tunings[1].forward_loop_batch = 8;
    tunings[2].forward_stage_cols = 1;
    tunings[2].forward_loop_cols = NormTuning::kNever;
    tunings[2].split_blocks = 4;
    tunings[2].stages = 4;
    tunings[2].stage_bytes = 8 * 1024;
    tunings[3].forward_elems = 4;
    tunings[3].backward_elems = 4;
    tunings[3].grid_threads_per_sm = 256;
    tunings[4].forward_row_vectors = 8;
    tunings[4].split_blocks = 1;
    NormDevice ampere = h100();
    ampere.staging = false;
    ampere.sm_count = 108;
    ampere.l2_bytes = 40 << 20;
    ampere.smem_per_block_optin = 163 << 10;
    ampere.smem_per_sm = 164 << 10;
    int plans = 0;
    for (const NormDevice& d : {h100(), ampere})
        for (const NormTuning& t : tunings)
            for (NormKind kind : {NormKind::rms, NormKind::layer})
                for (int eb : {4, 2})
                    for (long long cols : {1LL, 7LL, 64LL, 384LL, 1000LL, 1024LL, 1536LL, 4096LL,
                                           4097LL, 8192LL, 16384LL, 24576LL, 32768LL, 65536LL,
                                           131072LL})
                        for (long long rows : {1LL, 37LL, 4096LL})
                            for (int opts = 0; opts < 4; ++opts) {
                                NormCall c = call(kind, eb, rows, cols);
                                c.residual = c.dh = (opts & 1) != 0;
                                c.vector_ok = c.vector_ok && (opts & 2) == 0;
                                c.reduction = opts == 3 ? NormReduction::locked
                                                        : NormReduction::automatic;
                                INFO("kind " << static_cast<int>(kind) << " bytes " << eb << " "
                                             << rows << " x " << cols << " options " << opts);
                                check_forward(c, d, plan_forward(c, d, t));
                                check_backward(c, d, plan_backward(c, d, t));
                                ++plans;
                            }
    CHECK(plans == 2 * 5 * 2 * 2 * 15 * 3 * 4);
}

TEST_CASE("norm plans in words name the planned kernels, their shape and their rules",
          "[norm_plan]") {
    const NormDevice d = norm_device_named("h100");
    CHECK(d.sm_count == h100().sm_count);
    CHECK(d.staging);
    CHECK_FALSE(norm_device_named("a100").staging);
    CHECK_THROWS_WITH(norm_device_named("v100"),
                      ContainsSubstring("no device called 'v100' (known: h100, h200, a100)"));
    const NormTuning t;
    auto layout = [](const RowLayout& l) {
        return std::to_string(l.tpr) + " threads a row x " + std::to_string(l.items);
    };
    // GPT-2 small's width in bf16: the register forward built for its shape; the staged grid
    // backward adding its own partial rows.
    NormCall gpt2 = call(NormKind::layer, 2, 16384, 768);
    gpt2.reduction = NormReduction::automatic;
    ForwardPlan f = plan_forward(gpt2, d, t);
    BackwardPlan b = plan_backward(gpt2, d, t);
    std::string text = explain_plan(gpt2, d, t);
    INFO(text);
    REQUIRE(f.kernel == ForwardKernel::registers);
    CHECK_THAT(text, ContainsSubstring("kernel: registers (norm_forward_kernel)"));
    REQUIRE(f.fixed_row);
    RowLayout held = f.rows;
    held.items = f.fixed_items;  // 96 vectors on 32 threads: 3 each, not the power of two
    CHECK_THAT(text, ContainsSubstring("layout: " + layout(held) + " vectors"));
    CHECK_THAT(text, ContainsSubstring("built for the shape: yes, " + std::to_string(f.rows.tpr) +
                              " threads x " + std::to_string(f.fixed_items) + " vectors  [F9]"));
    CHECK_THAT(text, ContainsSubstring("dw / db strategy: grid (asked: auto)  [B1]"));
    REQUIRE(b.staged.stages == 2);
    CHECK_THAT(text, ContainsSubstring("kernel: staged (norm_backward_staged_kernel)  [B3 B4]"));
    CHECK_THAT(text, ContainsSubstring("column sums: by the staged grid itself"));
    CHECK_THAT(text, ContainsSubstring("workspace: " + std::to_string(backward_workspace_bytes(b, 768)) +
                              " bytes"));
    // Without staging (an A100): the register backward, short rows one vector a thread (B2).
    const NormDevice a100 = norm_device_named("a100");
    b = plan_backward(gpt2, a100, t);
    text = explain_plan(gpt2, a100, t);
    CHECK_THAT(text, ContainsSubstring("kernel: registers (norm_backward_kernel)"));
    CHECK_THAT(text, ContainsSubstring("layout: " + layout(b.layout) + " vector"));
    CHECK_THAT(text, ContainsSubstring("[B2]"));
    // The locked strategy: G = half the blocks, two to a lock (B5).
    NormCall locked = call(NormKind::rms, 4, 8192, 4096);
    locked.reduction = NormReduction::locked;
    b = plan_backward(locked, d, t);
    text = explain_plan(locked, d, t);
    CHECK_THAT(text, ContainsSubstring("dw / db strategy: locked (asked)"));
    CHECK_THAT(text, ContainsSubstring("partial rows: " + std::to_string(b.partial_rows) +
                              " at most, shared under locks, by two blocks each  [B5]"));
    CHECK_THAT(text, ContainsSubstring("grid: " + std::to_string(b.blocks) +
                              " blocks at most (occupancy decides)"));
    // Long f32 rows over the L2 share: looped forward (F4, F5), split staged backward (B3).
    NormCall long_rows = call(NormKind::rms, 4, 1024, 32768);
    f = plan_forward(long_rows, d, t);
    b = plan_backward(long_rows, d, t);
    text = explain_plan(long_rows, d, t);
    REQUIRE(f.kernel == ForwardKernel::looped);
    CHECK_THAT(text, ContainsSubstring("kernel: looped (norm_forward_looped_kernel)"));
    CHECK_THAT(text, ContainsSubstring(std::to_string(f.loop_threads) + " threads x " +
                              std::to_string(f.loop_vectors) + " vectors"));
    REQUIRE(b.staged.split > 1);
    CHECK_THAT(text, ContainsSubstring("split over a cluster of " + std::to_string(b.staged.split)));
    // No dw / db asked for: no workspace line.
    NormCall no_grads = gpt2;
    no_grads.partials = false;
    CHECK_THAT(explain_plan(no_grads, d, t), ContainsSubstring("dw / db: not asked for"));
}
