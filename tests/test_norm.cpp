// tests/test_norm.cpp: RMSNorm and LayerNorm on the CPU reference: float64 finite-difference
// gradient checks with every option (weight, bias, zero-centred weight, fused residual), values
// against the definition, the layers, and every bad input with its message.
#include <cmath>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "kernels/norm.h"
#include "layers/norm.h"
#include "test_helpers.h"

using namespace fg;
using kernels::NormKind;
using test::check_gradients;
using test::random_f64;

namespace {

struct Variant {
    bool weight, bias, zero_centered, residual;
};

std::vector<Variant> all_variants() {
    std::vector<Variant> v;
    for (int bits = 0; bits < 16; ++bits) {
        Variant x{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0};
        if (x.zero_centered && !x.weight) continue;
        v.push_back(x);
    }
    return v;
}

Tensor run_norm(NormKind kind, const std::vector<Tensor>& in, const Variant& v, double eps) {
    NormOptions o;
    o.eps = eps;
    o.zero_centered = v.zero_centered;
    Tensor w = v.weight ? in[1] : Tensor(), b = v.bias ? in[2] : Tensor();
    if (v.residual) {
        NormResidualResult r = kind == NormKind::rms ? rms_norm_residual(in[0], in[3], w, b, o)
                                                     : layer_norm_residual(in[0], in[3], w, b, o);
        return add(r.y, scale(r.h, 0.7));  // gradients flow through both outputs
    }
    return kind == NormKind::rms ? rms_norm(in[0], w, b, o) : layer_norm(in[0], w, b, o);
}

}  // namespace

TEST_CASE("norm gradients match finite differences with every option", "[norm][grad]") {
    for (NormKind kind : {NormKind::rms, NormKind::layer}) {
        for (const Variant& v : all_variants()) {
            for (double eps : {1e-6, 1e-2}) {
                INFO((kind == NormKind::rms ? "rmsnorm" : "layernorm")
                     << " weight " << v.weight << " bias " << v.bias << " zero-centred "
                     << v.zero_centered << " residual " << v.residual << " eps " << eps);
                for (std::int64_t n : {1, 7, 16}) {
                    // Only the inputs this variant uses require grad.
                    std::vector<Tensor> in{random_f64({3, 2, n}), random_f64({n}, v.weight),
                                           random_f64({n}, v.bias),
                                           random_f64({3, 2, n}, v.residual)};
                    check_gradients([&](auto& i) { return run_norm(kind, i, v, eps); }, in, 1e-6,
                                    2e-6);
                }
            }
        }
    }
}

TEST_CASE("layernorm output has zero mean and unit variance per row", "[norm]") {
    Tensor x = random_f64({5, 64}, false, 3.0f);
    std::vector<double> y = layer_norm(x, Tensor()).to_vector<double>();
    for (int r = 0; r < 5; ++r) {
        double m = 0, v = 0;
        for (int c = 0; c < 64; ++c) m += y[r * 64 + c];
        m /= 64;
        for (int c = 0; c < 64; ++c) v += (y[r * 64 + c] - m) * (y[r * 64 + c] - m);
        REQUIRE(std::fabs(m) < 1e-12);
        REQUIRE(v / 64 == Approx(1.0).epsilon(1e-5));  // 1 - eps / var(x), var(x) about 9
    }
}

TEST_CASE("rmsnorm follows its definition, eps included", "[norm]") {
    Tensor x = Tensor::from_vector(std::vector<double>{3, 4}, {1, 2});
    Tensor w = Tensor::from_vector(std::vector<double>{2, -1}, {2});
    NormOptions o;
    o.eps = 0.5;  // large, so a wrong eps shows
    std::vector<double> y = rms_norm(x, w, Tensor(), o).to_vector<double>();
    double rstd = 1.0 / std::sqrt((9.0 + 16.0) / 2 + 0.5);
    REQUIRE(y[0] == Approx(3 * rstd * 2).epsilon(1e-14));
    REQUIRE(y[1] == Approx(4 * rstd * -1).epsilon(1e-14));
    o.zero_centered = true;  // scale by 1 + w
    std::vector<double> z = rms_norm(x, w, Tensor(), o).to_vector<double>();
    REQUIRE(z[0] == Approx(3 * rstd * 3).epsilon(1e-14));
    REQUIRE(z[1] == Approx(0.0).margin(1e-14));
}

TEST_CASE("the fused residual returns h = x + r and normalises it", "[norm]") {
    Tensor x = random_f64({4, 9}, false), r = random_f64({4, 9}, false), w = random_f64({9}, false);
    NormResidualResult out = layer_norm_residual(x, r, w);
    REQUIRE(out.h.to_vector<double>() == add(x, r).to_vector<double>());
    REQUIRE(test::max_abs_diff(out.y.to_vector<double>(),
                               layer_norm(add(x, r), w).to_vector<double>()) == 0.0);
}

TEST_CASE("an f32 weight with f64 activations gets an f32 gradient", "[norm]") {
    Tensor x = random_f64({3, 5});
    Tensor w = Tensor::ones({5}).set_requires_grad(true);
    sum(rms_norm(x, w)).backward();
    REQUIRE(w.grad().dtype() == DType::f32);
    REQUIRE(x.grad().dtype() == DType::f64);
}

