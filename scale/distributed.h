// scale/distributed.h: the parts of data-parallel training that do not need a GPU.
//
// Several processes (ranks; on GPUs one a GPU) train one model: each computes the gradients of
// its share of every batch, the gradients are summed across ranks (scale/grad_exchange.h: over
// TCP for CPU ranks, NCCL for CUDA ranks), and every rank applies the same update, so the ranks'
// weights stay identical. What this file holds:
//   DistributedEnv    who this process is: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
//                     MASTER_PORT as torchrun sets them (or SLURM_PROCID, SLURM_NTASKS,
//                     SLURM_LOCALID as Slurm does), with an error naming what is missing or wrong;
//   TcpGroup          the ranks meeting over TCP at MASTER_ADDR:MASTER_PORT (rank 0 listens, the
//                     others connect): how NCCL's unique id, made by rank 0, reaches the others;
//                     a barrier; and sums, reduce-scatters and gathers through rank 0 (CPU ranks'
//                     gradients; every rank's loss, stop request and ZeRO's norm);
//   shard_batch       a rank's rows of a batch: every rank draws the same global batch from the
//                     same generator and keeps its slice, so N ranks see exactly the rows one
//                     process would;
//   plan_buckets      the gradients grouped into buckets for the all-reduce, in the order the
//                     backward finishes them (the last layers first), so that a bucket's
//                     all-reduce can start while the backward of earlier layers still runs;
//   layout_buckets    ZeRO-1's cut of each bucket into one equal slice a rank, and
//   shard_pieces      the parts of parameters that a rank's slice holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "train/data.h"

namespace fg {

struct DistributedEnv {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;  // the GPU of this process on its host
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    // What a rank proves it belongs to this job with, in its hello: FUSEGRAD_JOB_TOKEN (which
    // `fusegrad train --ranks` sets to a random value), else one derived from the launcher's job
    // id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID), else empty: then any process that reaches
    // MASTER_ADDR:MASTER_PORT first may take a rank's place, as with torchrun's own defaults.
    std::string job_token;
    bool distributed() const { return world_size > 1; }
};

// The longest job token a hello carries (longer FUSEGRAD_JOB_TOKEN values are an error).
constexpr std::size_t kJobTokenMax = 64;

// Called by every wait of TcpGroup's (at least every 200 ms) while it is set: true makes the
// wait stop with an error saying what it was waiting for. The trainer sets it to its stop
// request (SIGTERM, Ctrl-C) for the rendezvous only, and clears it after: later a stop is agreed
// on between steps. Default: none.
void set_wait_interrupt(bool (*interrupted)());

// Reads the environment through `lookup` (std::getenv by default; a test passes its own). No
// variable set: one process. An error names the variable and its value when one is missing,
// not a number, or out of range (RANK >= WORLD_SIZE, a port outside 1-65535).
DistributedEnv distributed_env(
    const std::function<const char*(const char*)>& lookup = [](const char* name) {
        return static_cast<const char*>(std::getenv(name));
    });

// The ranks' TCP rendezvous: rank 0 listens on master_addr:master_port (that address only, not
// every interface), every other rank connects (retrying until `timeout_s`) and sends a hello
// with its rank, the world size and the job token; the connections stay open for broadcast and
// barrier. A connection that does not send a hello of this job within a few seconds (a port
// scan, a stray client, another job's rank) is dropped and reported on stderr, not fatal. Every
// call blocks until all ranks made it, or throws after timeout_s naming the ranks that did not
// come; rank 0 says every 10 s which ranks it still waits for and how long is left.
class TcpGroup {
public:
    TcpGroup(const DistributedEnv& env, double timeout_s);
    ~TcpGroup();
    TcpGroup(const TcpGroup&) = delete;
    TcpGroup& operator=(const TcpGroup&) = delete;

