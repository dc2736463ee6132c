// cli/norm_plan.cpp: the plan of one norm call in words (norm_plan.h): which kernel runs
// each way, how its rows are laid over threads, blocks, stages and clusters, the dw / db strategy
// and its workspace, each line with the ids of the rules behind it (docs/norms.md's "Tuning
// rules"). Host code only, so it runs on a machine without a GPU (`fusegrad norm-plan`).
#include "norm_plan.h"

#include <sstream>
#include <stdexcept>

namespace fg::kernels::norm_plan {
namespace {

std::string layout_words(const RowLayout& l) {
    std::ostringstream o;
    o << l.tpr << " threads a row x " << l.items << (l.items == 1 ? " vector" : " vectors")
      << " of " << l.vec << (l.vec == 1 ? " value" : " values") << ", " << l.rows_per_block()
      << (l.rows_per_block() == 1 ? " row" : " rows") << " a block of " << l.threads
      << " threads";
    return o.str();
}

std::string staged_words(const StagedPlan& s) {
    std::ostringstream o;
    o << s.stages << " stages, " << s.smem << " bytes of shared memory a block";
    if (s.split > 1) o << ", each row split over a cluster of " << s.split << " blocks";
    return o.str();
}

// One line: what, the choice, and the rule ids behind it.
void line(std::ostringstream& o, const char* what, const std::string& choice, const char* rules) {
    o << "  " << what << ": " << choice;
    if (rules && *rules) o << "  [" << rules << "]";
    o << "\n";
}

}  // namespace

NormDevice norm_device_named(const std::string& name) {
    NormDevice d;  // the defaults are an H100 SXM's
    if (name == "h100" || name == "h200") return d;  // the same SMs, L2 and shared memory
    if (name == "a100") {
        d.sm_count = 108;
        d.l2_bytes = 40 << 20;
        d.smem_per_block_optin = 163 << 10;
        d.smem_per_sm = 164 << 10;
        d.staging = false;  // bulk copies and clusters are Hopper's
        return d;
    }
    throw std::invalid_argument("no device called '" + name + "' (known: h100, h200, a100)");
}

std::string explain_plan(const NormCall& c, const NormDevice& d, const NormTuning& t) {
    std::ostringstream o;
    const ForwardPlan f = plan_forward(c, d, t);
    o << "forward:\n";
    switch (f.kernel) {
        case ForwardKernel::registers: {
            line(o, "kernel", "registers (norm_forward_kernel): the row held in registers",
                 "F1 F5");
            RowLayout shown = f.rows;  // a kernel built for the shape holds what the row needs
            if (f.fixed_row) shown.items = f.fixed_items;
            line(o, "layout", layout_words(shown), "F6");
            line(o, "built for the shape",
                 f.fixed_row ? "yes, " + std::to_string(f.rows.tpr) + " threads x " +
                                   std::to_string(f.fixed_items) + " vectors"
                             : std::string("no, threads a row read at run time"),
                 "F9");
            break;
        }
        case ForwardKernel::looped:
            line(o, "kernel", "looped (norm_forward_looped_kernel): a block a row, read twice",
                 "F4 F5");
            line(o, "block",
                 std::to_string(f.loop_threads) + " threads x " + std::to_string(f.loop_vectors) +
                     " vectors of " + std::to_string(f.vec) + " values a step, " +
                     std::to_string(f.loop_batch) + " loaded at once in the second pass",
                 "F4 F8");
            break;
        case ForwardKernel::staged:
            line(o, "kernel", "staged (norm_forward_staged_kernel): row groups copied into "
                              "shared memory ahead of use", "F1");
            line(o, "layout", layout_words(f.staged.rows), "");
            line(o, "stages", staged_words(f.staged), "F2 F3");
            break;
    }
    if (f.kernel != ForwardKernel::staged)
        line(o, "prefetch into L2",
             f.prefetch_waves ? std::to_string(f.prefetch_waves) + " wave(s) ahead" : "none",
             "F7");
    line(o, "weight and bias", f.usual_affine ? "the usual modules' case, as constants"
                                              : "read at run time", "F10");

    const BackwardPlan b = plan_backward(c, d, t);
    o << "backward:\n";
    const bool locked = b.reduction == NormReduction::locked;
    line(o, "dw / db strategy",
         std::string(norm_reduction_name(b.reduction)) +
             (c.reduction == NormReduction::automatic ? " (asked: auto)" : " (asked)"),
         "B1");
    if (b.staged.stages > 0) {
        line(o, "kernel", "staged (norm_backward_staged_kernel)", "B3 B4");
        line(o, "layout", layout_words(b.layout), "B4");
        line(o, "stages", staged_words(b.staged), "B3 B4");
        line(o, "weight", b.plain_weight ? "the usual module's, as a constant" : "read at run time",
             "B8");
    } else if (b.layout.looped) {
        line(o, "kernel", "looped (norm_backward_looped_kernel): a block a row", "");
        line(o, "block", std::to_string(b.layout.threads) + " threads", "");
    } else {
        line(o, "kernel", "registers (norm_backward_kernel)", "");
        line(o, "layout", layout_words(b.layout), "B2");
    }
    if (b.staged.stages == 0)
        line(o, "prefetch into L2",
             b.prefetch ? std::to_string(b.prefetch) + " iteration(s) ahead" : "none", "B6");
    if (!b.partials) {
        line(o, "dw / db", "not asked for", "");
    } else {
        line(o, "grid", std::to_string(b.blocks) + " blocks at most (occupancy decides) striding"
                        " over the row groups", locked ? "B5" : "");
        line(o, "partial rows",
             locked ? std::to_string(b.partial_rows) + " at most, shared under locks" +
                          (t.lock_rows == NormTuning::kAuto ? std::string(", by two blocks each")
                                                            : std::string(" (NormTuning::lock_rows)"))
                    : std::to_string(b.partial_rows) + " at most, one a block" +
                          (b.staged.split > 1 ? std::string(" (a cluster)") : std::string()),
             locked ? "B5" : "");
        line(o, "column sums",
             b.grid_sums ? "by the staged grid itself, after a grid-wide barrier"
                         : "by the column kernel (norm_partials_sum_kernel)",
             "B7");
        line(o, "workspace", std::to_string(backward_workspace_bytes(b, c.cols)) + " bytes", "");
    }
    return o.str();
}

}  // namespace fg::kernels::norm_plan
