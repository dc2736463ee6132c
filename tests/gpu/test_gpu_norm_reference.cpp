// tests/gpu/test_gpu_norm_reference.cpp: the reference tier of the norm kernels
// (kernels/norm/reference.h) against a float64 CPU computation of kernels/norm.h's math, versions
// 3-5 and the tuned kernels (kernels/norm.h) against reference version 2.
// RMSNorm and LayerNorm; x in f32, bf16 and f16, weights in f32 or x's type; all 64 combinations
// of weight, bias, fused residual, zero-centred weight, dh and operands that start one element
// past a 16-byte boundary (no 16-byte vectors), each at two of the shapes (1, 1), (37, 7),
// (45, 33), (199, 385), (64, 769), (16, 4097), (4, 8192), (2500, 384) (the last with hundreds
// of row groups: two blocks share each of version 4's locks, and for f32 the grid strides; the
// contention test below strides for every type). The tuned kernels run with both dw / db reductions, each with the default tuning and
// four that force their other paths. Inputs are rounded to their dtype first, so every
// computation sees the same values; outputs are poisoned (NaN) before each call.
// Tagged [norm_reference], not [norm] (the slow grid of test_gpu_norm.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <tuple>

#include "core/cuda_backend.h"
#include "kernels/norm.h"
#include "kernels/norm/reference.h"
#include "kernels/runtime.h"
#include "../test_helpers.h"

using namespace fg;
using kernels::NormKind;
using kernels::NormReduction;
using kernels::NormTuning;

namespace {

struct Case {
    NormKind kind;
    DType x_type, w_type;
    bool weight, bias, residual, zero_centered, dh, misaligned;
    float eps;
    std::int64_t m, n;

