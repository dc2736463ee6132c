// tests/gpu/test_gpu_ops.cpp: every CUDA op, forward and backward, against the CPU reference
// computed in float64, on odd sizes (1, 7, 33, 1000, 4097 columns), with new tensors poisoned so an
// unwritten element fails. Also: cuBLASLt's 16-bit products (the linear and MLP epilogues, the
// tanh GELU they compute, heuristic and autotuned algorithms), TF32, column sums, widen_scale,
// the cross-entropy's non-finite rows, Philox identical on both sides, the caching allocator's
// steady state, device-side index errors, deterministic backwards. Labelled `gpu`; needs a CUDA
// device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/allocator.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops/op_utils.h"
#include "kernels/linear_lt.h"
#include "../test_helpers.h"

using namespace fg;
using test::random_f32;
using test::rel_error;

namespace {

const std::vector<std::int64_t> kCols{1, 7, 33, 1000, 4097};
const std::vector<std::int64_t> kRows{1, 3, 37};

void require_gpu() {
    REQUIRE(cuda_is_available());
    static bool printed = false;
    if (!printed) {
        std::printf("gpu tests on %s\n", cuda_backend("test").device_info().name.c_str());
        printed = true;
    }
}

Tensor to_reference(const Tensor& t) {
    Tensor r = is_floating(t.dtype()) ? t.to(DType::f64) : t;
    if (is_floating(t.dtype())) r = r.detach().set_requires_grad(true);
    return r;
}

Tensor to_gpu(const Tensor& t) {
    Tensor g = t.to(Device::cuda);
    if (is_floating(t.dtype())) g = g.detach().set_requires_grad(true);
    return g;
}

// Runs fn on f64 CPU copies and on f32 CUDA copies of `inputs` (f32 or i32 CPU tensors), then
// compares the outputs and the gradients of sum(out * w) for a random w.
void check_against_cpu(const std::string& what, const test::OpFn& fn,
                       const std::vector<Tensor>& inputs, double tol = 2e-6) {
    INFO(what);
    std::vector<Tensor> ref_in, gpu_in;
    for (const Tensor& t : inputs) {
        ref_in.push_back(to_reference(t));
        gpu_in.push_back(to_gpu(t));
    }
    Tensor ref_out = fn(ref_in);
    Tensor gpu_out = fn(gpu_in);
    REQUIRE(gpu_out.is_cuda());
    REQUIRE(gpu_out.shape() == ref_out.shape());
    CHECK(rel_error(gpu_out.to_vector<double>(), ref_out.to_vector<double>()) <= tol);
    Tensor w = random_f32(ref_out.shape());
    sum(mul(ref_out, w.to(DType::f64))).backward();
    sum(mul(gpu_out, w.to(Device::cuda))).backward();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!is_floating(inputs[i].dtype())) continue;
        INFO("gradient of input " << i);
        REQUIRE(gpu_in[i].grad().defined());
        REQUIRE(gpu_in[i].grad().is_cuda());
        CHECK(rel_error(gpu_in[i].grad().to_vector<double>(), ref_in[i].grad().to_vector<double>()) <=
              tol);
    }
}

std::string size_name(std::int64_t rows, std::int64_t cols) {
    return std::to_string(rows) + " x " + std::to_string(cols);
}

}  // namespace

TEST_CASE("elementwise ops and broadcasting match the CPU", "[gpu]") {
    require_gpu();
    for (std::int64_t rows : kRows) {
        for (std::int64_t cols : kCols) {
            std::string s = size_name(rows, cols);
            Tensor a = random_f32({rows, cols}), b = random_f32({rows, cols});
            Tensor bias = random_f32({cols}), row = random_f32({rows, 1}), scalar = random_f32({});
            check_against_cpu("add " + s, [](auto& in) { return add(in[0], in[1]); }, {a, b});
            check_against_cpu("sub bias " + s, [](auto& in) { return sub(in[0], in[1]); }, {a, bias});
            check_against_cpu("mul row " + s, [](auto& in) { return mul(in[0], in[1]); }, {a, row});
            check_against_cpu("mul scalar " + s, [](auto& in) { return mul(in[1], in[0]); },
                              {a, scalar}, 1e-5);  // its gradient is a sum over every element
            check_against_cpu("scale " + s, [](auto& in) { return scale(in[0], 0.3); }, {a});
            check_against_cpu("gelu " + s, [](auto& in) { return gelu(in[0]); }, {a}, 1e-5);
            check_against_cpu("gelu tanh " + s,
                              [](auto& in) { return gelu(in[0], GeluForm::tanh); }, {a}, 1e-5);
            check_against_cpu("rsqrt " + s,
                              [](auto& in) { return rsqrt(add(mul(in[0], in[0]), in[1])); },
                              {a, Tensor::full({}, 0.5)}, 1e-5);
        }
    }
}

TEST_CASE("add_ accumulates in place", "[gpu]") {
    require_gpu();
    Tensor a = random_f32({4097}), b = random_f32({4097});
    std::vector<double> want = add(a, b).to_vector<double>();
    Tensor g = a.to(Device::cuda);
    add_(g, b.to(Device::cuda));
    REQUIRE(rel_error(g.to_vector<double>(), want) == 0.0);
}

TEST_CASE("dropout draws the same mask on CPU and GPU", "[gpu]") {
    require_gpu();
    for (std::int64_t n : {1, 7, 33, 1000, 4097, 1 << 20}) {
        Tensor x = random_f32({n});
        default_generator().set_state(21, 1000);
        Tensor cpu = dropout(x, 0.2);
        default_generator().set_state(21, 1000);
        Tensor gpu = dropout(x.to(Device::cuda), 0.2);
        REQUIRE(gpu.to_vector<float>() == cpu.to_vector<float>());
    }
    check_against_cpu("dropout backward",
                      [](auto& in) {
                          default_generator().set_state(4, 0);
                          return dropout(in[0], 0.5);
                      },
                      {random_f32({37, 1000})});
}

