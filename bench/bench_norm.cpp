// bench/bench_norm.cpp: the fused norm kernels on the shapes of docs/norms.md, beside the copy
// bandwidth of the same run and beside the same math built from fusegrad's unfused ops.
//   fwd        fused forward as training runs it: y and the statistics the backward needs
//   bwd grid   fused backward, strategy (b): dx, dw (and db) through persistent-grid partials
//   bwd locked fused backward, strategy (a): lock-guarded partial rows
//   fwd inference  fused forward without the statistics (what a forward under no_grad needs)
//   unfused    the same math from fusegrad ops (f32 ops; bf16 inputs cast in and out), forward,
//              and backward through autograd
// Bytes counted (docs/norms.md): forward 2 M N s, backward 3 M N s, s the element size; weights,
// statistics and partial rows are overhead the kernel has to hide. LayerNorm has weight and bias,
// RMSNorm a weight; weights (and dw, db) f32, or with --weights input in the input's dtype (as
// PyTorch's modules keep them).
// Usage: bench_norm [--json PATH] [--quick] [--sweep] [--shape MxN]... [--weights f32|input]
//                   [--dtype bf16|f32] [--norm layernorm|rmsnorm] [--columns NAME[,NAME]...]
//                   [--kernel ref1|ref2|ref3|ref4|ref5|tuned|ladder] [--residual]
//   --kernel: the rung of the ladder to time (kernels/norm/reference.h): ref1 (one thread a row),
//   ref2 (one warp a row), ref3 (the row in registers, 16-byte vectors), ref4 (ref3 + dw / db by
//   lock-guarded partial rows), ref5 (ref3 + a persistent grid's partial rows), tuned (the
//   default); the reference rows are fwd, bwd and fwd inference. ladder: every rung and the tuned
//   kernels (both strategies), one line each per shape, fwd and bwd in GB/s and % of copy, on
//   the shapes below plus 16384 x 1024.
//   --sweep: % of copy under several tunings, after a copy of the forward's bytes (the ceiling
//   of a pass that moves that little: launch, ramp-up and tail count for more);
//   --shape: only these shapes (repeatable); --dtype, --norm: only that dtype, that norm;
//   --columns: only these sweep columns (e.g. --columns "auto,loop 512x2,auto again");
//   --residual: also the two kernels as a transformer block's norms run them, with the residual
//   add fused: "fwd residual" (h = x + r written beside y: x, r read, h, y written, 4 M N s
//   bytes) and "bwd grid + dh" (the residual stream's gradient dh added into dx: x, dy, dh read,
//   dx written, 4 M N s), the tuned kernels only; with --sweep, those two under each tuning.
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench_common.h"
#include "core/autograd.h"
#include "core/cuda_backend.h"
#include "core/ops.h"
#include "core/random.h"
#include "kernels/norm.h"
#include "kernels/norm/reference.h"

using namespace fg;
using bench::Row;
using kernels::NormKind;

