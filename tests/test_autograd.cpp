// tests/test_autograd.cpp: the tape itself: accumulation where paths meet, leaf .grad across
// backward calls, zero_grad, set_grad_storage, NoGradGuard, detach, freed graphs and non-scalar
// roots, post-accumulate hooks, saved tensors released after a backward, frozen inputs, and a
// leaf's first gradient taken without a copy.
#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "test_helpers.h"

using namespace fg;

TEST_CASE("gradients add up where paths meet", "[autograd]") {
    // y = sum(x * x + 3 x) -> dy/dx = 2x + 3; x used three times.
    Tensor x = Tensor::from_vector(std::vector<double>{1.0, -2.0, 0.5}, {3});
    x.set_requires_grad(true);
    Tensor y = sum(add(mul(x, x), scale(x, 3.0)));
    y.backward();
    REQUIRE(x.grad().to_vector<double>() == std::vector<double>{5.0, -1.0, 4.0});
    REQUIRE(x.grad().requires_grad() == false);
}

TEST_CASE("leaf gradients accumulate until zero_grad", "[autograd]") {
    Tensor x = Tensor::from_vector(std::vector<double>{2.0}, {1});
    x.set_requires_grad(true);
    sum(scale(x, 3.0)).backward();
    sum(scale(x, 3.0)).backward();
    REQUIRE(x.grad().item() == 6.0);
    x.zero_grad();
    REQUIRE_FALSE(x.grad().defined());
    sum(scale(x, 2.0)).backward();
    REQUIRE(x.grad().item() == 2.0);
}

TEST_CASE("no_grad and detach stop recording", "[autograd]") {
    Tensor x = test::random_f64({4});
    {
        NoGradGuard guard;
        Tensor y = scale(x, 2.0);
        REQUIRE_FALSE(y.requires_grad());
        REQUIRE_FALSE(y.grad_fn());
    }
    REQUIRE(grad_enabled());
    Tensor d = x.detach();
    REQUIRE_FALSE(d.requires_grad());
    REQUIRE(d.raw_data() == x.raw_data());
    Tensor z = scale(x, 2.0);
    REQUIRE(z.requires_grad());
    REQUIRE(z.grad_fn()->name() == "scale");
    REQUIRE_FALSE(z.is_leaf());
}

TEST_CASE("backward twice through a freed graph is an error", "[autograd]") {
    Tensor x = test::random_f64({3});
    Tensor y = sum(gelu(x));
    y.backward();
    REQUIRE_THROWS_WITH(y.backward(), ContainsSubstring("[backward]") && ContainsSubstring("second time"));
}

TEST_CASE("backward from a non-scalar needs a gradient", "[autograd]") {
    Tensor x = test::random_f64({2, 3});
    Tensor y = scale(x, 2.0);
    REQUIRE_THROWS_WITH(y.backward(), ContainsSubstring("[backward]") && ContainsSubstring("shape (2, 3)"));
    y.backward(Tensor::ones({2, 3}, DType::f64));
    for (double g : x.grad().to_vector<double>()) REQUIRE(g == 2.0);
    REQUIRE_THROWS_WITH(scale(x, 1.0).backward(Tensor::ones({3}, DType::f64)),
                        ContainsSubstring("gradient has shape (3)"));
}

TEST_CASE("backward on a tensor that needs no grad is an error", "[autograd]") {
    Tensor x = Tensor::ones({1}, DType::f64);
    REQUIRE_THROWS_WITH(scale(x, 2.0).backward(), ContainsSubstring("does not require grad"));
    Tensor y = scale(test::random_f64({2}), 1.0);
    REQUIRE_THROWS_WITH(y.set_requires_grad(false), ContainsSubstring("only leaf tensors"));
}

TEST_CASE("saved tensors are released after backward", "[autograd]") {
    Tensor x = test::random_f64({1000});
    std::weak_ptr<TensorImpl> saved;
    {
        Tensor h = gelu(x);  // gelu saves its input x; softmax saves its output
        Tensor y = softmax(h);
        saved = y.impl_ptr();
        sum(mul(y, y)).backward();
    }
    REQUIRE(saved.expired());
    REQUIRE(x.grad().defined());
}

TEST_CASE("frozen inputs get no gradient", "[autograd]") {
    Tensor a = test::random_f64({3, 4});
    Tensor b = test::random_f64({4, 2}, false);
    sum(matmul(a, b)).backward();
    REQUIRE(a.grad().defined());
    REQUIRE_FALSE(b.grad().defined());
}