TEST_CASE("reductions match the CPU", "[gpu]") {
    require_gpu();
    for (std::int64_t rows : kRows) {
        for (std::int64_t cols : kCols) {
            std::string s = size_name(rows, cols);
            // Mean 1, so the sums do not cancel to near zero (relative error stays meaningful).
            Tensor x = add(random_f32({rows, cols}), Tensor::ones({}));
            check_against_cpu("sum " + s, [](auto& in) { return sum(in[0]); }, {x}, 1e-5);
            check_against_cpu("mean " + s, [](auto& in) { return mean(in[0]); }, {x}, 1e-5);
            check_against_cpu("sum_last " + s, [](auto& in) { return sum_last(in[0]); }, {x}, 1e-5);
            check_against_cpu("mean_last " + s, [](auto& in) { return mean_last(in[0]); }, {x},
                              1e-5);
            // Column sums (the bias gradient) with many rows.
            Tensor tall = random_f32({rows * 300, cols});
            check_against_cpu("bias add " + s, [](auto& in) { return add(in[0], in[1]); },
                              {tall, random_f32({cols})}, 1e-5);
        }
    }
    // A long sum keeps its accuracy (fp32 accumulation in a tree, not in sequence).
    Tensor big = random_f32({1 << 24});
    double ref = sum(big.to(DType::f64)).item();
    REQUIRE(std::fabs(sum(big.to(Device::cuda)).item() - ref) <= 1e-5 * std::sqrt(1 << 24));
}

TEST_CASE("column sums: vector and scalar loads agree bit for bit, 16-bit sums round the f32 one",
          "[gpu]") {
    // The column sum (the bias gradient) loads 4 columns at a time where the rows are aligned
    // for it and one at a time where not, with the same additions in the same order, for every
    // storage type: so a sum over a misaligned view equals the sum over an aligned copy, and a
    // bf16 / f16 sum is the f32 sum of the widened values, rounded once.
    require_gpu();
    for (std::int64_t cols : {2, 3, 4, 7, 768, 1000}) {
        for (std::int64_t rows : {1, 37, 16384}) {
            INFO(size_name(rows, cols));
            const std::int64_t n = rows * cols;
            Tensor flat = random_f32({n + 1}, Device::cuda);
            Tensor shifted = flat.slice(1, n + 1).reshape({rows, cols});  // 4 bytes off alignment
            Tensor aligned =
                flat.slice(1, n + 1).to(Device::cpu).to(Device::cuda).reshape({rows, cols});
            std::vector<double> a = ops_detail::sum_to(shifted, {cols}).to_vector<double>();
            std::vector<double> b = ops_detail::sum_to(aligned, {cols}).to_vector<double>();
            CHECK(a == b);
            Tensor aligned64 = aligned.to(Device::cpu).to(DType::f64);
            std::vector<double> ref = ops_detail::sum_to(aligned64, {cols}).to_vector<double>();
            CHECK(rel_error(b, ref) <= 1e-5);
            for (DType dtype : {DType::bf16, DType::f16}) {
                INFO(dtype_name(dtype));
                Tensor x16 = cast(aligned, dtype);
                Tensor want = cast(ops_detail::sum_to(cast(x16, DType::f32), {cols}), dtype);
                CHECK(ops_detail::sum_to(x16, {cols}).to_vector<double>() ==
                      want.to_vector<double>());
            }
        }
    }
}

// Before the linear test below: linear_epilogue_failure() keeps the process's first refusal, and
// that test's last case may be refused.
TEST_CASE("16-bit MLP with the tanh GELU in cuBLASLt's epilogues is close to float64", "[gpu]") {
    // mlp() with the tanh GELU on bf16 / f16 CUDA inputs (f32 parameters, biases) takes c_fc's
    // GELU and its input from c_fc's product's epilogue, and in the backward GELU's derivative
    // from the epilogue of the product through c_proj's weight (core/ops/linear.cpp). Against
    // float64 on the CPU from the same rounded inputs, beside the GPU composition (linear, gelu,
    // linear: the plain path) against the same reference. y and dx pass through two 16-bit
    // intermediates (a = gelu(pre), and pre itself or its gradient), so they are held to 3
    // roundings; the f32 parameter gradients, built from one 16-bit intermediate, to 2.
    require_gpu();
    struct Case {
        std::int64_t m, c, h, n;
    };
    for (Case s : {Case{64, 768, 3072, 768}, Case{37, 64, 256, 64}}) {
        for (DType dtype : {DType::bf16, DType::f16}) {
            const double u = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
            INFO(dtype_name(dtype) << " m " << s.m << " c " << s.c << " h " << s.h << " n " << s.n);
            Tensor x = random_f32({s.m, s.c}).to(dtype);
            Tensor w1 = random_f32({s.h, s.c}, Device::cpu, 0.05f), b1 = random_f32({s.h});
            Tensor w2 = random_f32({s.n, s.h}, Device::cpu, 0.05f), b2 = random_f32({s.n});
            Tensor g = random_f32({s.m, s.n}).to(dtype);
            std::vector<Tensor> ref_in;
            for (const Tensor& t : {x, cast(w1, dtype), cast(b1, dtype), cast(w2, dtype), cast(b2, dtype)})
                ref_in.push_back(t.to(DType::f64).detach().set_requires_grad(true));
            Tensor ry = linear(gelu(linear(ref_in[0], ref_in[1], ref_in[2]), GeluForm::tanh),
                               ref_in[3], ref_in[4]);
            ry.backward(g.to(DType::f64));
            for (int variant = 0; variant < 3; ++variant) {
                // The fused op with the heuristic's algorithms, the same autotuned (whose timing
                // launches write the GELU's auxiliary matrix and read it again), the composition.
                const bool fused = variant < 2;
                const MatmulOptions options{false, variant == 1};
                INFO((fused ? "fused" : "composition") << (options.autotune ? ", autotuned" : ""));
                std::vector<Tensor> in;
                for (const Tensor& t : {x, w1, b1, w2, b2})
                    in.push_back(t.to(Device::cuda).detach().set_requires_grad(true));
                Tensor y = fused ? mlp(in[0], in[1], in[2], in[3], in[4], GeluForm::tanh, options)
                                 : linear(gelu(linear(in[0], in[1], in[2]), GeluForm::tanh), in[3],
                                          in[4]);
                REQUIRE(y.dtype() == dtype);
                // The fused op, not a composition behind the same name.
                REQUIRE(y.grad_fn());
                REQUIRE(y.grad_fn()->name() == (fused ? "mlp" : "linear"));
                y.backward(g.to(Device::cuda));
                REQUIRE(linear_epilogue_failure().empty());  // every epilogue taken
                const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2"};
                const double tols[] = {3 * u, 3 * u, 2 * u, 2 * u, 2 * u, 2 * u};
                std::vector<double> errors{
                    rel_error(y.to_vector<double>(), ry.to_vector<double>())};
                for (int i = 0; i < 5; ++i)
                    errors.push_back(rel_error(in[i].grad().to_vector<double>(),
                                               ref_in[i].grad().to_vector<double>()));
                for (int i = 0; i < 6; ++i) {
                    INFO(names[i] << ": " << errors[i] / u << " u");
                    CHECK(errors[i] <= tols[i]);
                }
                std::printf("%s mlp %s %lld x %lld x %lld, errors in u (y dx dw1 db1 dw2 db2):",
                            variant == 0 ? "fused" : variant == 1 ? "fused, autotuned" : "composed",
                            dtype_name(dtype), (long long)s.m,
                            (long long)s.c, (long long)s.h);
                for (double e : errors) std::printf(" %.3f", e / u);
                std::printf("\n");
            }
        }
    }
}

