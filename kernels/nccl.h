// kernels/nccl.h: NCCL, the library that sums tensors across GPUs, as data-parallel training
// uses it: one communicator a process, with a stream of its own on which
// the gradients are summed while fusegrad's stream goes on with the backward. Plain C++ (no CUDA
// types), so host code anywhere can include it. Built from kernels/nccl.cpp with NCCL (FG_NCCL,
// cmake/FusegradNccl.cmake), else from kernels/nccl_stub.cpp, whose functions say NCCL is
// missing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

// "" when this build has NCCL, else why not (naming FG_NCCL).
std::string nccl_unavailable();
// NCCL's version, e.g. "2.27.7"; "" without NCCL.
std::string nccl_version();
// The id every rank's communicator is made from: rank 0 makes it, the others receive it (by any
// channel the ranks share, such as their TCP rendezvous).
std::vector<std::uint8_t> nccl_unique_id();
// This process's communicator among world_size ranks (collective: every rank calls it).
void* nccl_communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank);
// Frees the communicator: destroyed when its collectives are done, aborted otherwise (a rank
// failing mid-exchange must not wait for peers that may never come).
void nccl_destroy(void* communicator) noexcept;
// The collectives. Each is queued on the communicator's own stream, after all the work already
// queued on fusegrad's stream (so it reads what that work wrote), and runs beside whatever is
// queued there afterwards: how the gradients' exchange overlaps the backward. nccl_join makes
// fusegrad's stream wait for every collective queued so far; until then, work on fusegrad's
// stream must not touch their buffers. Every rank must queue the same collectives in the same
// order. Types: f32, bf16, f16 or i32.
// Sums `count` values in place over the ranks; every rank gets the same bits.
void nccl_all_reduce_sum(void* communicator, void* data, std::size_t count, ScalarType type);
// Sums `in` (world_size * count values) over the ranks and leaves this rank's slice of the sums
// (`count` values from rank * count) in `out`.
void nccl_reduce_scatter_sum(void* communicator, const void* in, void* out, std::size_t count,
                             ScalarType type);
// Every rank's `count` values of `in`, in rank order, into `out` (world_size * count values);
// `in` may be this rank's slice of `out` (out + rank * count).
void nccl_all_gather(void* communicator, const void* in, void* out, std::size_t count,
                     ScalarType type);
// fusegrad's stream waits (on the GPU; the host does not) for the collectives queued so far.
void nccl_join(void* communicator);
// nccl_join, then the host waits until the collectives queued so far are done, checking as it
// waits NCCL's asynchronous error state and `peers_lost` (which says why the other ranks are
// gone, or "": NCCL does not notice a peer that died on the same host): on an error, a lost
// peer or after timeout_s, the communicator is aborted (its kernels stop) and an error says
// why, instead of a hang; where the abort itself does not end within 5 s (collectives queued
// in a captured step's later replays), the process ends, saying why.
void nccl_synchronize(void* communicator, double timeout_s,
                      const std::function<std::string()>& peers_lost);
// The host waits, checking as nccl_synchronize does, until `event` (runtime.h's event_create) has
// happened, or with a null `event` until all the work queued on fusegrad's stream so far is done:
// for work that may hold collectives of its own (a captured step's graph).
void nccl_wait(void* communicator, void* event, double timeout_s,
               const std::function<std::string()>& peers_lost);

}  // namespace fg::kernels
