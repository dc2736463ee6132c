// tests/gpu/test_gpu_norm.cpp: the fused norm kernels against the float64 CPU reference.
// For RMSNorm and LayerNorm, x in f32, bf16 and f16, weights in f32 or x's dtype, with and
// without bias / fused residual / zero-centred weight, eps in {1e-6, 1e-5, 1e-2}, over
// M in {1, 37, 199, 4096, 65536} x N in {1, 7, 384, 1000, 2000, 4096, 4097, 8192, 65536}
// (pairs with M * N <= 2^26), each case backpropagated with both dw/db strategies. Inputs are
// rounded to their dtype first, so the reference sees exactly what the kernel sees; outputs are
// poisoned (NaN) before the kernels run. Then: strategy (b) is bitwise repeatable, strategy (a)
// agrees with it within fp32 rounding over many runs (a race would move the error), misaligned
// and empty inputs, and a forward and backward replayed from a captured CUDA graph.
//
// FG_NORM_TEST_MAX_ELEMS (environment) caps M * N, for compute-sanitizer runs.
#include <algorithm>
#include <cstdlib>
#include <limits>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "kernels/runtime.h"
#include "layers/norm.h"
#include "../test_helpers.h"

using namespace fg;
using kernels::NormKind;
using test::rel_error;

namespace {

const std::vector<std::int64_t> kM{1, 37, 199, 4096, 65536};
const std::vector<std::int64_t> kN{1, 7, 384, 1000, 2000, 4096, 4097, 8192, 65536};
const std::vector<double> kEps{1e-6, 1e-5, 1e-2};

std::int64_t max_elems() {
    const char* cap = std::getenv("FG_NORM_TEST_MAX_ELEMS");
    return cap ? std::atoll(cap) : (std::int64_t(1) << 26);
}

struct Case {
    NormKind kind;
    DType x_type, w_type;
    bool weight, bias, residual, zero_centered;
    double eps;
    std::int64_t m, n;

