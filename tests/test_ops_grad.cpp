// tests/test_ops_grad.cpp: a float64 finite-difference gradient check for every op, on random
// shapes, plus forward checks against values worked out by hand.
#include <cmath>

#include "core/ops/op_utils.h"
#include "test_helpers.h"

using namespace fg;
using test::check_gradients;
using test::random_f64;

namespace {

// A few shapes per test, drawn fresh from the test generator.
std::int64_t random_dim(std::int64_t lo, std::int64_t hi) {
    Tensor r = randint({1}, static_cast<std::int32_t>(hi - lo + 1), Device::cpu,
                       &test::test_generator());
    return lo + r.to_vector<std::int32_t>()[0];
}

}  // namespace

TEST_CASE("add, sub, mul with broadcasting: gradients", "[ops][grad]") {
    std::int64_t b = random_dim(1, 3), t = random_dim(1, 4), c = random_dim(1, 6);
    auto x = random_f64({b, t, c});
    for (Shape other : {Shape{b, t, c}, Shape{c}, Shape{t, c}, Shape{b, t, 1}, Shape{1, t, 1},
                        Shape{}}) {
        INFO("other shape " << shape_str(other));
        auto y = random_f64(other);
        check_gradients([](auto& in) { return add(in[0], in[1]); }, {x, y});
        check_gradients([](auto& in) { return sub(in[1], in[0]); }, {x, y});
        check_gradients([](auto& in) { return mul(in[0], in[1]); }, {x, y});
    }
}

TEST_CASE("broadcast results are right", "[ops]") {
    Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor bias = Tensor::from_vector(std::vector<double>{10, 20, 30}, {3});
    Tensor row = Tensor::from_vector(std::vector<double>{100, 200}, {2, 1});
    REQUIRE(add(x, bias).to_vector<double>() == std::vector<double>{11, 22, 33, 14, 25, 36});
    REQUIRE(sub(x, row).to_vector<double>() ==
            std::vector<double>{-99, -98, -97, -196, -195, -194});
    REQUIRE(mul(bias, x).shape() == Shape{2, 3});
    // A size-1 dim stretches to any size, 0 included.
    REQUIRE(add(Tensor::zeros({0, 3}, DType::f64), bias).shape() == Shape{0, 3});
    REQUIRE(add(row, Tensor::zeros({2, 0}, DType::f64)).shape() == Shape{2, 0});
}

TEST_CASE("scale, gelu, dropout: gradients", "[ops][grad]") {
    auto x = random_f64({random_dim(1, 5), random_dim(1, 9)});
    check_gradients([](auto& in) { return scale(in[0], -1.7); }, {x});
    auto positive = add(mul(x.detach(), x.detach()), Tensor::full({}, 0.5, DType::f64));
    positive.set_requires_grad(true);
    check_gradients([](auto& in) { return rsqrt(in[0]); }, {positive});
    check_gradients([](auto& in) { return gelu(in[0]); }, {x});
    check_gradients([](auto& in) { return gelu(in[0], GeluForm::tanh); }, {x});
    check_gradients(
        [](auto& in) {
            default_generator().set_state(99, 0);  // the same mask at every evaluation
            return dropout(in[0], 0.3);
        },
        {x});
}

TEST_CASE("gelu matches its definition", "[ops]") {
    Tensor x = Tensor::from_vector(std::vector<double>{-3, -1, 0, 0.5, 2}, {5});
    std::vector<double> y = gelu(x).to_vector<double>();
    std::vector<double> xs = x.to_vector<double>();
    for (std::size_t i = 0; i < xs.size(); ++i)
        REQUIRE(y[i] == Approx(xs[i] * 0.5 * std::erfc(-xs[i] / std::sqrt(2.0))).epsilon(1e-12));
    // GPT-2's tanh form, and how far it is from the exact one (below 1e-3 everywhere).
    std::vector<double> t = gelu(x, GeluForm::tanh).to_vector<double>();
    const double pi = std::acos(-1.0);
    for (std::size_t i = 0; i < xs.size(); ++i) {
        const double v = xs[i];
        REQUIRE(t[i] == Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v))))
                            .epsilon(1e-12));
        CHECK(std::fabs(t[i] - y[i]) < 1e-3);
    }
}

