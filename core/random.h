// core/random.h: seeded random tensors from the counter-based Philox generator (kernels/philox.h).
// A Generator is just (seed, offset): a draw of n numbers uses counters offset .. offset + n - 1
// and advances the offset by n. Element i is a pure function of (seed, offset + i), so the CPU
// and the GPU give identical tensors for the same seed and offset, and saving (seed, offset) in a
// checkpoint is enough to resume the stream exactly.
#pragma once

#include <cstdint>

#include "tensor.h"

namespace fg {

class Generator {
public:
    explicit Generator(std::uint64_t seed = 0) : seed_(seed) {}
    std::uint64_t seed() const { return seed_; }
    std::uint64_t offset() const { return offset_; }
    void set_state(std::uint64_t seed, std::uint64_t offset) {
        seed_ = seed;
        offset_ = offset;
    }
    // Claims n counters; returns the first.
    std::uint64_t advance(std::uint64_t n) {
        std::uint64_t first = offset_;
        offset_ += n;
        return first;
    }
    // The same, starting at a multiple of 4 (dropout draws four decisions per Philox call: see
    // kernels/philox.h); up to 3 counters are skipped. With a shard set (below), the draw is
    // this rank's share of a draw of `shards` times n counters: it returns the first counter of
    // share `shard`, and the generator moves past all of them.
    std::uint64_t advance_aligned(std::uint64_t n) {
        offset_ = (offset_ + 3) / 4 * 4;
        if (shards_ == 1) return advance(n);
        const std::uint64_t stride = (n + 3) / 4 * 4;
        const std::uint64_t first = offset_ + static_cast<std::uint64_t>(shard_) * stride;
        offset_ += static_cast<std::uint64_t>(shards_) * stride;
        return first;
    }
    // Data-parallel ranks hold shard `shard` of `shards` equal slices of
    // every batch, in rank order: drawing dropout masks through advance_aligned, each rank then
    // gets the counters one process would use for its rows, and so the same masks.
    void set_shard(int shard, int shards) {
        shard_ = shard;
        shards_ = shards;
    }

private:
    std::uint64_t seed_;
    std::uint64_t offset_ = 0;
    int shard_ = 0, shards_ = 1;
};

// The process-wide generator that ops use when none is given (dropout, init).
Generator& default_generator();
void manual_seed(std::uint64_t seed);  // resets the default generator to (seed, 0)

// f32 tensors; gen = nullptr draws from the default generator.
Tensor rand(const Shape& shape, Device device = Device::cpu, Generator* gen = nullptr);
Tensor randn(const Shape& shape, Device device = Device::cpu, Generator* gen = nullptr,
             float mean = 0.0f, float stddev = 1.0f);
Tensor bernoulli(const Shape& shape, float p, Device device = Device::cpu,
                 Generator* gen = nullptr);
// Uniform integers in [0, high), i32: for token ids and targets in tests and data sampling.
Tensor randint(const Shape& shape, std::int32_t high, Device device = Device::cpu,
               Generator* gen = nullptr);

}  // namespace fg