    std::string describe() const {
        return std::string(kind == NormKind::rms ? "rmsnorm" : "layernorm") + " x " +
               dtype_name(x_type) + " w " + dtype_name(w_type) + " weight " +
               std::to_string(weight) + " bias " + std::to_string(bias) + " residual " +
               std::to_string(residual) + " zc " + std::to_string(zero_centered) + " dh " +
               std::to_string(dh) + " misaligned " + std::to_string(misaligned) + " eps " +
               std::to_string(eps) + " M " + std::to_string(m) + " N " + std::to_string(n);
    }
};

// Host tensors (f32, on the CPU) of values exact in their dtype.
struct Inputs {
    Tensor x, r, h, w, b, dy, dh;  // h: what is normalised (x, or x + r rounded)
};

Tensor rounded(const Shape& shape, DType t, float mean = 0.0f, float stddev = 1.0f) {
    return randn(shape, Device::cpu, &test::test_generator(), mean, stddev).to(t).to(DType::f32);
}

Inputs make_inputs(const Case& c) {
    Inputs in;
    in.x = rounded({c.m, c.n}, c.x_type, 0.5f, 2.0f);  // a nonzero mean: LayerNorm must remove it
    in.r = rounded({c.m, c.n}, c.x_type);
    in.h = c.residual ? add(in.x, in.r).to(c.x_type).to(DType::f32) : in.x;
    in.w = rounded({c.n}, c.w_type, c.zero_centered ? 0.0f : 1.0f, 0.3f);
    in.b = rounded({c.n}, c.w_type, 0.0f, 0.3f);
    in.dy = rounded({c.m, c.n}, c.x_type);
    in.dh = rounded({c.m, c.n}, c.x_type);
    return in;
}

// What a forward and backward produce, as doubles; a vector is empty where the case has no such
// output (h without residual, mean for RMSNorm, dw without weight, db without bias).
struct Results {
    std::vector<double> h, y, mean, rstd, dx, dw, db;
    double dx_scale = 0.0;  // the float64 reference's ||w' dy rstd||: see compare
};

// kernels/norm.h's math in float64, on the same rounded inputs.
Results float64_reference(const Case& c, const Inputs& in) {
    const std::vector<double> x = in.h.to_vector<double>(), w = in.w.to_vector<double>(),
                              b = in.b.to_vector<double>(), dy = in.dy.to_vector<double>(),
                              dh = in.dh.to_vector<double>();
    const bool layer = c.kind == NormKind::layer;
    const std::int64_t m = c.m, n = c.n;
    Results e;
    if (c.residual) e.h = x;
    e.y.resize(m * n);
    e.dx.resize(m * n);
    e.rstd.resize(m);
    if (layer) e.mean.resize(m);
    std::vector<double> dw(n, 0.0), db(n, 0.0), x_hat(n), g(n);
    double scale2 = 0.0;
    for (std::int64_t row = 0; row < m; ++row) {
        const double* xr = &x[row * n];
        double mean = 0.0, var = 0.0;
        for (std::int64_t j = 0; j < n && layer; ++j) mean += xr[j] / n;
        for (std::int64_t j = 0; j < n; ++j) var += (xr[j] - mean) * (xr[j] - mean) / n;
        const double rstd = 1.0 / std::sqrt(var + (double)c.eps);
        if (layer) e.mean[row] = mean;
        e.rstd[row] = rstd;
        double c1 = 0.0, c2 = 0.0;
        for (std::int64_t j = 0; j < n; ++j) {
            const double wp = c.weight ? w[j] + (c.zero_centered ? 1.0 : 0.0) : 1.0;
            const double d = dy[row * n + j];
            x_hat[j] = (xr[j] - mean) * rstd;
            g[j] = wp * d;
            e.y[row * n + j] = x_hat[j] * wp + (c.bias ? b[j] : 0.0);
            c1 += x_hat[j] * g[j] / n;
            c2 += layer ? g[j] / n : 0.0;
            dw[j] += d * x_hat[j];
            db[j] += d;
            scale2 += g[j] * rstd * g[j] * rstd;
        }
        for (std::int64_t j = 0; j < n; ++j)
            e.dx[row * n + j] =
                (g[j] - x_hat[j] * c1 - c2) * rstd + (c.dh ? dh[row * n + j] : 0.0);
    }
    e.dx_scale = std::sqrt(scale2);
    if (c.weight) e.dw = dw;
    if (c.bias) e.db = db;
    return e;
}

// Which kernels run: a reference version (1 to 5), or (version 0) the tuned ones.
struct Path {
    int version;
    NormReduction reduction = NormReduction::grid;
    const NormTuning* tuning = nullptr;  // null: the defaults
};

Tensor poisoned(const Shape& shape, DType t) {
    return Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), t, Device::cuda);
}

// An (M, N) operand on the GPU. Misaligned: stored one element into its buffer, so that it
// starts 2 or 4 bytes past a 16-byte boundary and no kernel may read it in 16-byte vectors.
struct Operand {
    Tensor buffer;
    std::size_t offset = 0;  // bytes

    Operand() = default;
    // `values`: a host tensor to upload, or undefined for a poisoned output.
    Operand(const Case& c, const Tensor& values) {
        const std::int64_t count = c.m * c.n;
        offset = c.misaligned ? dtype_size(c.x_type) : 0;
        buffer = poisoned({count + (c.misaligned ? 1 : 0)}, c.x_type);
        if (values.defined() && count > 0)
            kernels::copy_device_to_device(ptr(), values.to(c.x_type).to(Device::cuda).raw_data(),
                                           count * dtype_size(c.x_type));
    }
    void* ptr() const { return static_cast<char*>(buffer.raw_data()) + offset; }
    std::vector<double> values() const {
        std::vector<double> v = buffer.to_vector<double>();
        v.erase(v.begin(), v.begin() + (offset ? 1 : 0));
        return v;
    }
};

// One case's inputs and (poisoned) outputs on the GPU, and the argument structs pointing at them.
struct Call {
    Case c;
    Operand x, r, dy, dh, h, y, dx;
    Tensor w, b, mean, rstd, dw, db, workspace;
    kernels::NormForwardArgs f;
    kernels::NormBackwardArgs g;

