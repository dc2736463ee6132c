// kernels/norm/reference.h: the reference tier of the fused RMSNorm / LayerNorm kernels. Read
// these first: they compute what kernels/norm.h's tuned norm_forward / norm_backward compute (the
// math is stated there), in the plainest CUDA that is still correct, and the GPU tests check the
// tuned kernels against them. The ladder, each step adding one idea:
//
//   version 1, one thread per row. A thread walks its whole row in a loop: the row's sums, then
//     its outputs. No cooperation between threads, so nothing to synchronise. Its limits: a row
//     is read by one thread, one value at a time (a long row is a long serial chain), and the 32
//     threads of a warp read 32 different rows, addresses a whole row apart: each load touches 32
//     separate memory segments (uncoalesced), and short or few rows leave most of the GPU idle.
//
//   version 2, one warp per row. The 32 lanes of a warp stride through the row together, lane l
//     taking columns l, l + 32, ...: neighbouring lanes read neighbouring values (coalesced
//     loads), and a row's sums are added across the warp with __shfl_xor_sync (no shared memory,
//     no __syncthreads). Same passes over the row as version 1, a 32nd of the serial work.
//
//   Both versions share dw / db: a separate kernel, one thread per column, looping over the rows
//   and recomputing x_hat from x, mean and rstd. No atomics, no workspace, deterministic.
//
//   The tuned kernels (kernels/norm.h; their sources sit beside this file) add, on top of
//   version 2: 16-byte vectorised loads and stores; several rows per block, the threads a row
//   sized to the row; the row held in registers between its sums and its outputs (x read once,
//   not two or three times); a looped kernel for rows too long for registers; dw / db summed in
//   the same pass as dx, into fp32 partial rows (a persistent grid, one partial row per block, or
//   lock-guarded shared partial rows), then a column reduction; on Hopper, row groups staged in
//   shared memory by bulk copies while the previous group is worked on, and long rows split over
//   a cluster of blocks; and tuning knobs (NormTuning) for all of it.
//
// Both entry points take the tuned kernels' argument structs with the same meaning (every type,
// option and empty shape), ignoring NormBackwardArgs::reduction and ::workspace and the tuning.
// All accumulation is in fp32. They launch on fusegrad's stream and never synchronise.
// tests/gpu/test_gpu_norm_reference.cpp checks both versions against float64, and every tuned
// path against version 2.
#pragma once

#include "../norm.h"

namespace fg::kernels {

// version 1: one thread per row. version 2: one warp per row, shuffles. Another version, or
// weights neither f32 nor x's type, throw std::invalid_argument.
void norm_forward_reference(const NormForwardArgs& a, int version);
void norm_backward_reference(const NormBackwardArgs& a, int version);

}  // namespace fg::kernels
