// tests/test_optim.cpp: AdamW against PyTorch's update written out by hand, decay on matrices
// only, SGD with momentum, gradient clipping, nanoGPT's schedule, and a tiny GPT overfitting one
// batch (the whole training path on the CPU).
#include <cmath>

#include "core/error.h"
#include "models/gpt.h"
#include "test_helpers.h"
#include "train/optim.h"

using namespace fg;

TEST_CASE("AdamW follows PyTorch's update", "[optim]") {
    Tensor w = test::random_f64({3, 4});  // a matrix: decayed
    Tensor b = test::random_f64({4});     // a vector: not decayed
    std::vector<double> w0 = w.to_vector<double>(), b0 = b.to_vector<double>();
    AdamWOptions o;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    o.weight_decay = 0.1;
    AdamW opt({{"w", &w}, {"b", &b}}, o);
    std::vector<double> mw(12, 0), vw(12, 0), mb(4, 0), vb(4, 0);
    auto reference = [&](std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                         std::vector<double>& v, double lr, double wd, int t) {
        for (std::size_t i = 0; i < p.size(); ++i) {
            p[i] *= 1 - lr * wd;
            m[i] += (1 - o.beta1) * (g[i] - m[i]);
            v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
            double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
            p[i] -= lr / (1 - std::pow(o.beta1, t)) * m[i] / denom;
        }
    };
    for (int t = 1; t <= 3; ++t) {
        double lr = 1e-2 * t;
        opt.zero_grad();
        sum(add(mul(mul(w, w), Tensor::full({}, 0.5, DType::f64)), sub(b, mul(b, b)))).backward();
        std::vector<double> gw = w.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
        opt.step(lr);
        reference(w0, gw, mw, vw, lr, o.weight_decay, t);
        reference(b0, gb, mb, vb, lr, 0.0, t);
        REQUIRE(test::max_abs_diff(w.to_vector<double>(), w0) < 1e-6);
        REQUIRE(test::max_abs_diff(b.to_vector<double>(), b0) < 1e-6);
    }
    REQUIRE(opt.steps() == 3);
    REQUIRE(opt.named_state().size() == 4);
    REQUIRE(opt.named_state()[1].first == "w.exp_avg_sq");
}

TEST_CASE("AdamW with zero gradients only decays matrices", "[optim]") {
    Tensor w = Tensor::ones({2, 2}).set_requires_grad(true);
    Tensor b = Tensor::ones({2}).set_requires_grad(true);
    w.set_grad(Tensor::zeros({2, 2}));
    b.set_grad(Tensor::zeros({2}));
    AdamWOptions o;
    o.weight_decay = 0.5;
    AdamW opt({{"w", &w}, {"b", &b}}, o);
    opt.step(0.1);
    for (float v : w.to_vector<float>()) REQUIRE(v == Approx(0.95f));
    for (float v : b.to_vector<float>()) REQUIRE(v == 1.0f);
    AdamWOptions bad;
    bad.beta2 = 1.0;
    REQUIRE_THROWS_WITH(AdamW({{"w", &w}}, bad), ContainsSubstring("[adamw] betas must be in [0, 1)"));
}

TEST_CASE("SGD with momentum", "[optim]") {
    Tensor p = Tensor::from_vector(std::vector<double>{1.0}, {1}).set_requires_grad(true);
    SGDOptions o;
    o.momentum = 0.5;
    SGD opt({{"p", &p}}, o);
    p.set_grad(Tensor::from_vector(std::vector<double>{2.0}, {1}));
    opt.step(0.1);  // buf = 2, p = 1 - 0.2
    REQUIRE(p.item() == Approx(0.8));
    p.set_grad(Tensor::from_vector(std::vector<double>{2.0}, {1}));
    opt.step(0.1);  // buf = 0.5 * 2 + 2 = 3, p = 0.8 - 0.3
    REQUIRE(p.item() == Approx(0.5));
}