    std::string describe() const {
        return std::string(kind == NormKind::rms ? "rmsnorm" : "layernorm") + " x " +
               dtype_name(x_type) + " w " + dtype_name(w_type) + " weight " +
               std::to_string(weight) + " bias " + std::to_string(bias) + " residual " +
               std::to_string(residual) + " zc " + std::to_string(zero_centered) + " eps " +
               std::to_string(eps) + " M " + std::to_string(m) + " N " + std::to_string(n);
    }
};

// Tolerance for comparing a result stored in dtype t with the float64 reference (norm-wise).
double tol_for(DType t) {
    return t == DType::f32 ? 2e-5 : t == DType::bf16 ? 8e-3 : 1.5e-3;
}

// A host tensor of random values already rounded to `t` (returned as f32 on the CPU).
Tensor rounded(const Shape& shape, DType t, float mean = 0.0f, float stddev = 1.0f) {
    Tensor v = randn(shape, Device::cpu, &test::test_generator(), mean, stddev);
    return v.to(t).to(DType::f32);
}

struct Inputs {
    Tensor x, r, w, b, dy, dh;  // f32 host tensors holding dtype-exact values
};

Inputs make_inputs(const Case& c) {
    Inputs in;
    in.x = rounded({c.m, c.n}, c.x_type, 0.5f, 2.0f);  // a nonzero mean: LayerNorm must remove it
    in.r = rounded({c.m, c.n}, c.x_type);
    in.w = rounded({c.n}, c.w_type, c.zero_centered ? 0.0f : 1.0f, 0.3f);
    in.b = rounded({c.n}, c.w_type, 0.0f, 0.3f);
    in.dy = rounded({c.m, c.n}, c.x_type);
    in.dh = rounded({c.m, c.n}, c.x_type);
    return in;
}

struct Outputs {
    Tensor y, h, dx, dr, dw, db;
};

// Runs forward and backward on one device/dtype; grads of L = sum(y * dy) + sum(h * dh).
Outputs run(const Case& c, const Inputs& in, Device device, DType x_type, DType w_type,
            NormReduction reduction, const kernels::NormTuning* tuning = nullptr) {
    auto prep = [&](const Tensor& t, DType type, bool grad) {
        Tensor out = t.to(type).to(device).detach();
        if (grad) out.set_requires_grad(true);
        return out;
    };
    Tensor x = prep(in.x, x_type, true);
    Tensor r = c.residual ? prep(in.r, x_type, true) : Tensor();
    Tensor w = c.weight ? prep(in.w, w_type, true) : Tensor();
    Tensor b = c.bias ? prep(in.b, w_type, true) : Tensor();
    NormOptions o;
    o.eps = c.eps;
    o.zero_centered = c.zero_centered;
    o.reduction = reduction;
    o.tuning = tuning;
    Outputs out;
    if (c.residual && device == Device::cpu) {
        // The kernel stores h = x + r in the activation dtype and normalises that stored h; the
        // reference does the same, unfused: round h to c.x_type, treat the rounding as identity
        // in the backward.
        Tensor h = add(x, r), rounding;
        {
            NoGradGuard no_grad;  // a constant: the gradient passes through unrounded
            rounding = sub(cast(cast(h, c.x_type), x_type), h);
        }
        out.h = add(h, rounding);
        out.y = c.kind == NormKind::rms ? rms_norm(out.h, w, b, o) : layer_norm(out.h, w, b, o);
    } else if (c.residual) {
        NormResidualResult res = c.kind == NormKind::rms ? rms_norm_residual(x, r, w, b, o)
                                                         : layer_norm_residual(x, r, w, b, o);
        out.y = res.y;
        out.h = res.h;
    } else {
        out.y = c.kind == NormKind::rms ? rms_norm(x, w, b, o) : layer_norm(x, w, b, o);
    }
    DType acc = device == Device::cpu ? DType::f64 : DType::f32;
    auto dot = [&](const Tensor& t, const Tensor& g) {
        return sum(mul(cast(t, acc), g.to(acc).to(device)));
    };
    Tensor loss = dot(out.y, in.dy);
    if (c.residual) loss = add(loss, dot(out.h, in.dh));
    loss.backward();
    out.dx = x.grad();
    if (c.residual) out.dr = r.grad();
    if (c.weight) out.dw = w.grad();
    if (c.bias) out.db = b.grad();
    return out;
}

// ||gpu - ref|| / max(||ref||, scale) <= tol. `scale` is the size of the terms that cancel in the
// result, when that is larger than the result itself (see dx_scale).
void compare(const char* what, const Tensor& gpu, const Tensor& ref, double tol,
             double scale = 0.0) {
    INFO(what);
    REQUIRE(gpu.defined() == ref.defined());
    if (!gpu.defined()) return;
    REQUIRE(gpu.is_cuda());
    std::vector<double> a = gpu.to_vector<double>(), b = ref.to_vector<double>();
    double num = 0.0, den = 0.0;
    std::size_t nans = 0, first_nan = 0;  // poisoned, never written elements (one assertion)
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) && nans++ == 0) first_nan = i;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    INFO(nans << " NaN element(s), the first at flat index " << first_nan);
    REQUIRE(nans == 0);
    double norm = std::max(std::sqrt(den), scale);
    CHECK(std::sqrt(num) / (norm > 0 ? norm : 1.0) <= tol);
}

