// core/random.cpp: see random.h. The CPU loops and the CUDA kernels call the same philox.h
// functions with the same counters.
#include "random.h"

#include "cuda_backend.h"
#include "error.h"
#include "kernels/philox.h"

namespace fg {

Generator& default_generator() {
    static Generator gen(0);
    return gen;
}

void manual_seed(std::uint64_t seed) { default_generator().set_state(seed, 0); }

namespace {

Generator& pick(Generator* gen) { return gen ? *gen : default_generator(); }

// A new f32 tensor of `shape` from the generator's next numel() counters: on CUDA by
// fill(out, n, seed, offset), on the CPU element i by value(seed, offset + i).
template <typename Value, typename Fill>
Tensor draw(const Shape& shape, Device device, Generator* gen, Value value, Fill fill) {
    Tensor t = Tensor::empty(shape, DType::f32, device);
    std::int64_t n = t.numel();
    Generator& g = pick(gen);
    std::uint64_t offset = g.advance(static_cast<std::uint64_t>(n));
    float* out = t.data<float>();
    if (device == Device::cuda) fill(out, n, g.seed(), offset);
    else for (std::int64_t i = 0; i < n; ++i) out[i] = value(g.seed(), offset + i);
    return t;
}

}  // namespace

Tensor rand(const Shape& shape, Device device, Generator* gen) {
    auto value = [](auto seed, auto i) { return philox::uniform(seed, i); };
    return draw(shape, device, gen, value, [](float* out, std::int64_t n, auto... counter) {
        cuda_backend("rand").random_uniform_f32(out, n, counter...);
    });
}

Tensor randn(const Shape& shape, Device device, Generator* gen, float mean, float stddev) {
    auto value = [=](auto seed, auto i) { return philox::normal(seed, i, mean, stddev); };
    return draw(shape, device, gen, value, [=](float* out, std::int64_t n, auto... counter) {
        cuda_backend("randn").random_normal_f32(out, n, mean, stddev, counter...);
    });
}

Tensor bernoulli(const Shape& shape, float p, Device device, Generator* gen) {
    FG_CHECK(p >= 0.0f && p <= 1.0f, "bernoulli", "p must be in [0, 1], got ", p);
    auto value = [=](auto seed, auto i) { return philox::uniform(seed, i) < p ? 1.0f : 0.0f; };
    return draw(shape, device, gen, value, [=](float* out, std::int64_t n, auto... counter) {
        cuda_backend("bernoulli").random_bernoulli_f32(out, n, p, counter...);
    });
}

Tensor randint(const Shape& shape, std::int32_t high, Device device, Generator* gen) {
    FG_CHECK(high > 0, "randint", "high must be positive, got ", high);
    Generator& g = pick(gen);
    std::int64_t n = shape_numel(shape);
    std::uint64_t offset = g.advance(static_cast<std::uint64_t>(n));
    std::vector<std::int32_t> values(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        // 32 random bits reduced by multiply-shift: unbiased enough for vocabularies < 2^16.
        std::uint32_t bits = philox::philox4x32_10(g.seed(), offset + i).w[0];
        values[i] = static_cast<std::int32_t>((static_cast<std::uint64_t>(bits) * high) >> 32);
    }
    return Tensor::from_vector(values, shape, device);
}

}  // namespace fg