TEST_CASE("dropout keeps about 1 - p and scales by 1 / (1 - p)", "[ops]") {
    manual_seed(5);
    Tensor x = Tensor::ones({100000});
    std::vector<float> y = dropout(x, 0.25).to_vector<float>();
    double kept = 0;
    for (float v : y) {
        REQUIRE((v == 0.0f || v == Approx(1.0f / 0.75f)));
        kept += v != 0.0f;
    }
    REQUIRE(kept / y.size() == Approx(0.75).margin(0.01));
    REQUIRE(dropout(x, 0.25, false).raw_data() == x.raw_data());  // eval: identity
}

TEST_CASE("sum and mean: gradients", "[ops][grad]") {
    auto x = random_f64({random_dim(1, 4), random_dim(1, 5), random_dim(1, 7)});
    check_gradients([](auto& in) { return sum(in[0]); }, {x});
    check_gradients([](auto& in) { return mean(in[0]); }, {x});
    check_gradients([](auto& in) { return sum_last(in[0]); }, {x});
    check_gradients([](auto& in) { return mean_last(in[0]); }, {x});
    Tensor v = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
    REQUIRE(sum(v).item() == 21.0);
    REQUIRE(mean_last(v).to_vector<double>() == std::vector<double>{2, 5});
}

TEST_CASE("matmul, batched and transposed: gradients", "[ops][grad]") {
    std::int64_t m = random_dim(1, 6), k = random_dim(1, 6), n = random_dim(1, 6);
    std::int64_t batch = random_dim(2, 3);
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            INFO("trans_a " << ta << " trans_b " << tb);
            auto a = random_f64(ta ? Shape{k, m} : Shape{m, k});
            auto b = random_f64(tb ? Shape{n, k} : Shape{k, n});
            check_gradients([ta, tb](auto& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
            auto ab = random_f64(ta ? Shape{batch, k, m} : Shape{batch, m, k});
            auto bb = random_f64(tb ? Shape{batch, n, k} : Shape{batch, k, n});
            check_gradients([ta, tb](auto& in) { return matmul(in[0], in[1], ta, tb); }, {ab, bb});
        }
        // A Linear layer: x (B, T, C) @ W^T with a shared 2-D weight.
        auto x = random_f64({batch, m, k});
        auto w = random_f64(ta ? Shape{k, n} : Shape{n, k});
        check_gradients([ta](auto& in) { return matmul(in[0], in[1], false, !ta); }, {x, w});
    }
}

