// tests/test_tensor.cpp: Tensor basics on the CPU: construction, views sharing storage, host
// copies, dtype conversions (bf16/f16 rounding), printing, the Philox generator, memory counters.
#include <cstring>
#include <limits>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/half.h"
#include "kernels/philox.h"
#include "test_helpers.h"

using namespace fg;

TEST_CASE("factories fill every element", "[tensor]") {
    Tensor z = Tensor::zeros({3, 5});
    Tensor o = Tensor::ones({3, 5}, DType::f64);
    Tensor f = Tensor::full({7}, 2.5, DType::bf16);
    for (float v : z.to_vector<float>()) REQUIRE(v == 0.0f);
    for (double v : o.to_vector<double>()) REQUIRE(v == 1.0);
    for (float v : f.to_vector<float>()) REQUIRE(v == 2.5f);
    REQUIRE(z.numel() == 15);
    REQUIRE(z.dim() == 2);
    REQUIRE(z.size(-1) == 5);
    REQUIRE(Tensor::zeros({0, 4}).numel() == 0);
    REQUIRE(Tensor::zeros({}).numel() == 1);
    // An empty tensor casts to an empty tensor of every dtype.
    for (DType t : {DType::f64, DType::f32, DType::i32, DType::bf16, DType::f16}) {
        Tensor e = Tensor::zeros({0, 4}).to(t);
        REQUIRE(e.dtype() == t);
        REQUIRE(e.shape() == Shape{0, 4});
    }
}

TEST_CASE("empty tensors are poisoned in tests", "[tensor]") {
    Tensor t = Tensor::empty({4});
    for (float v : t.to_vector<float>()) REQUIRE(std::isnan(v));
}

TEST_CASE("from_vector round-trips and checks the count", "[tensor]") {
    std::vector<float> v{1, 2, 3, 4, 5, 6};
    Tensor t = Tensor::from_vector(v, {2, 3});
    REQUIRE(t.to_vector<float>() == v);
    REQUIRE(t.to_vector<double>()[5] == 6.0);
    REQUIRE_THROWS_WITH(Tensor::from_vector(v, {4, 2}),
                        ContainsSubstring("[from_vector]") && ContainsSubstring("holds 8 elements, got 6"));
    std::vector<std::int32_t> ids{3, 1, 4};
    REQUIRE(Tensor::from_vector(ids, {3}).dtype() == DType::i32);
}

TEST_CASE("reshape and slice are views that share storage", "[tensor]") {
    Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
    Tensor r = t.reshape({2, -1});
    REQUIRE(r.shape() == Shape{2, 4});
    REQUIRE(r.raw_data() == t.raw_data());
    Tensor s = t.slice(1, 3);
    REQUIRE(s.shape() == Shape{2, 2});
    REQUIRE(s.to_vector<float>() == std::vector<float>{2, 3, 4, 5});
    s.data<float>()[0] = 42.0f;  // writes through to t
    REQUIRE(t.to_vector<float>()[2] == 42.0f);
    REQUIRE_THROWS_WITH(t.reshape({3, 3}), ContainsSubstring("[reshape] cannot view (4, 2)"));
    REQUIRE_THROWS_WITH(t.slice(2, 5), ContainsSubstring("[slice] rows [2, 5) are out of range"));
}