TEST_CASE("the fused MLP's epilogues compute the tanh GELU, not the exact one", "[gpu]") {
    // The whole-tensor errors above cannot tell the two forms apart (they differ by a few 1e-4
    // at most). Here both weights are the identity and the biases zero, so y = gelu(x) and
    // dx = g * gelu'(x) element for element, over x in [-3.5, -2] where the forms differ by
    // 2.8-24% of the value. The coefficient s of (y - tanh form) along (exact - tanh) over all
    // those elements is 0 for the tanh form and 1 for the exact one, whatever random rounding
    // or approximation error each element carries.
    require_gpu();
    const std::int64_t c = 64, m = 32;
    std::vector<float> xs(static_cast<std::size_t>(m * c));
    for (std::size_t i = 0; i < xs.size(); ++i)
        xs[i] = -3.5f + 1.5f * static_cast<float>(i) / static_cast<float>(xs.size() - 1);
    Tensor x = Tensor::from_vector(xs, {m, c}).to(DType::f16);
    std::vector<float> eye(static_cast<std::size_t>(c * c), 0.0f);
    for (std::int64_t i = 0; i < c; ++i) eye[static_cast<std::size_t>(i * c + i)] = 1.0f;
    Tensor w = Tensor::from_vector(eye, {c, c}), b = Tensor::zeros({c});
    Tensor g = random_f32({m, c}).to(DType::f16);
    Tensor gx = x.to(Device::cuda).detach().set_requires_grad(true);
    Tensor y = mlp(gx, w.to(Device::cuda), b.to(Device::cuda), w.to(Device::cuda),
                   b.to(Device::cuda), GeluForm::tanh);
    REQUIRE(y.grad_fn()->name() == "mlp");
    y.backward(g.to(Device::cuda));
    REQUIRE(linear_epilogue_failure().empty());
    Tensor rx = x.to(DType::f64);
    for (bool gradient : {false, true}) {
        INFO((gradient ? "gradient" : "value"));
        auto form = [&](GeluForm f) {
            Tensor leaf = rx.detach().set_requires_grad(true);
            Tensor out = gelu(leaf, f);
            if (!gradient) return out.to_vector<double>();
            out.backward(g.to(DType::f64));
            return leaf.grad().to_vector<double>();
        };
        std::vector<double> got = (gradient ? gx.grad() : y).to_vector<double>();
        std::vector<double> tanh_form = form(GeluForm::tanh), exact = form(GeluForm::exact);
        double along = 0.0, norm2 = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            along += (got[i] - tanh_form[i]) * (exact[i] - tanh_form[i]);
            norm2 += (exact[i] - tanh_form[i]) * (exact[i] - tanh_form[i]);
        }
        const double s = along / norm2;
        std::printf("fused MLP's GELU %s: coefficient along exact - tanh %.3f\n",
                    gradient ? "gradient" : "value", s);
        CHECK(std::fabs(s) < 0.3);
    }
}

