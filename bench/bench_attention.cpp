// bench/bench_attention.cpp: the fused causal attention op against the same math written with
// fusegrad's plain ops (matmul, scale, causal softmax, dropout, matmul), in one run on the GPU.
//   forward:           out = causal_attention(qkv, p), no graph recorded
//   forward+backward:  the same with autograd, then out.backward(g)
//   memory:            peak bytes the forward keeps for the backward plus the backward's
//                      scratch, beyond the inputs (allocator peak during forward+backward)
// Shapes (B, H, T, D): the baby GPT's (64, 6, 256, 64), a GPT-2-small-like (16, 12, 1024, 64),
// and T = 2048, where the row kernels loop instead of holding rows in registers. Dropout 0 and
// 0.2. TFLOP/s counts the two (T, T) GEMMs of the forward at full size (4 B H T^2 D), and three
// times that for forward+backward; TF32 matmuls, as in training.
// Then bf16, at the baby GPT's and GPT-2's shapes: cuDNN's fused flash attention
// (AttentionBackend::cudnn, kernels/attention_cudnn.h) against fusegrad's fused kernels in bf16,
// when this build and GPU have cuDNN. bench/attention_torch.py times PyTorch's flash attention
// on the same cases and prints its rows in this table's format (with --fusegrad, the ratio to
// the cudnn rows of this run's JSON).
// Usage: bench_attention [--json PATH]
#include <cmath>
#include <cstring>

#include "bench_common.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"

using namespace fg;
using bench::Row;

namespace {

struct Shape5 {
    std::int64_t b, h, t, d;
};

// The unfused definition, op by op (what CausalSelfAttention did before the fused op).
Tensor attention_from_plain_ops(const Tensor& qkv, double p) {
    const std::int64_t b = qkv.size(1), h = qkv.size(2), t = qkv.size(3), d = qkv.size(4);
    auto part = [&](std::int64_t i) { return qkv.slice(i, i + 1).reshape({b, h, t, d}); };
    const MatmulOptions tf32{true};
    Tensor scores =
        scale(matmul(part(0), part(1), false, true, tf32), 1.0 / std::sqrt(double(d)));
    return matmul(dropout(softmax(scores, true), p, true), part(2), false, false, tf32);
}

std::string shape_name(const Shape5& s, double p) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld p=%.1f", (long long)s.b,
                  (long long)s.h, (long long)s.t, (long long)s.d, p);
    return shape;
}

// Forward (no graph), forward+backward and the allocator's peak of `fn` on qkv and g.
struct Timing {
    double fwd_ms, both_ms, peak_mib;
};
template <typename Fn>
Timing time_attention(bench::Timer& timer, const Tensor& qkv, const Tensor& g, double p, Fn fn) {
    Timing r{};
    r.fwd_ms = timer.median_ms([&] {
        NoGradGuard no_grad;
        fn(qkv, p);
    });
    Tensor leaf = qkv.detach().set_requires_grad(true);
    r.both_ms = timer.median_ms([&] {
        leaf.zero_grad();
        fn(leaf, p).backward(g);
    });
    leaf.zero_grad();
    // The allocator's counters move when the host allocates, so no synchronisation is needed.
    const std::size_t before = memory_stats(Device::cuda).bytes_in_use;
    reset_peak_memory(Device::cuda);
    fn(leaf, p).backward(g);
    r.peak_mib = (memory_stats(Device::cuda).peak_bytes_in_use - before) / 1048576.0;
    leaf.zero_grad();
    return r;
}