// dx = (g - x_hat c1 - c2) rstd subtracts terms of size |g rstd|, g = w' dy. When they nearly
// cancel (RMSNorm with N = 1: x_hat = +-1, so dx = g (1 - x_hat^2) rstd is tiny), any fp32
// implementation is only accurate relative to ||g rstd||, so the error is measured against that.
double dx_scale(const Case& c, const Inputs& in) {
    std::vector<double> x = in.x.to_vector<double>(), dy = in.dy.to_vector<double>();
    std::vector<double> w = in.w.to_vector<double>();
    if (c.residual) {
        std::vector<float> h = add(in.x, in.r).to(c.x_type).to_vector<float>();
        x.assign(h.begin(), h.end());
    }
    double total = 0.0;
    for (std::int64_t r = 0; r < c.m; ++r) {
        double mu = 0.0, var = 0.0;
        for (std::int64_t j = 0; j < c.n; ++j) mu += x[r * c.n + j];
        mu = c.kind == NormKind::layer ? mu / c.n : 0.0;
        for (std::int64_t j = 0; j < c.n; ++j) var += (x[r * c.n + j] - mu) * (x[r * c.n + j] - mu);
        double rstd = 1.0 / std::sqrt(var / c.n + c.eps);
        for (std::int64_t j = 0; j < c.n; ++j) {
            double scale = c.weight ? (c.zero_centered ? 1.0 + w[j] : w[j]) : 1.0;
            double g = scale * dy[r * c.n + j] * rstd;
            total += g * g;
        }
    }
    return std::sqrt(total);
}

// Both strategies on the GPU against the reference `ref`, under `tuning` (null: the defaults).
void check_strategies(const Case& c, const Inputs& in, const Outputs& ref,
                      const kernels::NormTuning* tuning = nullptr) {
    double tx = tol_for(c.x_type), tw = std::max(tol_for(c.w_type), 1e-4), sx = dx_scale(c, in);
    for (NormReduction red : {NormReduction::grid, NormReduction::locked}) {
        INFO("reduction " << kernels::norm_reduction_name(red));
        Outputs g = run(c, in, Device::cuda, c.x_type, c.w_type, red, tuning);
        compare("y", g.y, ref.y, tx);
        compare("h", g.h, ref.h, tx);
        compare("dx", g.dx, ref.dx, tx, sx);
        compare("dresidual", g.dr, ref.dr, tx, sx);
        compare("dw", g.dw, ref.dw, tw);
        compare("db", g.db, ref.db, tw);
    }
}

// The reference once, then both strategies on the GPU against it.
void check_case(const Case& c, const kernels::NormTuning* tuning = nullptr) {
    INFO(c.describe());
    Inputs in = make_inputs(c);
    check_strategies(c, in, run(c, in, Device::cpu, DType::f64, DType::f64, NormReduction::automatic),
                     tuning);
}

// Every (M, N) pair of the grid, each with two option sets; the option sets and eps cycle so that
// every combination meets many shapes.
void check_grid(NormKind kind, DType x_type) {
    REQUIRE(cuda_is_available());
    int k = 0;
    for (std::int64_t m : kM) {
        for (std::int64_t n : kN) {
            if (m * n > max_elems()) continue;
            for (int twice = 0; twice < 2; ++twice, ++k) {
                int bits = (k * 5 + static_cast<int>(kind) * 3) % 16;
                Case c{kind, x_type, (bits & 8) && x_type != DType::f32 ? x_type : DType::f32,
                       true, (bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0,
                       kEps[k % 3], m, n};
                if (k % 7 == 6) c.weight = c.zero_centered = false;  // now and then, no weight
                check_case(c);
            }
        }
    }
}

}  // namespace