namespace {

struct NormShape {
    std::int64_t m, n;
};

kernels::ScalarType scalar(DType t) {
    return static_cast<kernels::ScalarType>(t);
}

// The same math from unfused fusegrad ops (f32), x (M, N) -> y.
Tensor unfused_norm(NormKind kind, const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor eps = Tensor::full({}, 1e-5, DType::f32, Device::cuda);
    std::int64_t m = x.size(0);
    if (kind == NormKind::rms) {
        Tensor ms = mean_last(mul(x, x)).reshape({m, 1});
        return mul(mul(x, rsqrt(add(ms, eps))), w);
    }
    Tensor xc = sub(x, mean_last(x).reshape({m, 1}));
    Tensor var = mean_last(mul(xc, xc)).reshape({m, 1});
    return add(mul(mul(xc, rsqrt(add(var, eps))), w), b);
}

// Rows: fwd, bwd grid, bwd locked (unless `locked` is false), fwd inference, and (with
// `unfused`) unfused fwd and bwd.
std::vector<Row> bench_shape(bench::Timer& timer, double copy_gbs, NormKind kind, DType dt,
                             DType wt, NormShape s, bool unfused = true, bool locked = true,
                             const kernels::NormTuning* tuning = nullptr, int reference = 0,
                             bool residual = false) {
    const char* kname = kind == NormKind::rms ? "rmsnorm" : "layernorm";
    const double elem = static_cast<double>(dtype_size(dt));
    const double fwd_bytes = 2.0 * s.m * s.n * elem, bwd_bytes = 3.0 * s.m * s.n * elem;
    char shape[48];
    std::snprintf(shape, sizeof shape, "%lldx%lld", (long long)s.m, (long long)s.n);
    std::string prefix = std::string(kname) + " " + dtype_name(dt) + " " +
                         (reference ? "ref" + std::to_string(reference) + " " : "");

    Tensor x = randn({s.m, s.n}, Device::cuda).to(dt);
    Tensor dy = randn({s.m, s.n}, Device::cuda).to(dt);
    Tensor w = randn({s.n}, Device::cuda, nullptr, 1.0f, 0.1f).to(wt);
    Tensor b = randn({s.n}, Device::cuda, nullptr, 0.0f, 0.1f).to(wt);
    Tensor y = Tensor::empty({s.m, s.n}, dt, Device::cuda),
           dx = Tensor::empty({s.m, s.n}, dt, Device::cuda);
    Tensor mean = Tensor::empty({s.m}, DType::f32, Device::cuda),
           rstd = Tensor::empty({s.m}, DType::f32, Device::cuda);
    Tensor dw = Tensor::empty({s.n}, wt, Device::cuda), db = Tensor::empty({s.n}, wt, Device::cuda);
    bool layer = kind == NormKind::layer;
    CudaBackend& cuda = cuda_backend("bench");

    kernels::NormForwardArgs f;
    f.kind = kind;
    f.x_type = scalar(dt);
    f.w_type = scalar(wt);
    f.rows = s.m;
    f.cols = s.n;
    f.x = x.raw_data();
    f.weight = w.raw_data();
    f.bias = layer ? b.raw_data() : nullptr;
    f.y = y.raw_data();
    f.mean = mean.data<float>();
    f.rstd = rstd.data<float>();
    f.tuning = tuning;

    std::vector<Row> rows;
    auto add_row = [&](const std::string& name, double ms, double bytes) {
        double gbs = bytes / (ms * 1e6);
        rows.push_back({"norm", prefix + name, shape, ms, gbs, "GB/s", gbs / copy_gbs, "of copy"});
    };
    // The rung of the ladder: the tuned kernels through the backend, or a reference version.
    auto fused_forward = [&](const kernels::NormForwardArgs& args) {
        if (reference) kernels::norm_forward_reference(args, reference);
        else cuda.norm_forward(args);
    };
    add_row("fwd", timer.median_ms([&] { fused_forward(f); }), fwd_bytes);
    const bool with_residual = residual && !reference;
    Tensor r, h, dh;
    if (with_residual) {  // --residual: h = x + r beside y
        r = randn({s.m, s.n}, Device::cuda).to(dt);
        h = Tensor::empty({s.m, s.n}, dt, Device::cuda);
        dh = randn({s.m, s.n}, Device::cuda).to(dt);
        kernels::NormForwardArgs fr = f;
        fr.residual = r.raw_data();
        fr.h_out = h.raw_data();
        add_row("fwd residual", timer.median_ms([&] { cuda.norm_forward(fr); }), 2.0 * fwd_bytes);
    }

    fused_forward(f);  // statistics for the backward
    for (NormReduction red : {NormReduction::grid, NormReduction::locked}) {
        if (red == NormReduction::locked && (!locked || reference)) continue;
        kernels::NormBackwardArgs a;
        a.kind = kind;
        a.x_type = scalar(dt);
        a.w_type = scalar(wt);
        a.rows = s.m;
        a.cols = s.n;
        a.reduction = red;
        a.tuning = tuning;
        a.x = x.raw_data();
        a.dy = dy.raw_data();
        a.weight = w.raw_data();
        a.mean = layer ? mean.data<float>() : nullptr;
        a.rstd = rstd.data<float>();
        a.dx = dx.raw_data();
        a.dweight = dw.raw_data();
        a.dbias = layer ? db.raw_data() : nullptr;
        const std::size_t ws_bytes =
            reference ? kernels::norm_backward_reference_workspace_bytes(a, reference)
                      : cuda.norm_backward_workspace_bytes(a);
        Tensor ws = Tensor::empty({(std::int64_t)ws_bytes / 4 + 1}, DType::f32, Device::cuda);
        a.workspace = ws.raw_data();
        if (reference) {
            add_row("bwd", timer.median_ms([&] { kernels::norm_backward_reference(a, reference); }),
                    bwd_bytes);
            continue;
        }
        add_row(std::string("bwd ") + kernels::norm_reduction_name(red),
                timer.median_ms([&] { cuda.norm_backward(a); }), bwd_bytes);
        if (with_residual && red == NormReduction::grid) {  // --residual: dx += dh
            kernels::NormBackwardArgs ad = a;
            ad.dh = dh.raw_data();
            add_row("bwd grid + dh", timer.median_ms([&] { cuda.norm_backward(ad); }),
                    bwd_bytes * 4.0 / 3.0);
        }
    }

    // The forward as inference runs it: y alone. PyTorch's forward under no_grad writes no
    // statistics either, and is timed beside this one (bench/norm_torch.py).
    kernels::NormForwardArgs inference = f;
    inference.mean = inference.rstd = nullptr;
    add_row("fwd inference", timer.median_ms([&] { fused_forward(inference); }), fwd_bytes);

    if (!unfused || reference) return rows;
    // Unfused: fusegrad's f32 ops (bf16 cast in and out, as a framework without the kernel would).
    Tensor xl = x.detach().set_requires_grad(true);  // the leaf, in the benchmark's dtype
    Tensor wu = cast(w.detach(), DType::f32).detach().set_requires_grad(true),
           bu = cast(b.detach(), DType::f32).detach().set_requires_grad(true);
    Tensor out;
    auto forward = [&] {
        Tensor o = unfused_norm(kind, cast(xl, DType::f32), wu, bu);
        out = cast(o, dt);
    };
    {
        NoGradGuard no_grad;
        add_row("unfused fwd", timer.median_ms(forward, 10), fwd_bytes);
    }
    auto build = [&] {
        xl.zero_grad();
        wu.zero_grad();
        bu.zero_grad();
        forward();
    };
    add_row("unfused bwd", timer.median_ms([&] { out.backward(dy); }, 10, 2, build), bwd_bytes);
    return rows;
}

// --sweep's columns: a name and the tuning it sets (host code only; no device needed).
struct SweepColumn {
    std::string name;
    kernels::NormTuning tuning;
    bool locked = false;  // its bwd is strategy (a)'s, not (b)'s
};
std::vector<SweepColumn> sweep_columns() {
    using Tuning = kernels::NormTuning;
    std::vector<SweepColumn> columns;
    auto column = [&](std::string name, auto change) {
        Tuning t;
        change(t);
        columns.push_back({std::move(name), t});
    };
    column("auto", [](Tuning&) {});
    // Strategy (a): G partial rows under locks (auto: rule B5), grids of fewer blocks an SM.
    auto locked = [&](std::string name, auto change) {
        column(std::move(name), change);
        columns.back().locked = true;
    };
    locked("locked", [](Tuning&) {});
    for (int g : {33, 264, 528, 1 << 20})
        locked(g == 1 << 20 ? std::string("locked G all") : "locked G " + std::to_string(g),
               [g](Tuning& t) { t.lock_rows = g; });
    for (int threads : {256, 1024})
        locked("locked " + std::to_string(threads) + "/SM",
               [threads](Tuning& t) { t.grid_threads_per_sm = threads; });
    column("prefetch 0", [](Tuning& t) { t.prefetch_distance = 0; });
    column("registers", [](Tuning& t) { t.stage_bytes = 0; });
    for (int stages : {3, 4})  // auto is 2
        column("stages " + std::to_string(stages), [&](Tuning& t) { t.stages = stages; });
    for (int kib : {8, 16, 64})  // bytes of a row group staged at once (auto: 32 KiB)
        column("stage " + std::to_string(kib) + "K",
               [&](Tuning& t) { t.stage_bytes = kib * 1024; });
    for (int elems : {16, 8, 4})  // columns a backward thread takes (auto: see NormTuning)
        column("bwd elems " + std::to_string(elems), [&](Tuning& t) { t.backward_elems = elems; });
    column("staged", [](Tuning& t) {  // every row the staged forward can take, none looped
        t.forward_stage_cols = 1;
        t.forward_loop_cols = Tuning::kNever;
    });
    for (int vectors : {8, 4, 2, 1})  // auto is 2 or 4 (rule F6, kernels/norm/plan.cpp)
        column("row vec " + std::to_string(vectors),
               [&](Tuning& t) { t.forward_row_vectors = vectors; });
    // Short rows in the register kernel that reads its threads a row at run time.
    column("run-time tpr", [](Tuning& t) { t.forward_fixed_rows = 0; });
    // Weight, bias and zero-centring read at run time, as for an unusual call.
    column("any affine", [](Tuning& t) { t.usual_affine = 0; });
    // The staged backward's partial rows added by the column kernel, not by its own grid.
    column("sums kernel", [](Tuning& t) { t.grid_column_sums = 0; });
    // Looped blocks of threads x vectors: the shapes one step of 4096 vectors, or less, takes.
    const int looped[][2] = {{256, 4}, {512, 2}, {1024, 1}, {512, 4}, {1024, 2}, {1024, 4},
                             {1024, 8}};
    for (const auto& shape : looped) {
        const int threads = shape[0], vectors = shape[1];
        column("loop " + std::to_string(threads) + "x" + std::to_string(vectors), [&](Tuning& t) {
            t.forward_loop_cols = 1;
            t.forward_loop_threads = threads;
            t.forward_loop_vectors = vectors;
        });
    }
    // Looped rows loading 1 or 2 of their vectors at once in the second pass (auto: 2, 1 for
    // LayerNorm of 2-byte values; 4 at 8 vectors a step).
    for (int batch : {1, 2})
        column("loop batch " + std::to_string(batch),
               [&](Tuning& t) { t.forward_loop_batch = batch; });
    // The defaults again, last: how far the figures drift over a shape's columns (the columns
    // differ by less than that only in what the sweep cannot tell apart).
    column("auto again", [](Tuning&) {});
    return columns;
}

// --columns NAME[,NAME]...: those sweep columns, in the sweep's order; an unknown name is an
// error naming the columns there are. Empty: all of them.
std::vector<SweepColumn> pick_columns(const std::string& wanted) {
    std::vector<SweepColumn> all = sweep_columns();
    if (wanted.empty()) return all;
    std::vector<std::string> names;
    for (std::size_t start = 0;;) {
        const std::size_t comma = wanted.find(',', start);
        names.push_back(wanted.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    std::vector<SweepColumn> picked;
    for (const std::string& name : names) {
        bool known = false;
        for (const SweepColumn& c : all) known = known || c.name == name;
        if (!known) {
            std::string list;
            for (const SweepColumn& c : all) list += (list.empty() ? "" : ", ") + c.name;
            throw std::invalid_argument("bench_norm: --columns: no sweep column '" + name +
                                        "' (the columns: " + list + ")");
        }
    }
    for (const SweepColumn& c : all)
        for (const std::string& name : names)
            if (c.name == name) {
                picked.push_back(c);
                break;
            }
    return picked;
}

// --sweep: fused forward and backward (b) under each tuning, printed as one line per shape.
void sweep(bench::Timer& timer, double copy_gbs, bool weights_f32,
           const std::vector<SweepColumn>& columns, const std::vector<NormShape>& shapes,
           const std::vector<DType>& dtypes, const std::vector<NormKind>& kinds,
           bool residual) {
    std::printf("\nsweep: %% of copy, fwd / bwd (b; (a) in the locked columns), under these "
                "tunings (auto: the defaults; loop TxV: every row looped, T threads, V vectors a "
                "step):\n%-22s %9s",
                "case", "copy fwd");
    for (const SweepColumn& c : columns) std::printf(" %15s", c.name.c_str());
    std::printf("\n");
    for (DType dt : dtypes) {
        for (NormKind kind : kinds) {
            for (NormShape s : shapes) {
                std::printf("%-4s %-9s %-8s", dtype_name(dt),
                            kind == NormKind::rms ? "rms" : "layer",
                            (std::to_string(s.m) + "x" + std::to_string(s.n)).c_str());
                const std::size_t bytes = (std::size_t)(s.m * s.n) * dtype_size(dt);
                std::printf(" %9.1f", 100 * bench::copy_bandwidth_gbs(timer, bytes) / copy_gbs);
                for (const SweepColumn& c : columns) {
                    // rows: fwd, (fwd residual,) bwd grid, (bwd grid + dh,) (bwd locked,)
                    // fwd inference; with --residual the fused-residual rows are printed
                    std::vector<Row> rows =
                        bench_shape(timer, copy_gbs, kind, dt, weights_f32 ? DType::f32 : dt, s,
                                    false, c.locked, &c.tuning, 0, residual);
                    const int fwd = residual ? 1 : 0, grid = residual ? 3 : 1;
                    std::printf("   %5.1f / %5.1f", 100 * rows[fwd].ratio,
                                100 * rows[c.locked ? grid + 1 : grid].ratio);
                }
                std::printf("\n");
                std::fflush(stdout);
            }
        }
    }
}

// --kernel ladder: for each case, every rung of the reference tier and the tuned kernels with
// both dw / db strategies, forward and backward beside the copy. Returns the rows for the JSON.
std::vector<Row> ladder(bench::Timer& timer, double copy_gbs, bool weights_f32,
                        const std::vector<NormShape>& shapes, const std::vector<DType>& dtypes,
                        const std::vector<NormKind>& kinds) {
    static const char* const kRungs[] = {
        "v1 thread a row", "v2 warp a row", "v3 row in registers", "v4 + locked partial rows",
        "v5 + grid partial rows"};
    std::vector<Row> all;
    std::printf("\nladder: GB/s (%% of copy); versions 4 and 5 run version 3's forward\n");
    for (DType dt : dtypes)
        for (NormKind kind : kinds)
            for (NormShape s : shapes) {
                std::printf("\n%s %s %lldx%lld\n%-26s %18s %18s\n", dtype_name(dt),
                            kind == NormKind::rms ? "rmsnorm" : "layernorm", (long long)s.m,
                            (long long)s.n, "rung", "fwd", "bwd");
                const DType wt = weights_f32 ? DType::f32 : dt;
                auto line = [&](const char* name, const Row& fwd, const Row& bwd) {
                    std::printf("%-26s %9.0f (%5.1f%%) %9.0f (%5.1f%%)\n", name, fwd.value,
                                100 * fwd.ratio, bwd.value, 100 * bwd.ratio);
                    std::fflush(stdout);
                };
                for (int version = 1; version <= kernels::kNormReferenceVersions; ++version) {
                    std::vector<Row> rows;  // fwd, bwd, fwd inference
                    try {
                        rows = bench_shape(timer, copy_gbs, kind, dt, wt, s, false, false,
                                           nullptr, version);
                    } catch (const std::invalid_argument& e) {  // a row longer than it holds
                        std::printf("%-26s %s\n", kRungs[version - 1], e.what());
                        continue;
                    }
                    line(kRungs[version - 1], rows[0], rows[1]);
                    all.insert(all.end(), rows.begin(), rows.end());
                }
                // rows: fwd, bwd grid, bwd locked, fwd inference
                std::vector<Row> tuned = bench_shape(timer, copy_gbs, kind, dt, wt, s, false);
                line("tuned, grid (b)", tuned[0], tuned[1]);
                line("tuned, locked (a)", tuned[0], tuned[2]);
                all.insert(all.end(), tuned.begin(), tuned.end());
            }
    return all;
}

}  // namespace

int main(int argc, char** argv) {
    std::string json = "bench_norm.json";
    bool quick = false, do_sweep = false, weights_f32 = true;
    std::vector<NormShape> only;
    std::vector<DType> dtypes{DType::bf16, DType::f32};
    std::vector<NormKind> kinds{NormKind::layer, NormKind::rms};
    std::string columns;
    int reference = 0;  // --kernel: 0 tuned, 1 to 5 a reference version
    bool do_ladder = false, residual = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--kernel") == 0 && i + 1 < argc) {
            const std::string k = argv[++i];
            const bool ref = k.size() == 4 && k.compare(0, 3, "ref") == 0 && k[3] >= '1' &&
                             k[3] < '1' + kernels::kNormReferenceVersions;
            if (!ref && k != "tuned" && k != "ladder") {
                std::fprintf(stderr,
                             "bench_norm: --kernel wants ref1 to ref%d, tuned or ladder (got "
                             "'%s')\n",
                             kernels::kNormReferenceVersions, k.c_str());
                return 2;
            }
            reference = ref ? k[3] - '0' : 0;
            do_ladder = k == "ladder";
        }
        if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        if (std::strcmp(argv[i], "--quick") == 0) quick = true;
        if (std::strcmp(argv[i], "--sweep") == 0) do_sweep = true;
        if (std::strcmp(argv[i], "--residual") == 0) residual = true;
        if (std::strcmp(argv[i], "--weights") == 0 && i + 1 < argc) {
            weights_f32 = std::strcmp(argv[++i], "f32") == 0;
            if (!weights_f32 && std::strcmp(argv[i], "input") != 0) {
                std::fprintf(stderr, "bench_norm: --weights wants f32 or input (got '%s')\n",
                             argv[i]);
                return 2;
            }
        }
        if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char* d = argv[++i];
            if (std::strcmp(d, "bf16") != 0 && std::strcmp(d, "f32") != 0) {
                std::fprintf(stderr, "bench_norm: --dtype wants bf16 or f32 (got '%s')\n", d);
                return 2;
            }
            dtypes = {std::strcmp(d, "bf16") == 0 ? DType::bf16 : DType::f32};
        }
        if (std::strcmp(argv[i], "--norm") == 0 && i + 1 < argc) {
            const char* k = argv[++i];
            if (std::strcmp(k, "layernorm") != 0 && std::strcmp(k, "rmsnorm") != 0) {
                std::fprintf(stderr, "bench_norm: --norm wants layernorm or rmsnorm (got '%s')\n",
                             k);
                return 2;
            }
            kinds = {std::strcmp(k, "rmsnorm") == 0 ? NormKind::rms : NormKind::layer};
        }
        if (std::strcmp(argv[i], "--columns") == 0 && i + 1 < argc) columns = argv[++i];
        if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
            long long m = 0, n = 0;
            if (std::sscanf(argv[++i], "%lldx%lld", &m, &n) != 2 || m < 1 || n < 1) {
                std::fprintf(stderr, "bench_norm: --shape wants MxN with M, N >= 1 (got '%s')\n",
                             argv[i]);
                return 2;
            }
            only.push_back({m, n});
        }
    }
    if (!columns.empty() && !do_sweep) {
        std::fprintf(stderr, "bench_norm: --columns picks columns of --sweep; give --sweep too\n");
        return 2;
    }
    std::vector<SweepColumn> sweep_cols;
    try {
        sweep_cols = pick_columns(columns);
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    try {
        const kernels::DeviceInfo& dev = kernels::device_info();
        std::printf("bench_norm on %s (%d SMs), weights %s\n", dev.name.c_str(), dev.sm_count,
                    weights_f32 ? "f32" : "in the input dtype");
        bench::Timer timer;
        double copy = bench::copy_bandwidth_gbs(timer, std::size_t(1) << 30);
        std::vector<Row> rows{
            {"copy", "cudaMemcpy device to device", "1 GiB", 0.0, copy, "GB/s", 1.0, "of copy"}};
        // The baby GPT's and GPT-2 small's widths, then M N = 2^25 from N = 1024 to 32768.
        std::vector<NormShape> shapes{{16384, 384}, {16384, 768}, {32768, 1024}, {8192, 4096},
                                      {4096, 8192}, {2048, 16384}, {1024, 32768}};
        if (do_ladder) shapes.insert(shapes.begin() + 2, {16384, 1024});
        if (quick) shapes = {{16384, 384}, {16384, 768}, {4096, 8192}};
        if (!only.empty()) shapes = only;
        if (do_ladder) {
            std::vector<Row> part = ladder(timer, copy, weights_f32, shapes, dtypes, kinds);
            rows.insert(rows.end(), part.begin(), part.end());
            bench::write_json(json, dev.name, copy, rows);
            std::printf("\nwrote %s\n", json.c_str());
            return 0;
        }
        if (do_sweep) {
            sweep(timer, copy, weights_f32, sweep_cols, shapes, dtypes, kinds, residual);
            return 0;
        }
        for (DType dt : dtypes)
            for (NormKind kind : kinds)
                for (NormShape s : shapes) {
                    auto part = bench_shape(timer, copy, kind, dt, weights_f32 ? DType::f32 : dt,
                                            s, true, true, nullptr, reference, residual);
                    rows.insert(rows.end(), part.begin(), part.end());
                }
        bench::print_table(rows);
        bench::write_json(json, dev.name, copy, rows);
        std::printf("\nwrote %s\n", json.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