TEST_CASE("gradient clipping by global norm", "[optim]") {
    Tensor a = Tensor::zeros({2}, DType::f64).set_requires_grad(true);
    Tensor b = Tensor::zeros({1}, DType::f64).set_requires_grad(true);
    a.set_grad(Tensor::from_vector(std::vector<double>{3, 0}, {2}));
    b.set_grad(Tensor::from_vector(std::vector<double>{4}, {1}));
    REQUIRE(clip_grad_norm({&a, &b}, 0.0) == Approx(5.0));  // measure only
    REQUIRE(a.grad().to_vector<double>()[0] == 3.0);
    REQUIRE(clip_grad_norm({&a, &b}, 1.0) == Approx(5.0));
    REQUIRE(a.grad().to_vector<double>()[0] == Approx(0.6).epsilon(1e-5));
    REQUIRE(b.grad().to_vector<double>()[0] == Approx(0.8).epsilon(1e-5));
    REQUIRE(clip_grad_norm({&a, &b}, 10.0) == Approx(1.0).epsilon(1e-5));  // under: unchanged
    CHECK(a.grad().to_vector<double>()[0] == Approx(0.6).epsilon(1e-5));
    CHECK(b.grad().to_vector<double>()[0] == Approx(0.8).epsilon(1e-5));
}

TEST_CASE("the norm and clip factor, applied by the step, equal clipping the gradients first",
          "[optim]") {
    Tensor a = Tensor::zeros({2}, DType::f64).set_requires_grad(true);
    Tensor b = Tensor::zeros({1}, DType::f64).set_requires_grad(true);
    a.set_grad(Tensor::from_vector(std::vector<double>{3, 0}, {2}));
    b.set_grad(Tensor::from_vector(std::vector<double>{4}, {1}));
    GradNorm n = grad_norm({&a, &b}, 1.0);
    CHECK(n.norm.item() == Approx(5.0));
    CHECK(n.coef.item() == Approx(1.0 / (5.0 + 1e-6)));
    CHECK(a.grad().to_vector<double>()[0] == 3.0);  // the gradients are left as they are
    CHECK(grad_norm({&a, &b}, 0.0).coef.item() == 1.0);   // measure only
    CHECK(grad_norm({&a, &b}, 10.0).coef.item() == 1.0);  // under the limit
    Tensor none = Tensor::zeros({3}, DType::f64).set_requires_grad(true);
    CHECK(grad_norm({&none}, 1.0).norm.item() == 0.0);  // no gradient at all

    // AdamW and SGD: step(lr, coef) is step(lr) after the gradients were scaled by coef, bit
    // for bit, in f32.
    for (bool adamw : {true, false}) {
        Tensor p0 = test::random_f32({5, 7}), g0 = test::random_f32({5, 7}, Device::cpu, 3.0f);
        Tensor p = p0.clone().set_requires_grad(true), q = p0.clone().set_requires_grad(true);
        std::unique_ptr<Optimizer> fused, plain;
        if (adamw) {
            AdamWOptions o;
            o.weight_decay = 0.1;
            fused = std::make_unique<AdamW>(std::vector<NamedParam>{{"p", &p}}, o);
            plain = std::make_unique<AdamW>(std::vector<NamedParam>{{"q", &q}}, o);
        } else {
            fused = std::make_unique<SGD>(std::vector<NamedParam>{{"p", &p}}, SGDOptions{});
            plain = std::make_unique<SGD>(std::vector<NamedParam>{{"q", &q}}, SGDOptions{});
        }
        for (int t = 0; t < 3; ++t) {
            p.set_grad(g0.clone());
            q.set_grad(g0.clone());
            GradNorm c = grad_norm({&p}, 1.0);
            REQUIRE(c.coef.item() < 1.0);
            fused->step(1e-2, Tensor::full({}, static_cast<float>(c.coef.item()), DType::f32));
            clip_grad_norm({&q}, 1.0);
            plain->step(1e-2);
            INFO((adamw ? "adamw" : "sgd") << " step " << t);
            REQUIRE(p.to_vector<float>() == q.to_vector<float>());
        }
    }
}