TEST_CASE("16-bit linear with cuBLASLt's bias epilogues is close to float64", "[gpu]") {
    // linear() on bf16 / f16 CUDA inputs with f32 parameters and a bias runs one product with the
    // bias in its epilogue, and its backward writes the f32 weight gradient from one product and
    // sums the f32 bias gradient from dy's 16-bit values (core/ops/linear.cpp). Against float64 on the CPU from the same rounded
    // values: y and dx within a rounding of their 16-bit type, dw and db (f32, never rounded to 16
    // bits) within fp32 accumulation's error. GPT-2's shapes and small ones must take the
    // epilogues (no refusal); a row of 7 values (14 bytes, no aligned rows) may be refused, and
    // then runs the composition, whose dw and db are rounded to 16 bits once. Each case twice: the
    // heuristic's algorithms, then autotuned ones (MatmulOptions::autotune).
    require_gpu();
    struct Case {
        std::int64_t m, k, n;
        bool must_fuse;
    };
    // The cases that must take the epilogues first: a refusal is remembered for the process.
    for (Case c : {Case{64, 768, 2304, true}, Case{64, 3072, 768, true}, Case{37, 64, 96, true},
                   Case{33, 7, 5, false}}) {
        for (int run = 0; run < 4; ++run) {
            // bf16, f16; the heuristic's algorithms, then autotuned ones.
            const DType dtype = run % 2 == 0 ? DType::bf16 : DType::f16;
            const MatmulOptions options{false, run >= 2};
            const double u = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
            INFO(dtype_name(dtype) << " m " << c.m << " k " << c.k << " n " << c.n << " autotune "
                                   << options.autotune);
            Tensor x = random_f32({c.m, c.k}).to(dtype);
            Tensor w = random_f32({c.n, c.k}, Device::cpu, 0.1f);
            Tensor b = random_f32({c.n});
            Tensor g = random_f32({c.m, c.n}).to(dtype);
            Tensor gx = x.to(Device::cuda).detach().set_requires_grad(true);
            Tensor gw = w.to(Device::cuda).detach().set_requires_grad(true);
            Tensor gb = b.to(Device::cuda).detach().set_requires_grad(true);
            Tensor y = linear(gx, gw, gb, options);
            REQUIRE(y.dtype() == dtype);
            if (c.must_fuse) REQUIRE(linear_epilogue_failure().empty());
            y.backward(g.to(Device::cuda));
            REQUIRE(gw.grad().dtype() == DType::f32);
            // float64 from the values the GPU used: x, g and the parameters rounded to dtype.
            Tensor rx = x.to(DType::f64).detach().set_requires_grad(true);
            Tensor rw = cast(w, dtype).to(DType::f64).detach().set_requires_grad(true);
            Tensor rb = cast(b, dtype).to(DType::f64).detach().set_requires_grad(true);
            Tensor ry = add(matmul(rx, rw, false, true), rb);
            ry.backward(g.to(DType::f64));
            CHECK(rel_error(y.to_vector<double>(), ry.to_vector<double>()) <= u);
            CHECK(rel_error(gx.grad().to_vector<double>(), rx.grad().to_vector<double>()) <= u);
            // Where the forward was refused, the composition's 16-bit dw and db (one rounding).
            const double param_tol = linear_epilogue_failure().empty() ? 1e-5 : u;
            CHECK(rel_error(gw.grad().to_vector<double>(), rw.grad().to_vector<double>()) <=
                  param_tol);
            CHECK(rel_error(gb.grad().to_vector<double>(), rb.grad().to_vector<double>()) <=
                  param_tol);
        }
    }
}

TEST_CASE("matmul matches the CPU in every layout", "[gpu]") {
    require_gpu();
    for (std::int64_t n : kCols) {
        std::int64_t m = 37, k = n == 4097 ? 65 : 33;
        for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
                std::string s = "m 37 n " + std::to_string(n) + " ta " + std::to_string(ta) +
                                " tb " + std::to_string(tb);
                Tensor a = random_f32(ta ? Shape{k, m} : Shape{m, k});
                Tensor b = random_f32(tb ? Shape{n, k} : Shape{k, n});
                auto fn = [ta, tb](auto& in) { return matmul(in[0], in[1], ta, tb); };
                check_against_cpu("matmul " + s, fn, {a, b}, 1e-5);
                Tensor ab = random_f32(ta ? Shape{3, k, m} : Shape{3, m, k});
                Tensor bb = random_f32(tb ? Shape{3, n, k} : Shape{3, k, n});
                check_against_cpu("bmm " + s, fn, {ab, bb}, 1e-5);
            }
        }
        Tensor x = random_f32({2, 7, 33}), w = random_f32({n, 33});
        check_against_cpu("linear n " + std::to_string(n),
                          [](auto& in) { return matmul(in[0], in[1], false, true); }, {x, w}, 1e-5);
    }
}

TEST_CASE("TF32 matmul is close, asked per call, and off by default", "[gpu]") {
    require_gpu();
    Tensor a = random_f32({256, 512}), b = random_f32({512, 256});
    std::vector<double> ref = matmul(a.to(DType::f64), b.to(DType::f64)).to_vector<double>();
    Tensor ca = a.to(Device::cuda), cb = b.to(Device::cuda);
    double err = rel_error(matmul(ca, cb, false, false, {true}).to_vector<double>(), ref);
    double err32 = rel_error(matmul(ca, cb).to_vector<double>(), ref);
    CHECK(err < 5e-3);
    CHECK(err32 < 1e-6);
    CHECK(err > err32);  // TF32 really ran: its 10-bit mantissa shows
    // A call without the option right after one with it is plain fp32 again (nothing is left
    // set), and the backward's products follow the forward's option.
    Tensor x = ca.detach(), y = cb.detach();
    x.set_requires_grad(true);
    y.set_requires_grad(true);
    sum(matmul(x, y, false, false, {true})).backward();
    std::vector<double> da_tf32 = x.grad().to_vector<double>();
    CHECK(rel_error(matmul(ca, cb).to_vector<double>(), ref) == err32);
    x.zero_grad();
    sum(matmul(x, y)).backward();
    CHECK(rel_error(da_tf32, x.grad().to_vector<double>()) > 0);
}

