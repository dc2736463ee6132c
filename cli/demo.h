// cli/demo.h: `fusegrad demo`, a tour of the core in one function: a two-layer MLP classifier
// trained with autograd and plain SGD on a synthetic, seeded task.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace fg {

struct DemoOptions {
    Device device = Device::cpu;
    int steps = 300;
    std::uint64_t seed = 1;
};

// Trains and prints the loss curve, the accuracy and memory use; returns the final accuracy.
double run_demo(const DemoOptions& options);

}  // namespace fg