    // Rank 0's `bytes` on every rank (other ranks' argument is ignored).
    std::vector<std::uint8_t> broadcast(const std::vector<std::uint8_t>& bytes);
    // Returns once every rank has called it.
    void barrier();
    // Sums n values over the ranks, in place; every rank gets the same bits (rank 0 adds the
    // ranks' values in rank order and sends the sums back). CPU ranks' gradients, and any
    // rank's host values (the loss, a stop request, ZeRO's gradient norm).
    void all_reduce_sum(float* values, std::size_t n);
    void all_reduce_sum(double* values, std::size_t n);
    // Sums `in` (world_size * n values) over the ranks and leaves this rank's slice of the sums
    // (n values from rank * n) in `out`: the bits all_reduce_sum would give there.
    void reduce_scatter_sum(const float* in, float* out, std::size_t n);
    // The same for bf16 values (16-bit words): rank 0 adds them in float, in rank order, and
    // rounds each sum once.
    void all_reduce_sum_bf16(std::uint16_t* values, std::size_t n);
    void reduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out, std::size_t n);
    // Every rank's n values of `in`, in rank order, into `out` (world_size * n values); `in` may
    // be this rank's slice of `out`.
    void all_gather(const float* in, float* out, std::size_t n);
    // Every rank's bytes, in rank order, on every rank.
    std::vector<std::vector<std::uint8_t>> all_gather(const std::vector<std::uint8_t>& bytes);
    // Shuts the connections down (the sockets stay open until destruction): a call blocked in
    // another thread returns with an error at once. For a rank that is failing.
    void shutdown() noexcept;
    // Without waiting: "" while every connection is open, else which rank's closed (it stopped).
    // Rank 0 sees every rank; the others see rank 0, which stops when any rank does.
    std::string peers_lost() const;
    int rank() const { return env_.rank; }
    int world_size() const { return env_.world_size; }

private:
    template <typename T>
    void sum_in_rank_order(T* values, std::size_t n);
    // Rank 0 receives every rank's `ranks * n` values of type Wire, adds them as Sum in rank
    // order, and sends each rank slice r of the sums (all of them when `whole`), as Wire.
    template <typename Wire, typename Sum, typename Widen, typename Narrow>
    void sum_and_scatter(const Wire* in, Wire* out, std::size_t n, bool whole, Widen widen,
                         Narrow narrow);
    void send_all(int fd, const void* data, std::size_t n, const char* what);
    void recv_all(int fd, void* data, std::size_t n, const char* what);

    DistributedEnv env_;
    double timeout_s_;
    int listen_fd_ = -1;
    std::vector<int> peers_;  // rank 0: the socket of rank i at [i - 1]; others: rank 0's at [0]
};

// Rows [rank B / N, (rank + 1) B / N) of a batch of B rows (inputs and targets), N = world_size;
// B must be a multiple of N.
Batch shard_batch(const Batch& global, int rank, int world_size);

struct GradBucket {
    std::vector<int> params;  // indices into the parameter list, in the order they were placed
    std::size_t bytes = 0;
};
// The parameters (numels[i] elements of bytes_per_element each, in registration order) grouped
// into buckets: from the last parameter to the first, each bucket taking consecutive ones while
// it stays within cap_bytes (a parameter larger than the cap gets a bucket of its own). Every
// parameter is in exactly one bucket.
std::vector<GradBucket> plan_buckets(const std::vector<std::int64_t>& numels,
                                     std::size_t bytes_per_element, std::size_t cap_bytes);

// A bucket packed flat: its parameters one after another (offsets[k] is where params[k] starts),
// `numel` values, then zeros up to `padded`, a multiple of the number of ranks, so that it cuts
// into world_size slices of `shard` values: under ZeRO-1 (train.zero: 1) rank r owns slice r of
// every bucket (it receives those gradients' sums, keeps AdamW's moments for them, updates them
// and sends them to the others).
struct BucketLayout {
    std::vector<int> params;
    std::vector<std::int64_t> offsets;
    std::int64_t numel = 0, padded = 0, shard = 0;
};
std::vector<BucketLayout> layout_buckets(const std::vector<GradBucket>& buckets,
                                         const std::vector<std::int64_t>& numels, int world_size);

// The part of one parameter in a rank's slice of a bucket: `count` values, from element
// `param_offset` of the parameter and from `shard_offset` of the slice.
struct ShardPiece {
    int param = 0;
    std::int64_t param_offset = 0, shard_offset = 0, count = 0;
};
// The pieces of slice `rank` of `bucket`, in the bucket's order (the padding is in none).
std::vector<ShardPiece> shard_pieces(const BucketLayout& bucket, int rank);

}  // namespace fg