TEST_CASE("16-bit products by cuBLASLt, heuristic or autotuned, are close to float64",
          "[gpu][autotune]") {
    // A single 16-bit product goes through cuBLASLt (kernels/linear_lt.h), with the heuristic's
    // first algorithm or, autotuned, the fastest of its first eight. Every layout, 16-bit and f32
    // outputs, against float64 from the same rounded inputs: kernels::gemm_lt called directly
    // (which must run, not refuse, where every row is 16-byte aligned: a layout it got wrong would
    // otherwise pass through matmul's cuBLAS fallback unseen), then matmul forward and backward
    // with the options. Shapes: GPT-2's widths, non-square ones (a swapped m / n / k or leading
    // dimension shows), odd ones (rows whose bytes are no multiple of 16: cuBLASLt may refuse them,
    // and cuBLAS runs them).
    require_gpu();
    struct Case {
        std::int64_t m, n, k;
    };
    for (DType dtype : {DType::bf16, DType::f16}) {
        const double u = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        const kernels::ScalarType type = ops_detail::scalar_type(dtype);
        for (Case c : {Case{64, 2304, 768}, Case{256, 768, 3072}, Case{96, 40, 24},
                       Case{37, 33, 65}, Case{7, 1, 33}}) {
            const bool aligned = c.m % 8 == 0 && c.n % 8 == 0 && c.k % 8 == 0;
            for (bool autotune : {false, true}) {
                const MatmulOptions options{false, autotune};
                for (bool ta : {false, true}) {
                    for (bool tb : {false, true}) {
                        INFO(dtype_name(dtype) << " m " << c.m << " n " << c.n << " k " << c.k
                                               << " ta " << ta << " tb " << tb << " autotune "
                                               << autotune);
                        Tensor a = random_f32(ta ? Shape{c.k, c.m} : Shape{c.m, c.k}).to(dtype);
                        Tensor b = random_f32(tb ? Shape{c.n, c.k} : Shape{c.k, c.n}).to(dtype);
                        Tensor g = random_f32({c.m, c.n}).to(dtype);
                        Tensor ra = a.to(DType::f64).detach().set_requires_grad(true);
                        Tensor rb = b.to(DType::f64).detach().set_requires_grad(true);
                        Tensor ry = matmul(ra, rb, ta, tb);
                        ry.backward(g.to(DType::f64));
                        const std::vector<double> want = ry.to_vector<double>();
                        Tensor ga = a.to(Device::cuda).detach().set_requires_grad(true);
                        Tensor gb = b.to(Device::cuda).detach().set_requires_grad(true);
                        for (bool f32_out : {false, true}) {
                            Tensor out = Tensor::empty({c.m, c.n}, f32_out ? DType::f32 : dtype,
                                                       Device::cuda);
                            const bool ran = kernels::gemm_lt(type, f32_out, ta, tb, c.m, c.n, c.k,
                                                              ga.raw_data(), gb.raw_data(),
                                                              out.raw_data(), autotune);
                            if (aligned) REQUIRE(ran);
                            // f32 out: fp32 accumulation over k up to 3072 (tensor cores may
                            // truncate its additions: ~1e-5 there), still far below a 16-bit
                            // rounding of the output.
                            if (ran)
                                CHECK(rel_error(out.to_vector<double>(), want) <=
                                      (f32_out ? 4e-5 : u));
                        }
                        Tensor y = matmul(ga, gb, ta, tb, options);
                        y.backward(g.to(Device::cuda));
                        CHECK(rel_error(y.to_vector<double>(), want) <= u);
                        CHECK(rel_error(ga.grad().to_vector<double>(),
                                        ra.grad().to_vector<double>()) <= u);
                        CHECK(rel_error(gb.grad().to_vector<double>(),
                                        rb.grad().to_vector<double>()) <= u);
                    }
                }
            }
        }
    }
}

TEST_CASE("softmax and cross-entropy match the CPU", "[gpu]") {
    require_gpu();
    for (std::int64_t cols : kCols) {
        for (std::int64_t rows : kRows) {
            std::string s = size_name(rows, cols);
            Tensor x = random_f32({rows, cols}, Device::cpu, 3.0f);
            check_against_cpu("softmax " + s, [](auto& in) { return softmax(in[0]); }, {x}, 1e-5);
            Tensor targets = randint({rows}, static_cast<std::int32_t>(cols));
            check_against_cpu("cross_entropy " + s,
                              [](auto& in) { return cross_entropy(in[0], in[1]); }, {x, targets},
                              1e-5);
            std::vector<std::int32_t> t = targets.to_vector<std::int32_t>();
            t[0] = -1;
            if (rows > 1)
                check_against_cpu("cross_entropy ignore " + s,
                                  [](auto& in) { return cross_entropy(in[0], in[1]); },
                                  {x, Tensor::from_vector(t, {rows})}, 1e-5);
        }
        if (cols <= 1000) {
            Tensor att = random_f32({2, 3, std::min<std::int64_t>(cols, 37), cols});
            check_against_cpu("causal softmax " + std::to_string(cols),
                              [](auto& in) { return softmax(in[0], true); }, {att}, 1e-5);
        }
    }
}

TEST_CASE("16-bit cross-entropy over long and misaligned rows is close to float64", "[gpu]") {
    // The kernels load 16 bytes at a time where a row allows it: rows of 7 and 33 bf16 / f16
    // values start at every offset from a 16-byte boundary, 4097 and 50257 leave a tail, 50304 is
    // GPT-2's padded vocabulary. The reference is float64 on the CPU from the same rounded
    // logits; a row with the ignored target must get a zero gradient.
    require_gpu();
    for (DType dtype : {DType::bf16, DType::f16}) {
        const double u = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        for (std::int64_t cols : {7, 33, 4097, 50257, 50304}) {
            const std::int64_t rows = 37;
            INFO(dtype_name(dtype) << " " << size_name(rows, cols));
            Tensor x = random_f32({rows, cols}, Device::cpu, 3.0f).to(dtype);
            std::vector<std::int32_t> t = randint({rows}, static_cast<std::int32_t>(cols))
                                              .to_vector<std::int32_t>();
            t[1] = -1;
            Tensor targets = Tensor::from_vector(t, {rows});
            Tensor ref_x = x.to(DType::f64).detach().set_requires_grad(true);
            Tensor gpu_x = x.to(Device::cuda).detach().set_requires_grad(true);
            Tensor ref_loss = cross_entropy(ref_x, targets);
            Tensor gpu_loss = cross_entropy(gpu_x, targets.to(Device::cuda));
            REQUIRE(gpu_loss.dtype() == DType::f32);
            CHECK(std::abs(gpu_loss.item() - ref_loss.item()) <= 1e-5 * std::abs(ref_loss.item()));
            ref_loss.backward();
            gpu_loss.backward();
            std::vector<double> grad = gpu_x.grad().to_vector<double>();
            CHECK(rel_error(grad, ref_x.grad().to_vector<double>()) <= u);
            bool ignored_row_zero = true;
            for (std::int64_t j = 0; j < cols; ++j) ignored_row_zero &= grad[cols + j] == 0.0;
            CHECK(ignored_row_zero);
        }
    }
}

