// tests/poison.cpp: turns on poisoning of new tensors for the whole test binary (see
// test_helpers.h). A static initialiser that sets a flag: it touches no CUDA state, so test
// discovery at build time stays safe on machines without a GPU.
#include "core/tensor.h"

namespace {
const bool g_poison_on = (fg::set_poison_new_tensors(true), true);
}  // namespace