TEST_CASE("a post-accumulate hook runs once a backward, after every contribution", "[autograd]") {
    // w is used twice (as a tied weight is), b once; w's hook must see the sum of both uses.
    Tensor w = Tensor::from_vector(std::vector<double>{1.0, 2.0}, {2});
    Tensor b = Tensor::from_vector(std::vector<double>{0.5, 0.5}, {2});
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    std::vector<std::string> order;
    std::vector<double> w_seen;
    w.set_post_accumulate_grad_hook([&] {
        order.push_back("w");
        w_seen = w.grad().to_vector<double>();
    });
    b.set_post_accumulate_grad_hook([&] { order.push_back("b"); });
    // y = sum(3 w + w * b): dy/dw = 3 + b, dy/db = w.
    auto forward = [&] { return sum(add(scale(w, 3.0), mul(w, b))); };
    forward().backward();
    REQUIRE(order.size() == 2);
    REQUIRE(std::count(order.begin(), order.end(), "w") == 1);
    REQUIRE(w_seen == std::vector<double>{3.5, 3.5});
    // A second backward adds into the gradient and runs the hook again, with the total.
    forward().backward();
    REQUIRE(order.size() == 4);
    REQUIRE(w_seen == std::vector<double>{7.0, 7.0});
    // No gradient reaches b: its hook does not run.
    sum(scale(w, 1.0)).backward();
    REQUIRE(order.size() == 5);
    REQUIRE(order.back() == "w");
    // Removed, it runs no more.
    w.set_post_accumulate_grad_hook(nullptr);
    sum(scale(w, 1.0)).backward();
    REQUIRE(order.size() == 5);
    // Only leaves accumulate.
    Tensor y = scale(w, 2.0);
    REQUIRE_THROWS_WITH(y.set_post_accumulate_grad_hook([] {}),
                        ContainsSubstring("is not a leaf (it was made by"));
}

TEST_CASE("a leaf takes its first gradient without a copy only when nothing else holds it",
          "[autograd]") {
    // Unshared: the gradient scale's backward makes is taken as it is: the backward allocates
    // no more than one that adds into an existing gradient in place (a copy would be one more).
    Tensor x = Tensor::zeros({1 << 16});
    x.set_requires_grad(true);
    auto allocations_of_backward = [&x](bool gradient_exists) {
        x.zero_grad();
        if (gradient_exists) x.set_grad(Tensor::zeros(x.shape()));
        Tensor y = sum(scale(x, 2.0));
        const std::size_t before = memory_stats(Device::cpu).allocations;
        y.backward();
        return memory_stats(Device::cpu).allocations - before;
    };
    CHECK(allocations_of_backward(false) == allocations_of_backward(true));
    CHECK(x.grad().to_vector<float>() == std::vector<float>(1 << 16, 2.0f));
    x.zero_grad();
    sum(scale(x, 2.0)).backward();
    CHECK(x.grad().to_vector<float>() == std::vector<float>(1 << 16, 2.0f));
    // Shared: an add's backward hands the same gradient to both of its inputs, two leaves here;
    // each leaf must get memory of its own.
    Tensor a = Tensor::ones({4}), b = Tensor::ones({4});
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    sum(add(a, b)).backward();
    CHECK(a.grad().raw_data() != b.grad().raw_data());
    Tensor ga = a.grad();
    add_(ga, ga.clone());  // a's gradient changed in place: b's stays
    CHECK(a.grad().to_vector<float>() == std::vector<float>(4, 2.0f));
    CHECK(b.grad().to_vector<float>() == std::vector<float>(4, 1.0f));
}


TEST_CASE("set_grad_storage: the first gradient overwrites the storage, later ones add",
          "[autograd]") {
    // y = sum(x * w + 2 w): dy/dw = x + 2 (w used twice: the engine sums both uses and the
    // leaf's accumulation copies the sum). The storage holds 7s that must not count, and stays
    // where the gradient is; a second backward adds.
    Tensor w = Tensor::from_vector(std::vector<double>{1.0, 2.0, 3.0}, {3});
    w.set_requires_grad(true);
    const Tensor x = Tensor::from_vector(std::vector<double>{0.5, -1.0, 4.0}, {3});
    const std::vector<double> once{2.5, 1.0, 6.0}, twice{5.0, 2.0, 12.0};
    auto step = [&] { sum(add(mul(x, w), scale(w, 2.0))).backward(); };
    Tensor storage = Tensor::full({3}, 7.0, DType::f64);
    w.set_grad_storage(storage);
    CHECK(w.grad().raw_data() == storage.raw_data());
    step();
    CHECK(w.grad().raw_data() == storage.raw_data());
    CHECK(w.grad().to_vector<double>() == once);
    step();  // not marked again: adds
    CHECK(storage.to_vector<double>() == twice);
    w.set_grad_storage(storage);  // marked again: overwritten
    step();
    CHECK(storage.to_vector<double>() == once);
    // A plain gradient set afterwards is added to again.
    w.set_grad(Tensor::full({3}, 1.0, DType::f64));
    step();
    CHECK(w.grad().to_vector<double>() == std::vector<double>{3.5, 2.0, 7.0});
    // zero_grad forgets the storage: the next gradient is a tensor of its own.
    w.set_grad_storage(storage);
    w.zero_grad();
    step();
    CHECK(w.grad().raw_data() != storage.raw_data());
    CHECK(w.grad().to_vector<double>() == once);
    CHECK_THROWS_WITH(w.set_grad_storage(Tensor::zeros({4}, DType::f64)),
                      ContainsSubstring("set_grad_storage") && ContainsSubstring("(4)"));
    CHECK_THROWS_WITH(w.set_grad_storage(Tensor::zeros({3}, DType::f32)),
                      ContainsSubstring("set_grad_storage") && ContainsSubstring("f32"));
    CHECK_THROWS_WITH(w.set_grad_storage(Tensor()),
                      ContainsSubstring("[set_grad_storage] the storage must match the tensor: undefined "
                               "for (3) f64 on cpu"));
}