TEST_CASE("a NaN, a +inf or a row of -inf logits makes the cross-entropy NaN, as on the CPU",
          "[gpu]") {
    // The GPU's one-pass maximum and sum (online softmax) against the CPU's two passes, on rows of
    // 7 (mostly one value at a time, off a 16-byte boundary) and GPT-2's padded vocabulary (16-byte
    // vectors).
    require_gpu();
    const double inf = std::numeric_limits<double>::infinity();
    for (DType dtype : {DType::f32, DType::bf16}) {
        for (std::int64_t cols : {7, 50304}) {
            for (int bad : {0, 1, 2}) {  // NaN at one column, +inf at one, the whole row -inf
                INFO(dtype_name(dtype) << " " << cols << " columns, bad input " << bad);
                std::vector<double> v = random_f32({4, cols}, Device::cpu, 3.0f).to_vector<double>();
                if (bad == 2)
                    for (std::int64_t j = 0; j < cols; ++j) v[2 * cols + j] = -inf;
                else
                    v[2 * cols + cols / 2] = bad == 0 ? std::nan("") : inf;
                Tensor x = Tensor::from_vector(v, {4, cols}).to(DType::f32).to(dtype);
                Tensor targets = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2, 3}, {4});
                CHECK(std::isnan(cross_entropy(x, targets).item()));
                CHECK(std::isnan(cross_entropy(x.to(Device::cuda), targets.to(Device::cuda)).item()));
            }
        }
    }
}

TEST_CASE("cross-entropy's gradient overwrites logits nothing else holds, on CUDA", "[gpu]") {
    require_gpu();
    test::check_loss_in_place(Device::cuda, DType::f32);
    test::check_loss_in_place(Device::cuda, DType::bf16);
}

namespace {

// "" where `bytes` of device memory at a and b are the same, else the first value that differs
// (its index and both values' bits in hex).
std::string first_difference(const void* a, const void* b, std::size_t bytes, DType dtype) {
    std::vector<unsigned char> va(bytes), vb(bytes);
    cuda_backend("test").copy_device_to_host(va.data(), a, bytes);
    cuda_backend("test").copy_device_to_host(vb.data(), b, bytes);
    const std::size_t size = dtype_size(dtype);
    for (std::size_t i = 0; i < bytes; i += size) {
        if (std::equal(va.begin() + i, va.begin() + i + size, vb.begin() + i)) continue;
        std::ostringstream out;
        out << "value " << i / size << ": " << std::hex;
        for (std::size_t k = size; k-- > 0;) out << static_cast<int>(va[i + k]) << ".";
        out << " against ";
        for (std::size_t k = size; k-- > 0;) out << static_cast<int>(vb[i + k]) << ".";
        return out.str();
    }
    return "";
}

}  // namespace

TEST_CASE("the one-pass cross-entropy (logits handed over) matches the two-pass one bit for bit",
          "[gpu]") {
    // logits = h w^T; the two-pass loss is given logits the caller keeps (which must stay as they
    // are), the one-pass loss the same logits moved in. With the loss's gradient as expected: the
    // same loss, the same bits in the logits' buffer right after the forward as the two-pass
    // backward's dlogits, the same h and w gradients. With another (3x), through the backward's
    // rescale: within 4 roundings of the type (rounded twice; f16's smallest gradients are
    // subnormal, with fewer bits). Rows of 7 and 33 start at every offset from a 16-byte
    // boundary; 4097 and 50257 leave a tail; 50304 is GPT-2's vocabulary.
    require_gpu();
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        const double u = dtype == DType::bf16   ? std::ldexp(1.0, -8)
                         : dtype == DType::f16 ? std::ldexp(1.0, -11)
                                               : std::ldexp(1.0, -23);
        for (std::int64_t cols : {7, 33, 4097, 50257, 50304}) {
            const std::int64_t rows = 37, inner = 16;
            INFO(dtype_name(dtype) << " " << size_name(rows, cols));
            Tensor h0 = random_f32({rows, inner}, Device::cuda, 1.0f).to(dtype);
            Tensor w0 = random_f32({cols, inner}, Device::cuda, 1.0f).to(dtype);
            std::vector<std::int32_t> t = randint({rows}, static_cast<std::int32_t>(cols))
                                              .to_vector<std::int32_t>();
            t[1] = -1;
            Tensor targets = Tensor::from_vector(t, {rows}).to(Device::cuda);
            for (float dloss : {0.25f, 0.75f}) {
                INFO("dloss " << dloss << ", expected 0.25");
                Tensor h[2], w[2], loss[2], kept;
                const void* after_at = nullptr;
                for (int one_pass = 0; one_pass < 2; ++one_pass) {
                    h[one_pass] = h0.detach().set_requires_grad(true);
                    w[one_pass] = w0.detach().set_requires_grad(true);
                    Tensor logits = matmul(h[one_pass], w[one_pass], false, true);
                    if (one_pass) {
                        const void* at = logits.raw_data();
                        const std::size_t bytes = logits.numel() * dtype_size(dtype);
                        loss[1] = cross_entropy(std::move(logits), targets, -1, 0.25f);
                        // The buffer, held by the loss's backward, now holds the gradient.
                        CHECK(first_difference(at, kept.raw_data(), bytes, dtype) == "");
                        after_at = at;
                    } else {
                        const std::vector<double> before = logits.to_vector<double>();
                        loss[0] = cross_entropy(logits, targets);
                        CHECK(logits.to_vector<double>() == before);  // kept: left as they were
                        // dlogits of the two-pass loss at 0.25, from the same logits as a leaf.
                        Tensor leaf = logits.detach().set_requires_grad(true);
                        scale(cross_entropy(leaf, targets), 0.25).backward();
                        kept = leaf.grad();
                    }
                    scale(loss[one_pass], dloss).backward();
                    if (one_pass && dloss == 0.25f)
                        CHECK(first_difference(after_at, kept.raw_data(),
                                               kept.numel() * dtype_size(dtype), dtype) == "");
                }
                CHECK(loss[1].item() == loss[0].item());
                for (int p = 0; p < 2; ++p) {
                    std::vector<double> a = (p ? w[1] : h[1]).grad().to_vector<double>();
                    std::vector<double> b = (p ? w[0] : h[0]).grad().to_vector<double>();
                    if (dloss == 0.25f)
                        CHECK(a == b);
                    else
                        CHECK(rel_error(a, b) <= 4 * u);
                }
            }
        }
    }
}