    Call(const Case& c_, const Inputs& in) : c(c_) {
        auto up = [](const Tensor& t, DType type) { return t.to(type).to(Device::cuda); };
        x = Operand(c, in.x);
        r = Operand(c, in.r);
        dy = Operand(c, in.dy);
        dh = Operand(c, in.dh);
        h = Operand(c, Tensor());
        y = Operand(c, Tensor());
        dx = Operand(c, Tensor());
        w = up(in.w, c.w_type);
        b = up(in.b, c.w_type);
        mean = poisoned({c.m}, DType::f32);  // RMSNorm: never written, and must not be read
        rstd = poisoned({c.m}, DType::f32);
        dw = poisoned({c.n}, c.w_type);
        db = poisoned({c.n}, c.w_type);
        f.kind = g.kind = c.kind;
        f.x_type = g.x_type = static_cast<kernels::ScalarType>(c.x_type);  // the same enumerators
        f.w_type = g.w_type = static_cast<kernels::ScalarType>(c.w_type);
        f.rows = g.rows = c.m;
        f.cols = g.cols = c.n;
        f.eps = c.eps;
        f.zero_centered = g.zero_centered = c.zero_centered;
        f.x = x.ptr();
        if (c.residual) {
            f.residual = r.ptr();
            f.h_out = h.ptr();
        }
        f.weight = g.weight = c.weight ? w.raw_data() : nullptr;
        f.bias = c.bias ? b.raw_data() : nullptr;
        f.y = y.ptr();
        f.mean = mean.data<float>();
        f.rstd = rstd.data<float>();
        g.x = c.residual ? h.ptr() : x.ptr();
        g.dy = dy.ptr();
        g.dh = c.dh ? dh.ptr() : nullptr;
        g.mean = f.mean;
        g.rstd = f.rstd;
        g.dx = dx.ptr();
        g.dweight = c.weight ? dw.raw_data() : nullptr;
        g.dbias = c.bias ? db.raw_data() : nullptr;
    }

    void forward(const Path& p) {
        f.tuning = p.tuning;
        if (p.version == 0) kernels::norm_forward(f);
        else kernels::norm_forward_reference(f, p.version);
    }
    void backward(const Path& p) {
        g.tuning = p.tuning;
        g.reduction = p.reduction;
        const std::size_t bytes = p.version == 0
                                      ? kernels::norm_backward_workspace_bytes(g)
                                      : kernels::norm_backward_reference_workspace_bytes(g, p.version);
        workspace = Tensor::empty({(std::int64_t)bytes / 4 + 1}, DType::f32, Device::cuda);
        g.workspace = workspace.raw_data();
        if (p.version == 0) kernels::norm_backward(g);
        else kernels::norm_backward_reference(g, p.version);
    }
    Results results() const {
        Results out;
        if (c.residual) out.h = h.values();
        out.y = y.values();
        if (c.kind == NormKind::layer) out.mean = mean.to_vector<double>();
        out.rstd = rstd.to_vector<double>();
        out.dx = dx.values();
        if (c.weight) out.dw = dw.to_vector<double>();
        if (c.bias) out.db = db.to_vector<double>();
        return out;
    }
};

Results run_gpu(const Case& c, const Inputs& in, const Path& p) {
    Call call(c, in);
    call.forward(p);
    call.backward(p);
    return call.results();
}

// ||got - want|| / max(||want||, scale) <= tol, in float64. `scale`: dx subtracts terms of size
// |w' dy rstd| that may nearly cancel (RMSNorm of N = 1: dx = g (1 - x_hat^2) rstd, x_hat = +-1),
// and any fp32 implementation is accurate only relative to them. A NaN in `got` (a poisoned
// element never written) fails.
void compare(const char* what, const std::vector<double>& got, const std::vector<double>& want,
             double tol, double scale = 0.0) {
    INFO(what);
    REQUIRE(got.size() == want.size());
    double num = 0.0, den = 0.0;
    std::size_t nans = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        nans += std::isnan(got[i]) ? 1 : 0;
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    REQUIRE(nans == 0);
    const double norm = std::max(std::sqrt(den), scale);
    CHECK(std::sqrt(num) / (norm > 0.0 ? norm : 1.0) <= tol);
}