TEST_CASE("a gradient scale that is not one value on the parameters' device is refused",
          "[optim][errors]") {
    Tensor p = Tensor::zeros({3}, DType::f32).set_requires_grad(true);
    p.set_grad(Tensor::ones({3}, DType::f32));
    AdamW adamw({{"p", &p}}, AdamWOptions{});
    REQUIRE_THROWS_WITH(adamw.step(1e-3, Tensor::ones({2}, DType::f32)),
                        ContainsSubstring("[adamw] the gradient scale must be one value on cpu, got (2) on cpu"));
    CHECK(p.to_vector<float>() == std::vector<float>{0, 0, 0});  // nothing updated
}

TEST_CASE("warmup then cosine decay, as nanoGPT", "[optim]") {
    REQUIRE(cosine_lr(0, 1e-3, 1e-4, 100, 5000) == Approx(1e-3 / 101));
    REQUIRE(cosine_lr(99, 1e-3, 1e-4, 100, 5000) == Approx(1e-3 * 100 / 101));
    REQUIRE(cosine_lr(100, 1e-3, 1e-4, 100, 5000) == Approx(1e-3));
    REQUIRE(cosine_lr(2550, 1e-3, 1e-4, 100, 5000) == Approx(0.55e-3));
    REQUIRE(cosine_lr(5000, 1e-3, 1e-4, 100, 5000) == Approx(1e-4));
    REQUIRE(cosine_lr(6000, 1e-3, 1e-4, 100, 5000) == Approx(1e-4));
}

TEST_CASE("a tiny GPT overfits one batch on the CPU", "[optim][gpt]") {
    GPTConfig c = test::small_gpt(13, 16, 2, 2, 32);
    Generator gen(7);
    GPT model(c, gen);
    Tensor ids = randint({4, 16}, 13, Device::cpu, &gen);
    Tensor targets = randint({4, 16}, 13, Device::cpu, &gen);
    std::vector<NamedParam> params;
    for (auto& [name, p] : model.named_parameters()) params.push_back({name, p});
    AdamW opt(params, AdamWOptions{});
    double first = 0, last = 0;
    for (int step = 0; step < 150; ++step) {
        opt.zero_grad();
        Tensor loss = model.loss(model.forward(ids), targets);
        loss.backward();
        clip_grad_norm(model.parameters(), 1.0);
        opt.step(3e-3);
        last = loss.item();
        if (step == 0) first = last;
    }
    INFO("loss " << first << " -> " << last);
    REQUIRE(first > 2.0);
    REQUIRE(last < 0.05);
}

TEST_CASE("optimizer arguments are checked", "[optim][errors]") {
    Tensor w = Tensor::ones({2, 2}).set_requires_grad(true);
    Tensor frozen = Tensor::ones({2});
    AdamWOptions bad_eps;
    bad_eps.eps = 0.0;
    REQUIRE_THROWS_WITH(AdamW({{"w", &w}}, bad_eps), ContainsSubstring("[adamw] eps must be > 0 and weight_decay >= 0, got 0"));
    REQUIRE_THROWS_WITH(AdamW({{"frozen", &frozen}}, AdamWOptions{}),
                        ContainsSubstring("[optimizer] parameter 'frozen' is undefined or does not require grad"));
    Tensor half = Tensor::ones({2}, DType::f16).set_requires_grad(true);
    REQUIRE_THROWS_WITH(AdamW({{"half", &half}}, AdamWOptions{}),
                        ContainsSubstring("[adamw] parameter 'half' must be f32 (or f64 on the CPU), got f16"));
    AdamW opt({{"w", &w}}, AdamWOptions{});
    w.set_grad(Tensor::ones({2, 2}, DType::f64));
    REQUIRE_THROWS_WITH(opt.step(0.1), ContainsSubstring("[adamw] gradient of 'w' does not match its parameter"));
    REQUIRE_THROWS_WITH(SGD({{"w", &w}}, SGDOptions{1.0, 0.0}),
                        ContainsSubstring("[sgd] momentum must be in [0, 1) and weight_decay >= 0, got 1"));
}