std::vector<Row> bench_shape(bench::Timer& timer, const Shape5& s, double p) {
    const std::string shape = shape_name(s, p);
    const double fwd_flop = 4.0 * s.b * s.h * s.t * s.t * s.d;
    Tensor qkv = randn({3, s.b, s.h, s.t, s.d}, Device::cuda);
    Tensor g = randn({s.b, s.h, s.t, s.d}, Device::cuda);
    using Fn = Tensor (*)(const Tensor&, double);
    const std::pair<const char*, Fn> variants[] = {
        {"fused", [](const Tensor& x, double q) {
             return causal_attention(x, q, true, {AttentionBackend::fused, true});
         }},
        {"plain ops", attention_from_plain_ops},
    };
    std::vector<Row> rows;
    double fused_ms[2] = {0, 0};
    for (const auto& [name, fn] : variants) {
        const bool fused = std::strcmp(name, "fused") == 0;
        const Timing t = time_attention(timer, qkv, g, p, fn);
        const double fwd = t.fwd_ms, both = t.both_ms, peak_mib = t.peak_mib;
        if (fused) {
            fused_ms[0] = fwd;
            fused_ms[1] = both;
        }
        const double r_fwd = fused ? 0.0 : fused_ms[0] / fwd, r_both = fused ? 0.0 : fused_ms[1] / both;
        rows.push_back({"attention fwd", name, shape, fwd, fwd_flop / (fwd * 1e9), "TF/s", r_fwd,
                        "fused/plain time"});
        rows.push_back({"attention f+b", name, shape, both, 3 * fwd_flop / (both * 1e9), "TF/s",
                        r_both, "fused/plain time"});
        rows.push_back({"attention mem", name, shape, 0.0, peak_mib, "MiB", 0.0, ""});
    }
    return rows;
}

// bf16: cuDNN's fused attention against fusegrad's fused kernels, each forward, forward+backward
// and memory; the cudnn rows' ratio is their time over the fused kernels' in bf16.
std::vector<Row> bench_cudnn_shape(bench::Timer& timer, const Shape5& s, double p) {
    const std::string shape = shape_name(s, p);
    const double fwd_flop = 4.0 * s.b * s.h * s.t * s.t * s.d;
    Tensor qkv = randn({3, s.b, s.h, s.t, s.d}, Device::cuda).to(DType::bf16);
    Tensor g = randn({s.b, s.h, s.t, s.d}, Device::cuda).to(DType::bf16);
    auto with = [](AttentionBackend backend) {
        return [backend](const Tensor& x, double q) {
            return causal_attention(x, q, true, {backend});
        };
    };
    const Timing fused = time_attention(timer, qkv, g, p, with(AttentionBackend::fused));
    const Timing cudnn = time_attention(timer, qkv, g, p, with(AttentionBackend::cudnn));
    std::vector<Row> rows;
    for (const auto& [name, t] : {std::pair<const char*, Timing>{"fused bf16", fused},
                                  std::pair<const char*, Timing>{"cudnn bf16", cudnn}}) {
        const bool is_cudnn = std::strcmp(name, "cudnn bf16") == 0;
        rows.push_back({"attention fwd", name, shape, t.fwd_ms, fwd_flop / (t.fwd_ms * 1e9), "TF/s",
                        is_cudnn ? t.fwd_ms / fused.fwd_ms : 0.0, "cudnn/fused time"});
        rows.push_back({"attention f+b", name, shape, t.both_ms, 3 * fwd_flop / (t.both_ms * 1e9),
                        "TF/s", is_cudnn ? t.both_ms / fused.both_ms : 0.0, "cudnn/fused time"});
        rows.push_back({"attention mem", name, shape, 0.0, t.peak_mib, "MiB", 0.0, ""});
    }
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    std::string json = "bench_attention.json";
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
    try {
        const kernels::DeviceInfo& dev = kernels::device_info();
        std::printf("bench_attention on %s (%d SMs)\n", dev.name.c_str(), dev.sm_count);
        bench::Timer timer;
        std::vector<Row> rows;
        for (Shape5 s : {Shape5{64, 6, 256, 64}, Shape5{16, 12, 1024, 64}, Shape5{4, 16, 2048, 64}})
            for (double p : {0.0, 0.2}) {
                std::vector<Row> part = bench_shape(timer, s, p);
                rows.insert(rows.end(), part.begin(), part.end());
            }
        const std::string why = cudnn_attention_unsupported({Device::cuda, DType::bf16, 64});
        if (!why.empty()) std::printf("no cuDNN rows: %s\n", why.c_str());
        for (Shape5 s : {Shape5{64, 6, 256, 64}, Shape5{16, 12, 1024, 64}})
            for (double p : {0.0, 0.2}) {
                if (!why.empty()) break;
                std::vector<Row> part = bench_cudnn_shape(timer, s, p);
                rows.insert(rows.end(), part.begin(), part.end());
            }
        bench::print_table(rows);
        bench::write_json(json, dev.name, 0.0, rows);
        std::printf("\nwrote %s\n", json.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