// Tolerances (norm-wise) for an output stored in f32, and for one stored in each 16-bit type.
struct Tolerance {
    double f32, bf16, f16;
    double of(DType t) const { return t == DType::f32 ? f32 : t == DType::bf16 ? bf16 : f16; }
};
// Against float64: fp32 accumulation, then one rounding to the stored type (about 2 and 3 units
// of bf16's and f16's rounding; as test_gpu_norm.cpp).
constexpr Tolerance kAgainstFloat64{2e-5, 8e-3, 1.5e-3};
// Tuned against reference version 2: both in fp32, in different orders, so a 16-bit result may
// round the other way, one step of the type apart: 2^-7 (bf16), 2^-10 (f16) of the value at most.
constexpr Tolerance kAgainstReference{2e-5, 0x1p-7, 0x1p-10};

void compare_results(const Case& c, const Results& got, const Results& want,
                     const Tolerance& tol, double dx_scale) {
    const double tx = tol.of(c.x_type), tw = tol.of(c.w_type);
    compare("h", got.h, want.h, tx);
    compare("y", got.y, want.y, tx);
    compare("mean", got.mean, want.mean, tol.f32);
    compare("rstd", got.rstd, want.rstd, tol.f32);
    compare("dx", got.dx, want.dx, tx, dx_scale);
    compare("dweight", got.dw, want.dw, tw);
    compare("dbias", got.db, want.db, tw);
}

const std::vector<std::pair<std::int64_t, std::int64_t>> kShapes{
    {1, 1}, {37, 7}, {45, 33}, {199, 385}, {64, 769}, {16, 4097}, {4, 8192}, {2500, 384}};
const float kEps[] = {1e-6f, 1e-5f, 1e-2f};