TEST_CASE("bf16 and f16 conversions round to nearest even", "[tensor][dtype]") {
    // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties to even gives 1.
    REQUIRE(half::bf16_to_float(half::float_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
    REQUIRE(half::bf16_to_float(half::float_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
    // f16: 1 + 2^-11 ties to 1; 65504 is the largest finite; 65520 rounds to infinity.
    REQUIRE(half::f16_to_float(half::float_to_f16(1.0f + 1.0f / 2048)) == 1.0f);
    REQUIRE(half::f16_to_float(half::float_to_f16(65504.0f)) == 65504.0f);
    REQUIRE(std::isinf(half::f16_to_float(half::float_to_f16(65520.0f))));
    // Subnormals: 2^-24 is the smallest f16; half of it ties to 0.
    REQUIRE(half::f16_to_float(half::float_to_f16(5.9604645e-8f)) == 5.9604645e-8f);
    REQUIRE(half::f16_to_float(half::float_to_f16(2.9802322e-8f)) == 0.0f);
    REQUIRE(std::isnan(half::f16_to_float(half::float_to_f16(std::nanf("")))));
    REQUIRE(std::isnan(half::bf16_to_float(half::float_to_bf16(std::nanf("")))));
    // Every f16 value survives a round trip through float.
    for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
        auto h = static_cast<std::uint16_t>(bits);
        float f = half::f16_to_float(h);
        if (!std::isnan(f)) REQUIRE(half::float_to_f16(f) == h);
    }
}

TEST_CASE("casts between every dtype", "[tensor][dtype]") {
    Tensor x = Tensor::from_vector(std::vector<float>{-2.5f, 0.15625f, 3.0f, 1000.0f}, {4});
    // Each value is exact in every dtype, so every round trip gives it back exactly.
    for (DType t : {DType::f64, DType::bf16, DType::f16, DType::f32}) {
        Tensor y = x.to(t).to(DType::f32);
        REQUIRE(y.dtype() == DType::f32);
        REQUIRE(y.to_vector<float>() == x.to_vector<float>());
    }
    // Ties round to the even neighbour: 1 + 2^-8 and 1 + 3 x 2^-8 lie halfway between bf16
    // values (7 fraction bits), 1 + 2^-11 and 1 + 3 x 2^-11 between f16 values (10 bits).
    const auto rounded = [](std::vector<float> v, DType t) {
        return Tensor::from_vector(v, {2}).to(t).to(DType::f32).to_vector<float>();
    };
    CHECK(rounded({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f}, DType::bf16) ==
          std::vector<float>{1.0f, 1.0f + 0x1p-6f});
    CHECK(rounded({1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f}, DType::f16) ==
          std::vector<float>{1.0f, 1.0f + 0x1p-9f});
    REQUIRE(x.to(DType::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>{-2, 0, 3, 1000});
}

TEST_CASE("printing shows values, shape, dtype and device", "[tensor]") {
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
    std::string s = t.str();
    REQUIRE_THAT(s, ContainsSubstring("1.0000") && ContainsSubstring("shape=(2, 2)") && ContainsSubstring("dtype=f32") &&
                        ContainsSubstring("device=cpu"));
    Tensor big = Tensor::zeros({100, 100});
    REQUIRE_THAT(big.str(), ContainsSubstring("..."));
    t.set_requires_grad(true);
    REQUIRE_THAT(scale(t, 2.0).str(), ContainsSubstring("grad_fn=scale"));
}

TEST_CASE("philox is counter-based and seeded", "[random]") {
    Generator a(7), b(7), c(8);
    Tensor x = randn({1000}, Device::cpu, &a);
    Tensor y = randn({1000}, Device::cpu, &b);
    Tensor z = randn({1000}, Device::cpu, &c);
    REQUIRE(x.to_vector<float>() == y.to_vector<float>());
    REQUIRE(x.to_vector<float>() != z.to_vector<float>());
    REQUIRE(a.offset() == 1000);
    // Drawing 500 then 500 gives the same numbers as 1000 at once.
    Generator d(7);
    std::vector<float> first = randn({500}, Device::cpu, &d).to_vector<float>();
    std::vector<float> second = randn({500}, Device::cpu, &d).to_vector<float>();
    first.insert(first.end(), second.begin(), second.end());
    REQUIRE(first == x.to_vector<float>());
    // Known-answer vector (Random123's philox4x32-10 with zero counter and key).
    philox::Words w = philox::philox4x32_10(0, 0);
    REQUIRE(w.w[0] == 0x6627e8d5u);
    REQUIRE(w.w[1] == 0xe169c58du);
    REQUIRE(w.w[2] == 0xbc57ac4cu);
    REQUIRE(w.w[3] == 0x9b00dbd8u);
}

TEST_CASE("random distributions have the right moments", "[random]") {
    Generator g(3);
    std::vector<float> n = randn({200000}, Device::cpu, &g).to_vector<float>();
    std::vector<float> u = rand({200000}, Device::cpu, &g).to_vector<float>();
    std::vector<float> b = bernoulli({200000}, 0.3f, Device::cpu, &g).to_vector<float>();
    double mn = 0, vn = 0, mu = 0, mb = 0;
    for (float v : n) mn += v;
    mn /= n.size();
    for (float v : n) vn += (v - mn) * (v - mn);
    vn /= n.size();
    for (float v : u) {
        REQUIRE(v >= 0.0f);
        REQUIRE(v < 1.0f);
        mu += v;
    }
    for (float v : b) mb += v;
    REQUIRE(std::fabs(mn) < 0.01);
    REQUIRE(std::fabs(vn - 1.0) < 0.01);
    REQUIRE(std::fabs(mu / u.size() - 0.5) < 0.01);
    REQUIRE(std::fabs(mb / b.size() - 0.3) < 0.01);
    std::vector<std::int32_t> ids = randint({1000}, 65, Device::cpu, &g).to_vector<std::int32_t>();
    for (std::int32_t id : ids) {
        REQUIRE(id >= 0);
        REQUIRE(id < 65);
    }
}

TEST_CASE("memory counters track bytes in use and peak", "[allocator]") {
    reset_peak_memory(Device::cpu);
    MemoryStats before = memory_stats(Device::cpu);
    {
        Tensor t = Tensor::empty({1024, 1024});  // 4 MiB
        MemoryStats during = memory_stats(Device::cpu);
        REQUIRE(during.bytes_in_use >= before.bytes_in_use + (4u << 20));
        REQUIRE(during.peak_bytes_in_use >= during.bytes_in_use);
    }
    MemoryStats after = memory_stats(Device::cpu);
    REQUIRE(after.bytes_in_use == before.bytes_in_use);
    REQUIRE(after.peak_bytes_in_use >= before.bytes_in_use + (4u << 20));
    REQUIRE_THAT(format_memory_stats(after), ContainsSubstring("peak"));
}

TEST_CASE("dropout decisions: four per Philox call, the same one by one", "[random]") {
    // keep4 from an aligned counter makes one call; from any other counter, four. Both must
    // agree with keep() counter by counter, which is what every CPU reference uses.
    for (std::uint64_t first : {0ull, 4ull, 5ull, 6ull, 7ull, 1000003ull}) {
        bool kept[4];
        philox::keep4(99, first, 0.3f, kept);
        for (int e = 0; e < 4; ++e) CHECK(kept[e] == philox::keep(99, first + e, 0.3f));
    }
    // Each of the four words is used: about 30% dropped over many counters, in every position.
    int dropped[4] = {};
    for (std::uint64_t c = 0; c < 40000; ++c) dropped[c % 4] += !philox::keep(5, c, 0.3f);
    for (int e = 0; e < 4; ++e) CHECK(std::abs(dropped[e] - 3000) < 200);
    // Ops claim counters from a multiple of 4.
    Generator g(1);
    g.advance(5);
    CHECK(g.advance_aligned(10) == 8);
    CHECK(g.offset() == 18);
}
