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

}  // namespace

Tensor rand(const Shape& shape, Device device, Generator* gen) {
    Tensor t = Tensor::empty(shape, DType::f32, device);
    std::int64_t n = t.numel();
    Generator& g = pick(gen);
    std::uint64_t offset = g.advance(static_cast<std::uint64_t>(n));
    if (device == Device::cuda) {
        cuda_backend("rand").random_uniform_f32(t.data<float>(), n, g.seed(), offset);
    } else {
        float* out = t.data<float>();
        for (std::int64_t i = 0; i < n; ++i) out[i] = philox::uniform(g.seed(), offset + i);
    }
    return t;
}

Tensor randn(const Shape& shape, Device device, Generator* gen, float mean, float stddev) {
    Tensor t = Tensor::empty(shape, DType::f32, device);
    std::int64_t n = t.numel();
    Generator& g = pick(gen);
    std::uint64_t offset = g.advance(static_cast<std::uint64_t>(n));
    if (device == Device::cuda) {
        cuda_backend("randn").random_normal_f32(t.data<float>(), n, mean, stddev, g.seed(), offset);
    } else {
        float* out = t.data<float>();
        for (std::int64_t i = 0; i < n; ++i)
            out[i] = philox::normal(g.seed(), offset + i, mean, stddev);
    }
    return t;
}

Tensor bernoulli(const Shape& shape, float p, Device device, Generator* gen) {
    FG_CHECK(p >= 0.0f && p <= 1.0f, "bernoulli", "p must be in [0, 1], got ", p);
    Tensor t = Tensor::empty(shape, DType::f32, device);
    std::int64_t n = t.numel();
    Generator& g = pick(gen);
    std::uint64_t offset = g.advance(static_cast<std::uint64_t>(n));
    if (device == Device::cuda) {
        cuda_backend("bernoulli").random_bernoulli_f32(t.data<float>(), n, p, g.seed(), offset);
    } else {
        float* out = t.data<float>();
        for (std::int64_t i = 0; i < n; ++i)
            out[i] = philox::uniform(g.seed(), offset + i) < p ? 1.0f : 0.0f;
    }
    return t;
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