// Every case of one kind: x / weight types, all 64 option sets, each at two shapes (rotating so
// that every option set meets different shapes under each type), eps cycling.
template <typename F>
void for_each_case(NormKind kind, F&& check) {
    int k = 0;
    for (DType xt : {DType::f32, DType::bf16, DType::f16}) {
        for (DType wt : {DType::f32, xt}) {
            for (int bits = 0; bits < 64; ++bits) {
                for (int shape : {0, 3}) {
                    const auto [m, n] = kShapes[(bits + shape + k) % kShapes.size()];
                    const Case c{kind, xt, wt, (bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0,
                                 (bits & 8) != 0, (bits & 16) != 0, (bits & 32) != 0,
                                 kEps[(bits + k) % 3], m, n};
                    INFO(c.describe());
                    check(c);
                }
            }
            ++k;
            if (xt == DType::f32) break;  // one weight type for f32
        }
    }
}

// Every version against float64; versions 3-5 (vectors, registers, the two dw / db strategies)
// also against version 2, the rung below them that sums in the plainest order.
void check_reference_versions(NormKind kind) {
    REQUIRE(cuda_is_available());
    for_each_case(kind, [](const Case& c) {
        const Inputs in = make_inputs(c);
        const Results want = float64_reference(c, in);
        const Results version2 = run_gpu(c, in, Path{2});
        for (int version = 1; version <= kernels::kNormReferenceVersions; ++version) {
            INFO("reference version " << version);
            const Results got = version == 2 ? version2 : run_gpu(c, in, Path{version});
            compare_results(c, got, want, kAgainstFloat64, want.dx_scale);
            if (version >= 3)
                compare_results(c, got, version2, kAgainstReference, want.dx_scale);
        }
    });
}

// The tuned kernels' defaults, and tunings forcing their other paths (as test_gpu_norm.cpp's
// "results do not depend on the tuning knobs"): 0, no staging (register kernels); 1, every row
// looped (256 threads x 2 vectors), run-time threads a row, no cluster split, the column kernel
// adding the partial rows; 2, every row staged (3 stages of 8 KiB), split over 4 blocks, the
// affine case read at run time; 3, every row looped (1024 x 4), 4 stages of 16 KiB, small
// persistent grids.
std::vector<std::pair<std::string, NormTuning>> forced_tunings() {
    std::vector<std::pair<std::string, NormTuning>> out;
    const char* names[] = {"registers", "looped 256x2", "staged, split 4", "looped 1024x4"};
    for (int t : {0, 1, 2, 3}) {
        NormTuning k;
        k.prefetch_distance = t == 0 ? 0 : t == 1 ? 3 : 1;
        k.grid_threads_per_sm = t == 3 ? 256 : 2048;
        k.forward_elems = t == 2 ? 16 : t == 3 ? 4 : 32;
        k.backward_elems = t == 2 ? 8 : t == 3 ? 4 : 16;
        k.stage_bytes = t == 0 ? 0 : t == 2 ? 8 * 1024 : t == 3 ? 16 * 1024 : k.stage_bytes;
        k.stages = t == 2 ? 3 : t == 3 ? 4 : NormTuning::kAuto;
        k.split_blocks = t == 1 ? 1 : t == 2 ? 4 : NormTuning::kAuto;
        k.forward_stage_cols = t >= 2 ? 1 : NormTuning::kAuto;
        if (t == 2) k.forward_loop_cols = NormTuning::kNever;
        k.forward_row_vectors = t == 0 ? 4 : t == 2 ? 8 : NormTuning::kAuto;
        k.forward_fixed_rows = t == 1 ? 0 : 1;
        k.usual_affine = t == 2 ? 0 : 1;
        k.grid_column_sums = t == 1 ? 0 : 1;
        if (t == 1 || t == 3) {
            k.forward_loop_cols = 1;
            k.forward_loop_threads = t == 1 ? 256 : 1024;
            k.forward_loop_vectors = t == 1 ? 2 : 4;
            k.forward_loop_batch = t == 1 ? 1 : 2;
        }
        out.emplace_back(names[t], k);
    }
    return out;
}

void check_tuned_against_reference(NormKind kind) {
    REQUIRE(cuda_is_available());
    const auto tunings = forced_tunings();
    for_each_case(kind, [&](const Case& c) {
        const Inputs in = make_inputs(c);
        const double dx_scale = float64_reference(c, in).dx_scale;
        const Results want = run_gpu(c, in, Path{2});
        for (NormReduction red : {NormReduction::grid, NormReduction::locked}) {
            INFO("reduction " << kernels::norm_reduction_name(red));
            {
                INFO("tuning: defaults");
                compare_results(c, run_gpu(c, in, Path{0, red}), want, kAgainstReference,
                                dx_scale);
            }
            for (const auto& [name, tuning] : tunings) {
                INFO("tuning: " << name);
                compare_results(c, run_gpu(c, in, Path{0, red, &tuning}), want,
                                kAgainstReference, dx_scale);
            }
        }
    });
}

}  // namespace

TEST_CASE("norm reference versions against float64 and version 2: rmsnorm",
          "[gpu][norm_reference]") {
    check_reference_versions(NormKind::rms);
}
TEST_CASE("norm reference versions against float64 and version 2: layernorm",
          "[gpu][norm_reference]") {
    check_reference_versions(NormKind::layer);
}
TEST_CASE("tuned norm kernels against reference version 2: rmsnorm", "[gpu][norm_reference]") {
    check_tuned_against_reference(NormKind::rms);
}
TEST_CASE("tuned norm kernels against reference version 2: layernorm", "[gpu][norm_reference]") {
    check_tuned_against_reference(NormKind::layer);
}