TEST_CASE("norm layers: parameters, init and forward", "[norm][layers]") {
    NormConfig cfg;
    cfg.dim = 8;
    cfg.bias = true;
    LayerNorm ln(cfg);
    auto params = ln.named_parameters("ln_1.");
    REQUIRE(params.size() == 2);
    REQUIRE(params[0].first == "ln_1.weight");
    REQUIRE(params[1].first == "ln_1.bias");
    for (float v : ln.weight.to_vector<float>()) REQUIRE(v == 1.0f);
    for (float v : ln.bias.to_vector<float>()) REQUIRE(v == 0.0f);
    cfg.bias = false;
    cfg.zero_centered = true;
    RMSNorm rn(cfg);
    REQUIRE(rn.parameters().size() == 1);
    for (float v : rn.weight.to_vector<float>()) REQUIRE(v == 0.0f);
    Tensor x = test::random_f32({2, 3, 8});
    Tensor y = rn.forward(x);
    REQUIRE(y.shape() == x.shape());
    sum(y).backward();
    REQUIRE(rn.weight.grad().defined());
}

TEST_CASE("norm bad inputs say what and where", "[norm][errors]") {
    Tensor x = Tensor::zeros({4, 64});
    REQUIRE_THROWS_WITH(rms_norm(x, Tensor::ones({32})),
                        ContainsSubstring("[rmsnorm] weight has 32 elements") &&
                            ContainsSubstring("input rows have 64"));
    REQUIRE_THROWS_WITH(layer_norm(x, Tensor::ones({64}), Tensor::ones({63})),
                        ContainsSubstring("[layernorm] bias has 63 elements"));
    REQUIRE_THROWS_WITH(rms_norm(x, Tensor::ones({64}, DType::f64)),
                        ContainsSubstring("[rmsnorm] weight must be f32 or f32 like the input, got f64"));
    REQUIRE_THROWS_WITH(rms_norm(Tensor::zeros({4, 64}, DType::i32), Tensor()),
                        ContainsSubstring("[rmsnorm] CPU tensors must be f32, f64, bf16 or f16, got i32"));
    REQUIRE_THROWS_WITH(rms_norm(Tensor::zeros({4, 64}, DType::bf16),
                                 Tensor::ones({64}, DType::f64)),
                        ContainsSubstring("[rmsnorm] weight must be f32 or bf16 like the input, got f64"));
    NormOptions bad;
    bad.eps = 0.0;
    REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), Tensor(), bad), ContainsSubstring("[rmsnorm] eps must be > 0"));
    bad.eps = -1e-5;
    REQUIRE_THROWS_WITH(layer_norm(x, Tensor(), Tensor(), bad), ContainsSubstring("eps must be > 0, got -1e-05"));
    REQUIRE_THROWS_WITH(rms_norm_residual(x, Tensor::zeros({4, 63}), Tensor()),
                        ContainsSubstring("[rmsnorm] residual has shape (4, 63), input has shape (4, 64)"));
    REQUIRE_THROWS_WITH(rms_norm(Tensor::zeros({4, 0}), Tensor()),
                        ContainsSubstring("input needs a non-empty last dim"));
    NormOptions zc;
    zc.zero_centered = true;
    REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), Tensor(), zc), ContainsSubstring("zero-centred weight needs"));
    NormConfig cfg;
    cfg.dim = 0;
    REQUIRE_THROWS_WITH(RMSNorm(cfg), ContainsSubstring("[rmsnorm] dim must be >= 1, got 0"));
    cfg.dim = 4;
    cfg.eps = 0;
    REQUIRE_THROWS_WITH(LayerNorm(cfg), ContainsSubstring("[layernorm] eps must be > 0"));
    if (!cuda_is_available()) return;
    REQUIRE_THROWS_WITH(rms_norm(x.to(Device::cuda), Tensor::ones({64})),
                        ContainsSubstring("[rmsnorm] weight is on cpu, input is on cuda"));
}

#ifdef FG_WITH_CUDA
TEST_CASE("rows longer than the forward kernels take are an error before any launch",
          "[norm][errors]") {
    // The forward indexes a row with 32-bit offsets (kernels::kNormMaxCols). The check comes
    // before anything touches the device, so it runs without a GPU and the pointers stay null.
    kernels::NormForwardArgs a;
    a.rows = 1;
    a.cols = kernels::kNormMaxCols + 1;
    REQUIRE_THROWS_WITH(kernels::norm_forward(a),
                        ContainsSubstring("[norm] forward: rows of 1073741825 values") &&
                            ContainsSubstring("at most 2^30 a row"));
}
#endif

TEST_CASE("norm weight and bias must share a dtype", "[norm][errors]") {
    Tensor x = Tensor::zeros({2, 4}, DType::f64);
    REQUIRE_THROWS_WITH(layer_norm(x, Tensor::ones({4}, DType::f64), Tensor::zeros({4}, DType::f32)),
                        ContainsSubstring("[layernorm] weight and bias dtypes differ: f64 and f32"));
}