TEST_CASE("rmsnorm f32 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::rms, DType::f32); }
TEST_CASE("rmsnorm bf16 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::rms, DType::bf16); }
TEST_CASE("rmsnorm f16 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::rms, DType::f16); }
TEST_CASE("layernorm f32 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::layer, DType::f32); }
TEST_CASE("layernorm bf16 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::layer, DType::bf16); }
TEST_CASE("layernorm f16 over the M x N grid", "[gpu][norm]") { check_grid(NormKind::layer, DType::f16); }

TEST_CASE("every option combination on small shapes", "[gpu][norm]") {
    REQUIRE(cuda_is_available());
    for (NormKind kind : {NormKind::rms, NormKind::layer})
        for (DType xt : {DType::f32, DType::bf16, DType::f16})
            for (DType wt : {DType::f32, xt})
                for (int bits = 0; bits < 16; ++bits)
                    for (std::int64_t n : {7, 1000, 4097}) {
                        bool weight = (bits & 8) != 0;
                        bool zc = (bits & 4) != 0 && weight;
                        check_case(Case{kind, xt, wt, weight, (bits & 1) != 0, (bits & 2) != 0,
                                        zc, kEps[bits % 3], 37, n});
                        if (wt == DType::f32 && xt == DType::f32) break;  // one weight type
                    }
}

TEST_CASE("strategy (b) is bitwise repeatable, and (a) agrees within fp32 rounding", "[gpu][norm]") {
    REQUIRE(cuda_is_available());
    struct Shape2 {
        std::int64_t m, n;
    };
    // Large shapes as in training, and three under 2^20 elements that sanitizer runs keep: many
    // blocks queueing on the locks (2048 x 384), and long rows (64 x 16384, 32 x 32768: on
    // Hopper split over clusters of 2 and 4 blocks, elsewhere streamed).
    std::vector<Shape2> shapes{{65536, 384}, {4096, 4096}, {199, 65536}, {2048, 384},
                               {64, 16384},  {32, 32768},  {37, 7}};
    for (const Shape2& s : shapes) {
        if (s.m * s.n > max_elems()) continue;
        for (NormKind kind : {NormKind::rms, NormKind::layer}) {
            Case c{kind, DType::bf16, DType::f32, true, true, false, false, 1e-5, s.m, s.n};
            INFO(c.describe());
            Inputs in = make_inputs(c);
            Outputs first = run(c, in, Device::cuda, c.x_type, c.w_type, NormReduction::grid);
            std::vector<float> dw_b = first.dw.to_vector<float>(), db_b = first.db.to_vector<float>();
            for (int rep = 0; rep < 10; ++rep) {
                Outputs again = run(c, in, Device::cuda, c.x_type, c.w_type, NormReduction::grid);
                REQUIRE(again.dw.to_vector<float>() == dw_b);
                REQUIRE(again.db.to_vector<float>() == db_b);
            }
            std::vector<double> dwb(dw_b.begin(), dw_b.end()), dbb(db_b.begin(), db_b.end());
            double worst = 0.0;
            for (int rep = 0; rep < 30; ++rep) {
                Outputs a = run(c, in, Device::cuda, c.x_type, c.w_type, NormReduction::locked);
                worst = std::max({worst, rel_error(a.dw.to_vector<double>(), dwb),
                                  rel_error(a.db.to_vector<double>(), dbb)});
            }
            INFO("largest (a) vs (b) difference over 30 runs: " << worst);
            CHECK(worst <= 2e-6);
        }
    }
}

TEST_CASE("results do not depend on the tuning knobs", "[gpu][norm]") {
    // The tuning changes the launch (persistent grid size, elements per thread, threads a row,
    // 1024-thread rows, the looped path, its block shape and second-pass batch, how far ahead
    // rows are prefetched, rows staged in shared memory or held in registers, how many per stage
    // and how many stages, in the backward and the forward, rows split over clusters of 2, 4 or
    // 8 blocks or not, the usual affine case on its own path or read at run time, the staged
    // grid adding its partial rows or the column kernel), never the math.
    // Rows per block > 1, one row per block, rows split over a cluster, and the looped path; M
    // large enough that each persistent block loops over several row groups.
    REQUIRE(cuda_is_available());
    std::vector<kernels::NormTuning> tunings;
    for (int t : {0, 1, 2, 3}) {
        kernels::NormTuning k;
        k.prefetch_distance = t == 0 ? 0 : t == 1 ? 3 : 1;
        k.grid_threads_per_sm = t == 3 ? 256 : 2048;
        k.forward_elems = t == 2 ? 16 : t == 3 ? 4 : 32;
        k.backward_elems = t == 2 ? 8 : t == 3 ? 4 : 16;
        k.stage_bytes = t == 0 ? 0 : t == 2 ? 8 * 1024 : t == 3 ? 16 * 1024 : k.stage_bytes;
        k.stages = t == 2 ? 3 : t == 3 ? 4 : kernels::NormTuning::kAuto;  // kAuto: 2
        k.split_blocks = t == 1 ? 1 : t == 2 ? 4 : kernels::NormTuning::kAuto;
        k.forward_stage_cols = t >= 2 ? 1 : kernels::NormTuning::kAuto;  // stage every row
        // t == 2: every row that can be staged is, including those the looped kernel would
        // take by default (t == 3 loops every row, below).
        if (t == 2) k.forward_loop_cols = kernels::NormTuning::kNever;
        k.forward_row_vectors = t == 0 ? 4 : t == 2 ? 8 : kernels::NormTuning::kAuto;
        k.forward_fixed_rows = t == 1 ? 0 : 1;  // short rows with run-time threads a row
        k.usual_affine = t == 2 ? 0 : 1;  // the usual affine case read at run time
        k.grid_column_sums = t == 1 ? 0 : 1;  // staged partial rows summed by the column kernel
        if (t == 1 || t == 3) {  // every row looped, in blocks of 256 x 2 and 1024 x 4 vectors,
            k.forward_loop_cols = 1;  // the second pass loading 1 and 2 at once
            k.forward_loop_threads = t == 1 ? 256 : 1024;
            k.forward_loop_vectors = t == 1 ? 2 : 4;
            k.forward_loop_batch = t == 1 ? 1 : 2;
        }
        tunings.push_back(k);
    }
    for (std::int64_t n : {7, 384, 4096, 16384, 32768}) {
        std::int64_t m = std::min<std::int64_t>(2000, std::max<std::int64_t>(1, max_elems() / n / 4));
        for (const Case& c : {Case{NormKind::layer, DType::bf16, DType::f32, true, true, true, false,
                                   1e-5, m, n},
                              Case{NormKind::rms, DType::f32, DType::f32, true, false, false, true,
                                   1e-6, m, n}}) {
            INFO(c.describe());
            Inputs in = make_inputs(c);
            Outputs ref = run(c, in, Device::cpu, DType::f64, DType::f64, NormReduction::automatic);
            for (const kernels::NormTuning& t : tunings) {
                INFO("tuning: threads/SM " << t.grid_threads_per_sm << ", elems " << t.forward_elems
                     << " / " << t.backward_elems << ", prefetch " << t.prefetch_distance
                     << ", stage bytes " << t.stage_bytes << " x " << t.stages
                     << ", split " << t.split_blocks
                     << ", forward staged from " << t.forward_stage_cols << " columns"
                     << ", looped from " << t.forward_loop_cols << " columns ("
                     << t.forward_loop_threads << " x " << t.forward_loop_vectors << ", batch "
                     << t.forward_loop_batch << "), row vectors " << t.forward_row_vectors
                     << ", fixed rows " << t.forward_fixed_rows
                     << ", usual affine " << t.usual_affine
                     << ", grid column sums " << t.grid_column_sums);
                check_strategies(c, in, ref, &t);
            }
        }
    }
}

TEST_CASE("short rows on every fixed threads-a-row and vectors-a-thread kernel", "[gpu][norm]") {
    // Rows of 1 to 500 16-byte vectors, laid over 4 to 128 threads of 1 to 4 vectors by the row
    // vector targets 1, 2 and 4: together they reach all 24 register kernels built for their
    // threads a row (kernels/norm/forward.cu, with_fixed_row), most of them with a last vector that only
    // some lanes hold. M = 37: the last block holds fewer rows than the others.
    REQUIRE(cuda_is_available());
    int k = 0;
    for (DType xt : {DType::f32, DType::bf16}) {
        const std::int64_t vec = 16 / static_cast<std::int64_t>(dtype_size(xt));
        for (int target : {1, 2, 4}) {
            kernels::NormTuning t;
            t.forward_row_vectors = target;
            for (std::int64_t nvec :
                 {1, 5, 7, 11, 13, 19, 25, 35, 51, 67, 99, 128, 131, 195, 259, 387, 500}) {
                for (NormKind kind : {NormKind::rms, NormKind::layer}) {
                    INFO("row vectors " << target);
                    const int bits = k++;
                    check_case(Case{kind, xt, DType::f32, true, (bits & 1) != 0, (bits & 2) != 0,
                                    (bits & 4) != 0, kEps[bits % 3], 37, nvec * vec},
                               &t);
                }
            }
        }
    }
}

TEST_CASE("misaligned inputs take the scalar path and stay right", "[gpu][norm]") {
    REQUIRE(cuda_is_available());
    for (std::int64_t n : {384, 4096}) {
        const std::int64_t m = 33;
        Tensor flat = rounded({m * n + 1}, DType::bf16).to(DType::bf16).to(Device::cuda);
        Tensor x = flat.slice(1, m * n + 1).reshape({m, n}).detach().set_requires_grad(true);
        Tensor w = Tensor::ones({n}, DType::f32, Device::cuda).set_requires_grad(true);
        Tensor y = rms_norm(x, w);
        Tensor ref_x = x.to(Device::cpu).to(DType::f64);
        Tensor ref = rms_norm(ref_x, Tensor::ones({n}, DType::f64));
        CHECK(rel_error(y.to_vector<double>(), ref.to_vector<double>()) <= tol_for(DType::bf16));
        Tensor g = rounded({m, n}, DType::bf16).to(DType::bf16).to(Device::cuda);
        y.backward(g);
        REQUIRE(x.grad().defined());
        for (float v : x.grad().to_vector<float>()) REQUIRE(std::isfinite(v));
    }
}

// Sets every element of a GPU tensor to v, in place (NaN: a poison the kernels must overwrite).
void set_all(Tensor& t, double v) {
    Tensor values = Tensor::full(t.shape(), v, t.dtype(), Device::cuda);
    kernels::copy_device_to_device(t.raw_data(), values.raw_data(), t.nbytes());
}

// One LayerNorm forward and backward (weight and bias) called on the kernels directly, for the
// tests of options autograd does not use: its inputs, outputs and workspace on the GPU.
struct KernelCall {
    Tensor x, dy, w, y, dx, mean, rstd, dw, db, workspace;
    kernels::NormForwardArgs f;
    kernels::NormBackwardArgs b;

    KernelCall(std::int64_t m, std::int64_t n, DType dt, DType wt, NormReduction reduction,
               const kernels::NormTuning* tuning = nullptr) {
        x = rounded({m, n}, dt, 0.5f, 2.0f).to(dt).to(Device::cuda);
        dy = rounded({m, n}, dt).to(dt).to(Device::cuda);
        w = rounded({n}, wt, 1.0f, 0.3f).to(wt).to(Device::cuda);
        y = Tensor::empty({m, n}, dt, Device::cuda);
        dx = Tensor::empty({m, n}, dt, Device::cuda);
        mean = Tensor::empty({m}, DType::f32, Device::cuda);
        rstd = Tensor::empty({m}, DType::f32, Device::cuda);
        dw = Tensor::full({n}, 0.0, wt, Device::cuda);
        db = Tensor::full({n}, 0.0, wt, Device::cuda);
        f.kind = b.kind = NormKind::layer;
        f.x_type = b.x_type = static_cast<kernels::ScalarType>(dt);  // the same enumerators
        f.w_type = b.w_type = static_cast<kernels::ScalarType>(wt);
        f.rows = b.rows = m;
        f.cols = b.cols = n;
        f.x = b.x = x.raw_data();
        f.weight = b.weight = w.raw_data();
        f.y = y.raw_data();
        b.mean = f.mean = mean.data<float>();
        b.rstd = f.rstd = rstd.data<float>();
        b.reduction = reduction;
        f.tuning = b.tuning = tuning;
        b.dy = dy.raw_data();
        b.dx = dx.raw_data();
        b.dweight = dw.raw_data();
        b.dbias = db.raw_data();
        workspace = Tensor::empty(  // after dweight and dbias: it holds their partial rows
            {(std::int64_t)cuda().norm_backward_workspace_bytes(b) / 4 + 1}, DType::f32,
            Device::cuda);
        b.workspace = workspace.raw_data();
    }
    static CudaBackend& cuda() { return cuda_backend("test"); }
    void forward() { cuda().norm_forward(f); }
    void backward() { cuda().norm_backward(b); }
};

TEST_CASE("forward and backward replay from a captured CUDA graph", "[gpu][norm]") {
    // No host synchronisation inside the calls, and every reset in-stream: a forward and a
    // backward captured into a CUDA graph and replayed twice give what direct calls gave (the
    // same bits for strategy (b); (a) within fp32 rounding, its order varying). Shapes for the
    // register kernel, the staged one (a cooperative grid adding its own partial rows) and split
    // rows (a cooperative grid of clusters).
    REQUIRE(cuda_is_available());
    for (std::int64_t n : {384, 4096, 32768}) {
        for (NormReduction red : {NormReduction::grid, NormReduction::locked}) {
            INFO("N " << n << ", reduction " << kernels::norm_reduction_name(red));
            const std::int64_t m = std::max<std::int64_t>(1, std::min<std::int64_t>(300, max_elems() / n));
            KernelCall call(m, n, DType::bf16, DType::f32, red);
            call.forward();  // direct, first: kernel attributes and occupancy are set up here
            call.backward();
            const std::vector<float> y = call.y.to_vector<float>(), dx = call.dx.to_vector<float>();
            const std::vector<double> dw = call.dw.to_vector<double>(),
                                      db = call.db.to_vector<double>();
            for (Tensor* t : {&call.y, &call.dx, &call.dw, &call.db})
                set_all(*t, std::numeric_limits<double>::quiet_NaN());
            cudaStream_t s = kernels::stream();
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
            call.forward();
            call.backward();
            REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
            REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
            for (int replay = 0; replay < 2; ++replay) {
                REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
                REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
                CHECK(call.y.to_vector<float>() == y);
                CHECK(call.dx.to_vector<float>() == dx);
                if (red == NormReduction::grid) {
                    CHECK(call.dw.to_vector<double>() == dw);
                    CHECK(call.db.to_vector<double>() == db);
                } else {
                    CHECK(rel_error(call.dw.to_vector<double>(), dw) <= 2e-6);
                    CHECK(rel_error(call.db.to_vector<double>(), db) <= 2e-6);
                }
            }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    }
}

TEST_CASE("zero rows are a no-op, and no grad means no statistics", "[gpu][norm]") {
    REQUIRE(cuda_is_available());
    Tensor x = Tensor::zeros({0, 64}, DType::f32, Device::cuda).set_requires_grad(true);
    Tensor w = Tensor::ones({64}, DType::f32, Device::cuda).set_requires_grad(true);
    Tensor y = layer_norm(x, w);
    REQUIRE(y.numel() == 0);
    y.backward(Tensor::zeros({0, 64}, DType::f32, Device::cuda));
    for (float v : w.grad().to_vector<float>()) REQUIRE(v == 0.0f);
    Tensor a = rounded({5, 64}, DType::f32).to(Device::cuda);
    Tensor with_grad_off;
    {
        NoGradGuard guard;
        with_grad_off = rms_norm(a, w);
        REQUIRE_FALSE(with_grad_off.requires_grad());
    }
    Tensor with_grad_on = rms_norm(a, w);
    REQUIRE(with_grad_off.to_vector<float>() == with_grad_on.to_vector<float>());
}

TEST_CASE("norm layers on the GPU", "[gpu][norm]") {
    REQUIRE(cuda_is_available());
    NormConfig cfg;
    cfg.dim = 384;
    cfg.bias = true;
    cfg.device = Device::cuda;
    cfg.reduction = NormReduction::locked;
    LayerNorm ln(cfg);
    Tensor x = rounded({64, 384}, DType::f32).to(Device::cuda);
    sum(ln.forward(x)).backward();
    REQUIRE(ln.weight.grad().is_cuda());
    REQUIRE(ln.bias.grad().to_vector<float>()[0] == Approx(64.0f));
}