TEST_CASE("norm reference: empty shapes, no statistics, bad versions", "[gpu][norm_reference]") {
    REQUIRE(cuda_is_available());
    kernels::NormForwardArgs f;
    kernels::NormBackwardArgs b;
    REQUIRE_THROWS_AS(kernels::norm_forward_reference(f, 0), std::invalid_argument);
    REQUIRE_THROWS_AS(kernels::norm_forward_reference(f, 6), std::invalid_argument);
    REQUIRE_THROWS_AS(kernels::norm_backward_reference(b, 6), std::invalid_argument);
    // Versions 3-5 hold a row in registers: at most 4096 16-byte vectors (32768 bf16 values).
    f.x_type = kernels::ScalarType::bf16;
    f.rows = 1;
    f.cols = 32769;
    REQUIRE_THROWS_WITH(kernels::norm_forward_reference(f, 3),
                        ContainsSubstring("at most 32768 values a row"));
    // Versions 4 and 5 also keep two sums a column: at most 16 columns a thread.
    kernels::NormBackwardArgs long_row;
    long_row.rows = 1;
    long_row.cols = 8196;
    REQUIRE_THROWS_WITH(kernels::norm_backward_reference(long_row, 5),
                        ContainsSubstring("rows of at most 8192 values, got 8196"));
    // Versions 4 and 5 sum dw / db through a workspace, which they must be given.
    b.rows = 4;
    b.cols = 8;
    float dw[8];
    b.dweight = dw;
    REQUIRE_THROWS_WITH(kernels::norm_backward_reference(b, 4),
                        ContainsSubstring("need a workspace"));
    std::vector<Path> paths{Path{0, NormReduction::grid}, Path{0, NormReduction::locked}};
    for (int version = 1; version <= kernels::kNormReferenceVersions; ++version)
        paths.push_back(Path{version});
    for (const Path& p : paths) {
        INFO("version " << p.version << " (0: tuned), reduction "
                        << kernels::norm_reduction_name(p.reduction));
        {  // No rows: dw and db are zeroed.
            const Case c{NormKind::layer, DType::bf16, DType::f32, true, true, false, false,
                         false, false, 1e-5f, 0, 5};
            Call call(c, make_inputs(c));
            call.forward(p);
            call.backward(p);
            for (double v : call.dw.to_vector<double>()) REQUIRE(v == 0.0);
            for (double v : call.db.to_vector<double>()) REQUIRE(v == 0.0);
        }
        {  // No columns: nothing to do.
            const Case c{NormKind::rms, DType::f32, DType::f32, true, false, false, false, false,
                         false, 1e-5f, 3, 0};
            Call call(c, make_inputs(c));
            call.forward(p);
            call.backward(p);
            kernels::synchronize();
        }
        // The forward without statistics (mean and rstd null) computes the same y and h.
        for (NormKind kind : {NormKind::rms, NormKind::layer}) {
            const Case c{kind, DType::bf16, DType::bf16, true, true, true, false, false, false,
                         1e-5f, 37, 1000};
            INFO(c.describe());
            const Inputs in = make_inputs(c);
            const Results want = float64_reference(c, in);
            Call call(c, in);
            call.f.mean = call.f.rstd = nullptr;
            call.forward(p);
            compare("h", call.h.values(), want.h, kAgainstFloat64.bf16);
            compare("y", call.y.values(), want.y, kAgainstFloat64.bf16);
        }
    }
}

TEST_CASE("norm reference version 4: the locks under contention, against version 5",
          "[gpu][norm_reference]") {
    // Many more row groups than SMs: every lock is taken by several blocks, whose adds land in
    // any order. Version 4's dw / db stay within fp32 reordering of version 5's (deterministic:
    // the same bits every run), over repeated runs.
    REQUIRE(cuda_is_available());
    for (auto [m, n, xt] : {std::tuple{20000, 384, DType::bf16}, std::tuple{6000, 769, DType::f32},
                            std::tuple{3000, 4096, DType::bf16}}) {
        const Case c{NormKind::layer, xt, DType::f32, true, true, false, false, false, false,
                     1e-5f, m, n};
        INFO(c.describe());
        const Inputs in = make_inputs(c);
        const Results grid = run_gpu(c, in, Path{5});
        const Results again = run_gpu(c, in, Path{5});
        CHECK(again.dw == grid.dw);  // version 5: bitwise the same
        CHECK(again.db == grid.db);
        for (int repeat = 0; repeat < 10; ++repeat) {
            const Results locked = run_gpu(c, in, Path{4});
            compare("dweight", locked.dw, grid.dw, 2e-6);
            compare("dbias", locked.db, grid.db, 2e-6);
        }
    }
}