TEST_CASE("linear: gradients, with and without a bias, and its bad shapes", "[ops][grad]") {
    std::int64_t m = random_dim(1, 5), k = random_dim(1, 6), n = random_dim(1, 6);
    auto x = random_f64({2, m, k});
    auto w = random_f64({n, k});
    auto b = random_f64({n});
    check_gradients([](auto& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
    check_gradients([](auto& in) { return linear(in[0], in[1], Tensor()); }, {x, w});
    // It is x @ w^T + b, value for value.
    Tensor y = linear(x, w, b);
    Tensor want = add(matmul(x, w, false, true), b);
    CHECK(y.to_vector<double>() == want.to_vector<double>());
    REQUIRE_THROWS_WITH(linear(random_f64({3, k + 1}), w, b),
                        ContainsSubstring("[linear] input of shape (3, " + std::to_string(k + 1) +
                                 ") does not fit weight"));
    REQUIRE_THROWS_WITH(linear(x, w, random_f64({n + 1})),
                        ContainsSubstring("[linear] bias of shape (" + std::to_string(n + 1) +
                                 ") does not fit weight"));
    REQUIRE_THROWS_WITH(linear(x, random_f64({n}), b), ContainsSubstring("[linear] weight must be 2-D"));
    // No input features: the product is empty, y is the bias on every row (no division by zero).
    Tensor y0 = linear(random_f64({3, 0}), random_f64({n, 0}), b);
    REQUIRE(y0.shape() == Shape{3, n});
    CHECK(y0.to_vector<double>() == add(Tensor::zeros({3, n}, DType::f64), b).to_vector<double>());
}

TEST_CASE("mlp: linear, GELU, linear as one op: gradients and bad shapes", "[ops][grad]") {
    std::int64_t m = random_dim(1, 5), k = random_dim(1, 6), h = random_dim(1, 8),
                 n = random_dim(1, 6);
    auto x = random_f64({2, m, k});
    auto w1 = random_f64({h, k}), b1 = random_f64({h});
    auto w2 = random_f64({n, h}), b2 = random_f64({n});
    for (GeluForm form : {GeluForm::exact, GeluForm::tanh}) {
        INFO("tanh " << (form == GeluForm::tanh));
        auto op = [form](auto& in) { return mlp(in[0], in[1], in[2], in[3], in[4], form); };
        check_gradients(op, {x, w1, b1, w2, b2});
        check_gradients([form](auto& in) { return mlp(in[0], in[1], Tensor(), in[2], Tensor(), form); },
                        {x, w1, w2});
        // Off CUDA it is the composition, value for value.
        Tensor want = linear(gelu(linear(x, w1, b1), form), w2, b2);
        CHECK(mlp(x, w1, b1, w2, b2, form).to_vector<double>() == want.to_vector<double>());
    }
    REQUIRE_THROWS_WITH(mlp(x, w1, b1, random_f64({n, h + 1}), b2, GeluForm::tanh),
                        ContainsSubstring("[mlp] second weight of shape (" + std::to_string(n) + ", " +
                                 std::to_string(h + 1) + ") does not fit first weight"));
    REQUIRE_THROWS_WITH(mlp(x, w1, b1, w2, random_f64({n + 1}), GeluForm::tanh),
                        ContainsSubstring("[mlp] second bias of shape (" + std::to_string(n + 1) +
                                 ") does not fit second weight"));
    REQUIRE_THROWS_WITH(mlp(x, w1, random_f64({h + 1}), w2, b2, GeluForm::tanh),
                        ContainsSubstring("[mlp] first bias of shape (" + std::to_string(h + 1) +
                                 ") does not fit first weight"));
    REQUIRE_THROWS_WITH(mlp(x, random_f64({h}), b1, w2, b2, GeluForm::tanh),
                        ContainsSubstring("[mlp] first weight must be 2-D"));
    REQUIRE_THROWS_WITH(mlp(x, w1, b1, random_f64({h}), b2, GeluForm::tanh),
                        ContainsSubstring("[mlp] second weight must be 2-D"));
    REQUIRE_THROWS_WITH(mlp(x, w1, b1, Tensor(), b2, GeluForm::tanh),
                        ContainsSubstring("[mlp] second weight is an undefined tensor"));
    REQUIRE_THROWS_WITH(mlp(random_f64({3, k + 1}), w1, b1, w2, b2, GeluForm::exact),
                        ContainsSubstring("[mlp] input of shape (3, " + std::to_string(k + 1) +
                                 ") does not fit first weight"));
}

TEST_CASE("matmul matches a hand-worked product", "[ops]") {
    Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor b = Tensor::from_vector(std::vector<double>{7, 8, 9, 10, 11, 12}, {3, 2});
    REQUIRE(matmul(a, b).to_vector<double>() == std::vector<double>{58, 64, 139, 154});
    REQUIRE(matmul(a, a, false, true).to_vector<double>() == std::vector<double>{14, 32, 32, 77});
}

TEST_CASE("softmax, plain and causal: gradients", "[ops][grad]") {
    std::int64_t t = random_dim(1, 6);
    auto x = random_f64({2, t, t + random_dim(0, 2)});
    check_gradients([](auto& in) { return softmax(in[0]); }, {x});
    check_gradients([](auto& in) { return softmax(in[0], true); }, {x});
}

TEST_CASE("causal softmax masks the future", "[ops]") {
    Tensor x = Tensor::zeros({3, 3}, DType::f64);
    std::vector<double> y = softmax(x, true).to_vector<double>();
    std::vector<double> want{1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
    for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == Approx(want[i]));
}

TEST_CASE("cross-entropy: gradient, value and ignore_index", "[ops][grad]") {
    // At least two rows: one is ignored below, the others still carry a gradient.
    std::int64_t rows = random_dim(2, 8), vocab = random_dim(2, 11);
    auto logits = random_f64({rows, vocab});
    Tensor targets = randint({rows}, static_cast<std::int32_t>(vocab), Device::cpu,
                             &test::test_generator());
    check_gradients([targets](auto& in) { return cross_entropy(in[0], targets); }, {logits});
    std::vector<std::int32_t> t = targets.to_vector<std::int32_t>();
    t[0] = -1;
    Tensor masked = Tensor::from_vector(t, {rows});
    check_gradients([masked](auto& in) { return cross_entropy(in[0], masked); }, {logits});
    // Uniform logits over V classes: loss = log V.
    Tensor flat = Tensor::zeros({4, 10}, DType::f64);
    Tensor any = Tensor::from_vector(std::vector<std::int32_t>{0, 3, 9, 5}, {4});
    REQUIRE(cross_entropy(flat, any).item() == Approx(std::log(10.0)));
}

TEST_CASE("cross-entropy's gradient overwrites logits nothing else holds", "[ops][grad]") {
    test::check_loss_in_place(Device::cpu, DType::f32);
    test::check_loss_in_place(Device::cpu, DType::bf16);
}

TEST_CASE("embedding: gradient with repeated ids", "[ops][grad]") {
    auto weight = random_f64({7, random_dim(1, 5)});
    Tensor ids = Tensor::from_vector(std::vector<std::int32_t>{3, 0, 3, 6, 3, 1}, {2, 3});
    check_gradients([ids](auto& in) { return embedding(in[0], ids); }, {weight});
    Tensor out = embedding(weight, ids);
    REQUIRE(out.shape() == Shape{2, 3, weight.size(1)});
}

TEST_CASE("reshape, slice, permute, heads, casts: gradients", "[ops][grad]") {
    auto x = random_f64({3, 4, 6});
    check_gradients([](auto& in) { return reshape(in[0], {4, -1}); }, {x});
    check_gradients([](auto& in) { return slice(in[0], 1, 3); }, {x});
    check_gradients([](auto& in) { return permute(in[0], {2, 0, 1}); }, {x});
    check_gradients([](auto& in) { return transpose(in[0], 0, 2); }, {x});
    check_gradients([](auto& in) { return merge_heads(split_heads(in[0], 2)); }, {x});
    check_gradients([](auto& in) { return split_heads(in[0], 3); }, {x});
    check_gradients([](auto& in) { return cast(cast(in[0], DType::f32), DType::f64); }, {x}, 1e-3,
                    1e-3);
}

TEST_CASE("split_heads lays out (B, H, T, D)", "[ops]") {
    // x[b, t, h * D + d] = 100 t + 10 h + d with B = 1, T = 2, H = 2, D = 2
    std::vector<double> v;
    for (int t = 0; t < 2; ++t)
        for (int h = 0; h < 2; ++h)
            for (int d = 0; d < 2; ++d) v.push_back(100 * t + 10 * h + d);
    Tensor x = Tensor::from_vector(v, {1, 2, 4});
    Tensor heads = split_heads(x, 2);
    REQUIRE(heads.shape() == Shape{1, 2, 2, 2});
    REQUIRE(heads.to_vector<double>() == std::vector<double>{0, 1, 100, 101, 10, 11, 110, 111});
    REQUIRE(merge_heads(heads).to_vector<double>() == v);
}

TEST_CASE("a small composite: attention-shaped graph", "[ops][grad]") {
    auto q = random_f64({1, 2, 3, 4});
    auto k = random_f64({1, 2, 3, 4});
    auto v = random_f64({1, 2, 3, 4});
    check_gradients(
        [](auto& in) {
            Tensor att = softmax(scale(matmul(in[0], in[1], false, true), 0.5), true);
            return merge_heads(matmul(att, in[2]));
        },
        {q, k, v});
}

namespace {

// causal_attention written out with the plain ops: the definition the fused op must match.
Tensor attention_by_plain_ops(const Tensor& qkv, double p) {
    const std::int64_t b = qkv.size(1), h = qkv.size(2), t = qkv.size(3), d = qkv.size(4);
    Tensor q = qkv.slice(0, 1).reshape({b, h, t, d});
    Tensor k = qkv.slice(1, 2).reshape({b, h, t, d});
    Tensor v = qkv.slice(2, 3).reshape({b, h, t, d});
    Tensor att = softmax(scale(matmul(q, k, false, true), 1.0 / std::sqrt(double(d))), true);
    return matmul(dropout(att, p, true), v);
}

}  // namespace

TEST_CASE("causal_attention equals the plain-op composition, dropout included", "[ops][grad]") {
    for (double p : {0.0, 0.25}) {
        INFO("dropout " << p);
        Tensor qkv = random_f64({3, 2, 3, 7, 4});
        default_generator().set_state(11, 5);
        Tensor fused = causal_attention(qkv, p);
        Tensor w = random_f64(fused.shape(), false);
        sum(mul(fused, w)).backward();
        Tensor fused_grad = qkv.grad();
        qkv.zero_grad();
        default_generator().set_state(11, 5);  // the same dropout counters
        Tensor plain = attention_by_plain_ops(qkv, p);
        sum(mul(plain, w)).backward();
        CHECK(test::max_abs_diff(fused.to_vector<double>(), plain.to_vector<double>()) < 1e-12);
        CHECK(test::max_abs_diff(fused_grad.to_vector<double>(), qkv.grad().to_vector<double>()) < 1e-12);
        // Not training: no dropout, and the generator does not move.
        std::uint64_t offset = default_generator().offset();
        Tensor eval = causal_attention(qkv, p, false);
        CHECK(default_generator().offset() == offset);
        CHECK(test::max_abs_diff(eval.to_vector<double>(), attention_by_plain_ops(qkv, 0.0).to_vector<double>()) < 1e-12);
    }
}

TEST_CASE("causal_attention: gradients by finite differences, T = 1 and longer", "[ops][grad]") {
    for (std::int64_t t : {1, 9}) {
        for (double p : {0.0, 0.3}) {
            INFO("T " << t << ", dropout " << p);
            Tensor qkv = random_f64({3, 1, 2, t, 5});
            check_gradients(
                [p](auto& in) {
                    default_generator().set_state(3, 0);  // the same mask at every evaluation
                    return causal_attention(in[0], p);
                },
                {qkv});
        }
    }
}

TEST_CASE("causal_self_attention from (B, T, 3C) to (B, T, C) is attention by plain ops on the "
          "rows' thirds split into heads", "[ops][grad]") {
    const std::int64_t b = 2, t = 5, h = 3, d = 4, c = h * d;
    for (double p : {0.0, 0.25}) {
        INFO("dropout " << p);
        Tensor packed = random_f64({b, t, 3 * c});
        default_generator().set_state(7, 3);
        Tensor y = causal_self_attention(packed, h, p);
        REQUIRE(y.shape() == Shape{b, t, c});
        Tensor w = random_f64(y.shape(), false);
        sum(mul(y, w)).backward();
        const Tensor packed_grad = packed.grad();
        packed.zero_grad();
        // Column k of a token's row is q (k < C), k (C <= k < 2C) or v; head k / D of it. Built
        // here another way than the op builds it: the row's thirds (a reshape and a permute to
        // (3, B, T, C)), each split into heads, then attention by plain ops.
        default_generator().set_state(7, 3);  // the same dropout counters
        Tensor thirds = permute(packed.reshape({b, t, 3, c}), {2, 0, 1, 3});
        auto third = [&](std::int64_t i) {
            return split_heads(thirds.slice(i, i + 1).reshape({b, t, c}), h);
        };
        Tensor att = softmax(scale(matmul(third(0), third(1), false, true),
                                   1.0 / std::sqrt(static_cast<double>(d))),
                             true);
        Tensor ref = merge_heads(matmul(dropout(att, p, true), third(2)));
        sum(mul(ref, w)).backward();
        CHECK(test::max_abs_diff(y.to_vector<double>(), ref.to_vector<double>()) < 1e-12);
        CHECK(test::max_abs_diff(packed_grad.to_vector<double>(),
                                 packed.grad().to_vector<double>()) < 1e-12);
    }
    check_gradients([](auto& in) {
        default_generator().set_state(3, 0);
        return causal_self_attention(in[0], 2, 0.3);
    }, {random_f64({1, 4, 3 * 2 * 3})});
    REQUIRE_THROWS_WITH(
        causal_self_attention(random_f64({2, 4, 10}), 2, 0.0),
        ContainsSubstring("[causal_self_attention] qkv must be (B, T, 3 C), got (2, 4, 10)"));
    REQUIRE_THROWS_WITH(causal_self_attention(random_f64({2, 4, 12}), 3, 0.0),
                        ContainsSubstring("[causal_self_attention] C = 4 is not divisible by 3 heads"));
    CHECK(packed_cudnn_attention_failure().empty());
}

TEST_CASE("the packed attention layout cuDNN is told addresses c_attn's and c_proj's elements",
          "[ops]") {
    // CPU runs never use it (they permute), so its index arithmetic is checked here against the
    // reshape the model means: qkv (B, T, 3C) viewed as (B, T, 3, H, D), out (B, T, C) as
    // (B, T, H, D). Element (which, b, h, t, d) is at which's offset + the strides' sum.
    const std::int64_t B = 2, T = 3, H = 4, D = 8, C = H * D;
    const ops_detail::AttentionLayout l = ops_detail::packed_attention_layout(B, H, T, D);
    CHECK(l.out_shape == Shape{B, T, C});
    for (std::int64_t which = 0; which < 3; ++which)
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t d = 0; d < D; ++d) {
                        const std::int64_t base = which == 0 ? 0 : which == 1 ? l.k_at : l.v_at;
                        CHECK(base + b * l.stride_b + h * l.stride_h + t * l.stride_t + d ==
                              (((b * T + t) * 3 + which) * H + h) * D + d);
                        if (which == 0)
                            CHECK(b * l.out_stride_b + h * l.out_stride_h + t * l.out_stride_t +
                                      d ==
                                  ((b * T + t) * H + h) * D + d);
                    }
}

TEST_CASE("causal_attention rejects bad input", "[ops][errors]") {
    REQUIRE_THROWS_WITH(causal_attention(random_f64({2, 1, 1, 4, 4}), 0.0),
                        ContainsSubstring("[causal_attention] qkv must be (3, B, H, T, D), got (2, 1, 1, 4, 4)"));
    REQUIRE_THROWS_WITH(causal_attention(random_f64({3, 1, 1, 4, 4}), 1.0),
                        ContainsSubstring("dropout p must be in [0, 1), got 1"));
    REQUIRE_THROWS_WITH(causal_attention(random_f64({3, 1, 1, 0, 4}), 0.0),
                        ContainsSubstring("[causal_attention] qkv needs T >= 1 and D >= 1, got (3, 1, 1, 0, 4)"));
    REQUIRE_THROWS_WITH(causal_attention(Tensor::zeros({3, 1, 1, 4, 4}, DType::i32), 0.0),
                        ContainsSubstring("[causal_attention] CPU tensors must be f32, f64, bf16 or f16, got i32"));
}