TEST_CASE("embedding matches the CPU and its backward is deterministic", "[gpu]") {
    require_gpu();
    for (std::int64_t dim : kCols) {
        Tensor w = random_f32({65, dim});
        Tensor ids = randint({3, 333}, 65);  // every id repeats many times
        check_against_cpu("embedding dim " + std::to_string(dim),
                          [](auto& in) { return embedding(in[0], in[1]); }, {w, ids}, 1e-6);
    }
    Tensor w = random_f32({50, 384}).to(Device::cuda).detach().set_requires_grad(true);
    Tensor ids = randint({8192}, 50, Device::cuda);
    Tensor g = random_f32({8192, 384}, Device::cuda);
    std::vector<float> first;
    for (int run = 0; run < 3; ++run) {
        w.zero_grad();
        embedding(w, ids).backward(g);
        std::vector<float> grad = w.grad().to_vector<float>();
        if (run == 0) first = grad;
        else REQUIRE(grad == first);
    }
}

TEST_CASE("layout ops and casts match the CPU", "[gpu]") {
    require_gpu();
    Tensor x = random_f32({3, 33, 4, 7});
    check_against_cpu("permute", [](auto& in) { return permute(in[0], {2, 0, 3, 1}); }, {x}, 0.0);
    check_against_cpu("transpose", [](auto& in) { return transpose(in[0], 1, 3); }, {x}, 0.0);
    check_against_cpu("slice", [](auto& in) { return slice(in[0], 1, 3); }, {x}, 0.0);
    check_against_cpu("reshape", [](auto& in) { return reshape(in[0], {99, -1}); }, {x}, 0.0);
    // The last dim kept: rows copied in 16-, 8- or 4-byte units (D = 64, 6, 2, 33), also from a
    // view whose start is not 16-byte aligned, and for 2-byte elements.
    for (std::int64_t d : {64, 6, 2, 33}) {
        Tensor qkv = random_f32({2, 5, 3, 4, d});
        check_against_cpu("qkv permute D " + std::to_string(d),
                          [](auto& in) { return permute(in[0], {2, 0, 3, 1, 4}); }, {qkv}, 0.0);
        Tensor odd = random_f32({2, 1, 3, 1, d});  // row 1 starts 3 * d floats in: 8-byte aligned
        check_against_cpu("permute of an offset view D " + std::to_string(d),
                          [](auto& in) { return permute(slice(in[0], 1, 2), {2, 0, 3, 1, 4}); },
                          {odd}, 0.0);
    }
    for (std::int64_t d : {3, 4, 8}) {
        Tensor x16 = random_f32({3, 5, d}).to(DType::bf16);
        Tensor on_gpu = permute(x16.to(Device::cuda), {1, 0, 2}).to(Device::cpu);
        REQUIRE(on_gpu.to_vector<double>() == permute(x16, {1, 0, 2}).to_vector<double>());
    }
    Tensor h = random_f32({2, 37, 4 * 33});
    check_against_cpu("heads", [](auto& in) { return merge_heads(gelu(split_heads(in[0], 4))); },
                      {h}, 1e-5);
    // Casts: the device conversions are the host's, bit for bit, four at a time from aligned
    // arrays and one at a time from a view one element off (and for the 4097th value).
    Tensor v = random_f32({4097}, Device::cpu, 100.0f);
    for (DType t : {DType::bf16, DType::f16, DType::i32}) {
        for (std::int64_t first : {0, 1}) {
            INFO("cast to " << dtype_name(t) << " from element " << first);
            Tensor on_gpu = cast(v.to(Device::cuda).slice(first, 4097), t);
            Tensor on_cpu = cast(v.slice(first, 4097), t);
            REQUIRE(on_gpu.to_vector<double>() == on_cpu.to_vector<double>());
            REQUIRE(cast(on_gpu.slice(first, on_gpu.size(0)), DType::f32).to_vector<float>() ==
                    cast(on_cpu.slice(first, on_cpu.size(0)), DType::f32).to_vector<float>());
        }
    }
    check_against_cpu("cast bf16 round trip",
                      [](auto& in) { return in[0].dtype() == DType::f64 ? in[0] :
                                     cast(cast(in[0], DType::bf16), DType::f32); },
                      {random_f32({1000})}, 1e-2);
}

TEST_CASE("widen_scale is cast then scale in one pass, bit for bit", "[gpu]") {
    // The ranks' gradient averaging (scale/grad_exchange.cpp): alpha * float(src) from f32, bf16
    // and f16 sums, four at a time from aligned buffers and one at a time from a view one element
    // off, against the two separate kernels it replaces; the output poisoned first.
    require_gpu();
    CudaBackend& cuda = cuda_backend("test");
    const float share = 1.0f / 3.0f;
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        const Tensor sums = cast(random_f32({4099}, Device::cpu, 50.0f), t).to(Device::cuda);
        for (std::int64_t first : {0, 1}) {
            INFO("from " << dtype_name(t) << ", element " << first);
            const Tensor src = sums.slice(first, 4099);
            const std::int64_t n = src.numel();
            const Tensor expected = scale(cast(src, DType::f32), share);
            Tensor got = Tensor::full({n}, std::nan(""), DType::f32, Device::cuda);
            cuda.widen_scale(src.raw_data(), ops_detail::scalar_type(t), share, got.data<float>(), n);
            REQUIRE(got.to_vector<float>() == expected.to_vector<float>());
        }
    }
    Tensor ids = Tensor::zeros({4}, DType::i32, Device::cuda);
    Tensor out = Tensor::zeros({4}, DType::f32, Device::cuda);
    REQUIRE_THROWS_WITH(cuda.widen_scale(ids.raw_data(), kernels::ScalarType::i32, share,
                                         out.data<float>(), 4),
                        ContainsSubstring("widen_scale takes f32, bf16 or f16 sources only"));
}

