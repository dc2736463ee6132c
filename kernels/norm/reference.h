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
//   version 3, the row in registers. A row is laid over a group of threads (32 to 512, two
//     16-byte vectors each in the forward, one in the backward; short rows share a block); a thread loads its vectors once, with
//     16-byte loads, keeps them in registers through the row sums and computes its outputs from
//     them: x read once, 4-8 values a load instruction.
//
//   Versions 1-3 share dw / db: a separate kernel, one thread per column, looping over the rows
//     and recomputing x_hat from x, mean and rstd. No atomics, no workspace, deterministic; but
//     only N threads, each walking all M rows: at N = 384 three blocks for the whole GPU.
//
//   version 4, dw / db by lock-guarded partial rows. Version 3's backward in a grid of as many
//     blocks as the GPU holds at once, striding over the rows; each thread adds its columns'
//     dy * x_hat and dy into fp32 registers as it goes. At the end, block b adds its sums into
//     one of G shared fp32 partial rows (g = b mod G, G = B / 2 rounded up) while holding spin
//     lock g (the acquire / release ordering is written out beside the kernel), and a small
//     kernel adds up the G rows. Not bitwise repeatable: blocks take a lock in any order.
//
//   version 5, dw / db by a persistent grid's partial rows. The same grid and register sums,
//     but block b writes its sums as partial row b of a (B, N) buffer, with plain stores: no
//     lock, no atomic, no clearing. The same column sum adds the B rows in a fixed order: the
//     same bits on every run.
//
//   The tuned kernels (kernels/norm.h; their sources sit beside this file) extend these: on top
//   of version 3, rows per block and threads a row sized by measured rules, x kept in its storage
//   type, a looped kernel for rows too long for registers, prefetching; on Hopper, row groups
//   staged in shared memory by bulk copies while the previous group is worked on, and long rows
//   split over a cluster of blocks. Their backward sums dw / db as version 4 (strategy locked)
//   or version 5 (strategy grid, the default, whose staged grid also adds its own partial rows);
//   and tuning knobs (NormTuning) for all of it.
//
// Both entry points take the tuned kernels' argument structs with the same meaning (every type,
// option and empty shape), ignoring NormBackwardArgs::reduction and the tuning. Versions 4 and 5
// need NormBackwardArgs::workspace, of norm_backward_reference_workspace_bytes. Versions 3-5 hold
// a row in registers: rows of more than 4096 16-byte vectors (32768 bf16 or 16384 f32 values)
// throw std::invalid_argument, and so, for versions 4 and 5, which also keep two sums a column,
// do rows of more than 8192 values. All accumulation is in fp32. They launch on fusegrad's stream and
// never synchronise. tests/gpu/test_gpu_norm_reference.cpp checks every version against float64,
// versions 3-5 against version 2, and every tuned path against version 2.
#pragma once

#include "../norm.h"

namespace fg::kernels {

// The versions: 1 to kNormReferenceVersions. Another version, or weights neither f32 nor x's type,
// throw std::invalid_argument. The forward of versions 4 and 5 is version 3's.
constexpr int kNormReferenceVersions = 5;
void norm_forward_reference(const NormForwardArgs& a, int version);
void norm_backward_reference(const NormBackwardArgs& a, int version);
// Bytes of workspace norm_backward_reference needs (0 but for versions 4 and 5 with dw or db).
std::size_t norm_backward_reference_workspace_bytes(const NormBackwardArgs& a, int version);

}  // namespace fg::kernels
