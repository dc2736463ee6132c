// kernels/nccl.h: NCCL, the library that sums tensors across GPUs, as data-parallel training
// uses it (train/distributed.h): one communicator a process, its GPU's gradients summed in place
// on fusegrad's stream. Plain C++ (no CUDA types), so core/ and train/ can include it. Built from
// kernels/nccl.cpp with NCCL (FG_NCCL, cmake/FusegradNccl.cmake), else from kernels/nccl_stub.cpp,
// whose functions say NCCL is missing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

// "" when this build has NCCL, else why not (naming FG_NCCL).
std::string nccl_unavailable();
// NCCL's version, e.g. "2.27.7"; "" without NCCL.
std::string nccl_version();
// The id every rank's communicator is made from: rank 0 makes it, the others receive it (over
// TCP: train/distributed.h's TcpGroup::broadcast).
std::vector<std::uint8_t> nccl_unique_id();
// This process's communicator among world_size ranks (collective: every rank calls it).
void* nccl_communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank);
void nccl_destroy(void* communicator) noexcept;
// Sums `count` values of `type` (f32, bf16 or f16) in place over the ranks, on fusegrad's stream;
// every rank gets the same bits.
void nccl_all_reduce_sum(void* communicator, void* data, std::size_t count, ScalarType type);

}  // namespace fg::kernels