TEST_CASE("philox gives identical numbers on CPU and GPU", "[gpu][random]") {
    require_gpu();
    for (std::int64_t n : {1, 7, 4097, 1 << 20}) {
        Generator a(2026), b(2026);
        a.advance(12345);
        b.advance(12345);
        REQUIRE(randn({n}, Device::cuda, &a).to_vector<float>() ==
                randn({n}, Device::cpu, &b).to_vector<float>());
        REQUIRE(rand({n}, Device::cuda, &a).to_vector<float>() ==
                rand({n}, Device::cpu, &b).to_vector<float>());
        REQUIRE(bernoulli({n}, 0.1f, Device::cuda, &a).to_vector<float>() ==
                bernoulli({n}, 0.1f, Device::cpu, &b).to_vector<float>());
    }
}

TEST_CASE("the caching allocator reaches a steady state", "[gpu][allocator]") {
    require_gpu();
    Tensor w = random_f32({256, 256}, Device::cuda).detach().set_requires_grad(true);
    auto step = [&] {
        Tensor x = random_f32({64, 256}, Device::cuda);
        Tensor loss = mean(gelu(matmul(x, w, false, true)));
        loss.backward();
        w.zero_grad();
    };
    step();
    step();
    MemoryStats before = memory_stats(Device::cuda);
    for (int i = 0; i < 10; ++i) step();
    MemoryStats after = memory_stats(Device::cuda);
    REQUIRE(after.device_allocations == before.device_allocations);
    REQUIRE(after.cache_hits > before.cache_hits);
    REQUIRE(after.bytes_in_use == before.bytes_in_use);
    REQUIRE(after.peak_bytes_in_use >= after.bytes_in_use);
    empty_cuda_cache();
    REQUIRE(memory_stats(Device::cuda).bytes_reserved == memory_stats(Device::cuda).bytes_in_use);
}

TEST_CASE("bad indices found on the device become errors at the next sync", "[gpu][errors]") {
    require_gpu();
    Tensor w = random_f32({5, 8}, Device::cuda);
    Tensor ids = Tensor::from_vector(std::vector<std::int32_t>{1, 9, 2}, {3}, Device::cuda);
    Tensor out = embedding(w, ids);
    REQUIRE_THROWS_WITH(out.to_vector<float>(),
                        ContainsSubstring("[embedding] token id 9 is out of range [0, 5)"));
    REQUIRE_NOTHROW(embedding(w, Tensor::from_vector(std::vector<std::int32_t>{0}, {1},
                                                     Device::cuda)).to_vector<float>());
    Tensor logits = random_f32({2, 3}, Device::cuda);
    Tensor targets = Tensor::from_vector(std::vector<std::int32_t>{0, 3}, {2}, Device::cuda);
    REQUIRE_THROWS_WITH(cross_entropy(logits, targets).item(),
                        ContainsSubstring("[cross_entropy] target 3 is out of range [0, 3)"));
}

TEST_CASE("device and dtype mismatches are errors on CUDA too", "[gpu][errors]") {
    require_gpu();
    Tensor g = Tensor::zeros({4}, DType::f32, Device::cuda), c = Tensor::zeros({4});
    REQUIRE_THROWS_WITH(add(g, c), ContainsSubstring("[add] inputs on different devices: cuda and cpu"));
    // A layer's parameters left on the CPU (linear, and either layer of mlp).
    Tensor x = Tensor::zeros({2, 4}, DType::bf16, Device::cuda);
    Tensor w_gpu = Tensor::zeros({4, 4}, DType::f32, Device::cuda), w_cpu = Tensor::zeros({4, 4});
    Tensor b_gpu = Tensor::zeros({4}, DType::f32, Device::cuda);
    REQUIRE_THROWS_WITH(linear(x, w_cpu, b_gpu),
                        ContainsSubstring("[linear] inputs on different devices: cuda and cpu"));
    REQUIRE_THROWS_WITH(mlp(x, w_gpu, b_gpu, w_cpu, b_gpu, GeluForm::tanh),
                        ContainsSubstring("[mlp] inputs on different devices: cuda and cpu"));
    REQUIRE_THROWS_WITH(mlp(x, w_gpu, b_gpu, w_gpu, c, GeluForm::tanh),
                        ContainsSubstring("[mlp] inputs on different devices: cuda and cpu"));
    REQUIRE_THROWS_WITH(gelu(Tensor::zeros({4}, DType::i32, Device::cuda)),
                        ContainsSubstring("[gelu] CUDA tensors must be f32, bf16 or f16, got i32"));
    REQUIRE_THROWS_WITH(Tensor::zeros({4}, DType::f64).to(Device::cuda),
                        ContainsSubstring("f64 tensors live on the CPU only"));
}

TEST_CASE("empty tensors are no-ops", "[gpu]") {
    require_gpu();
    Tensor e = Tensor::zeros({0, 7}, DType::f32, Device::cuda);
    REQUIRE(gelu(e).numel() == 0);
    REQUIRE(add(e, Tensor::zeros({7}, DType::f32, Device::cuda)).numel() == 0);
    REQUIRE(sum(e).item() == 0.0);
    REQUIRE(matmul(e, Tensor::zeros({7, 3}, DType::f32, Device::cuda)).shape() == Shape{0, 3});
}

TEST_CASE("causal_attention matches the CPU, dropout included", "[gpu]") {
    require_gpu();
    struct Case {
        std::int64_t b, h, t, d;
    };
    // Rows in registers (T <= 1024) and the looping kernels (T = 1100).
    for (Case c : {Case{1, 1, 1, 8}, Case{2, 3, 37, 16}, Case{2, 6, 256, 64}, Case{1, 2, 300, 32},
                   Case{1, 1, 1100, 8}}) {
        for (double p : {0.0, 0.2}) {
            Tensor qkv = random_f32({3, c.b, c.h, c.t, c.d});
            check_against_cpu("causal_attention T " + std::to_string(c.t) + " D " +
                                  std::to_string(c.d) + " dropout " + std::to_string(p),
                              [p](auto& in) {
                                  default_generator().set_state(21, 7);  // the same counters
                                  return causal_attention(in[0], p);
                              },
                              {qkv}, 1e-5);
        }
    }
}
