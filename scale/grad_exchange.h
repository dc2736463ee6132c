// scale/grad_exchange.h: the gradients' exchange of data-parallel training, overlapped with the
// backward, and ZeRO-1's sharded AdamW.
//
// Each rank computes the gradients of its share of the batch; before the update they are summed
// over the ranks. GradientExchange does it in buckets (plan_buckets: the last parameters first,
// as the backward finishes them), flat buffers in which the parameters' gradients live as views
// (attach_gradients), so the backward writes into them directly. During the backward of a
// step's last micro-batch each parameter's post-accumulate hook (core/tensor.h) marks its
// gradient final; as soon as every gradient of a bucket is final, and the buckets before it have
// been started, the bucket's exchange starts on the side: on a thread of its own for CPU ranks
// (TCP), on NCCL's stream for CUDA ranks. The backward meanwhile goes on with earlier layers.
// finish() waits for the exchanges.
//
// Without ZeRO (train.zero: 0) every rank receives the whole sum (all-reduce), divides it by the
// number of ranks and unpacks it into the parameters' gradients, and every rank runs the same
// AdamW update. With ZeRO-1 (train.zero: 1) each rank receives only its slice of each bucket's
// sum (reduce-scatter; layout_buckets says which values), holds AdamW's moments for that slice
// alone (ShardedAdamW), updates those values of the parameters, and the ranks then exchange the
// updated values (all-gather), so that every rank holds all the weights again, bit for bit the
// same. The parameters themselves stay whole on every rank: they are the forward's weights.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "distributed.h"
#include "train/optim.h"

namespace fg {

// How the ranks exchange flat buffers of f32 or bf16 values (NCCL's sums: also i32). The calls are queued and carried
// out in order on the side (a thread of its own over TCP; the communicator's stream for NCCL); a
// buffer handed to one must not be read or written until wait() has returned. Every rank queues
// the same calls in the same order.
class Collectives {
public:
    virtual ~Collectives() = default;
    virtual void all_reduce_sum(void* data, std::size_t n, DType type) = 0;  // in place
    // `in`: world_size * n values; `out`: this rank's slice of their sums, n values.
    virtual void reduce_scatter_sum(const void* in, void* out, std::size_t n, DType type) = 0;
    // `out`: every rank's n f32 values, in rank order; `in` may be this rank's slice of `out`.
    virtual void all_gather(const float* in, float* out, std::size_t n) = 0;
    // Returns once the calls queued so far are done; rethrows the first failure.
    virtual void wait() = 0;
    // What comes after on fusegrad's stream waits for the calls queued so far: NCCL's, on the
    // GPU (the host goes on: how a captured step ends its exchange); TCP's, as wait().
    virtual void join() { wait(); }
    // Host values summed over the ranks at once (blocking, in rank order: every rank gets the
    // same bits), after wait().
    virtual void sum_on_host(double* values, std::size_t n) = 0;
};
// CPU ranks: TcpGroup's calls on a thread of their own. The group must outlive the object and
// nobody else may use it between a queued call and wait().
std::unique_ptr<Collectives> tcp_collectives(TcpGroup& group);
// CUDA ranks: NCCL's collectives on the communicator's stream (kernels/nccl.h); host sums over
// the TCP group. wait() returns when the collectives are done, and gives up on them (an error,
// the communicator aborted) when NCCL reports one or after timeout_s.
std::unique_ptr<Collectives> nccl_collectives(void* communicator, TcpGroup& group,
                                              double timeout_s);

class GradientExchange {
public:
    // `params` are f32 and all on one device; buckets of at most `bucket_bytes`; the sums travel
    // as `wire` values (f32, or bf16: half the bytes, each bucket rounded once before it is sent
    // and summed in float where the transport can).
    GradientExchange(std::vector<NamedParam> params, Collectives& comm, int rank, int world_size,
                     bool zero, std::size_t bucket_bytes, DType wire = DType::f32);
    ~GradientExchange();
    GradientExchange(const GradientExchange&) = delete;
    GradientExchange& operator=(const GradientExchange&) = delete;

    // Makes every parameter's gradient storage a view of its place in its bucket
    // (Tensor::set_grad_storage), so that the backward writes straight into the buckets: no copy
    // afterwards, no zeroing before (the first gradient overwrites), and no memory beyond one
    // gradient a parameter. Called at the start of a step, after zero_grad (without it, the
    // gradients are copied into the buckets).
    void attach_gradients();
    // Starts each bucket's exchange as soon as the next backward has finished its gradients
    // (the trainer arms the last micro-batch of a step; earlier ones only add up gradients), by
    // a post-accumulate hook on every parameter (removed by the destructor).
    void arm();
    // Starts the buckets not started yet (all of them without arm()), waits for the sums (the
    // host, or with `on_host` false only the stream: Collectives::join) and leaves the
    // gradients averaged over the ranks: without ZeRO in every parameter's grad(); with ZeRO in
    // shard_grads(), the parameters' gradients dropped. A parameter no backward of
    // the step reached is an error naming it (one process's AdamW would skip it; the ranks
    // cannot know that another rank's did not).
    void finish(bool on_host = true);

    bool zero() const { return zero_; }
    DType wire() const { return wire_; }
    std::size_t bucket_count() const { return layout_.size(); }
    std::size_t bucket_bytes_max() const;
    // How many buckets the last armed backward started before it ended (finish() started the
    // others): the overlap achieved.
    std::size_t started_during_backward() const { return started_early_; }
    // Bytes the exchange keeps between steps: the flat buckets (the gradients themselves once
    // attached), with bf16 sums their rounded copies (while they travel), and ZeRO's slice of
    // the sums (the averaged f32 slice lives from finish() to the update only).
    std::size_t buffer_bytes() const;

    // ZeRO-1. This rank's slice of every bucket, one after another (bucket b's at
    // shard_offset(b)), padding included.
    std::int64_t shard_numel() const { return shard_numel_; }
    std::int64_t shard_offset(std::size_t bucket) const { return shard_offsets_[bucket]; }
    const BucketLayout& bucket(std::size_t b) const { return layout_[b]; }
    int rank() const { return rank_; }
    int world_size() const { return world_; }
    // The averaged gradients of this rank's slices (from finish() until release_shard_grads()).
    const Tensor& shard_grads() const { return shard_grads_; }
    void release_shard_grads() { shard_grads_ = Tensor(); }
    // The gradients' global norm and clip factor (grad_norm's), from this rank's slices and the
    // other ranks' sums of squares.
    GradNorm grad_norm(double max_norm);
    // Every rank's updated slices of the parameters (`values`, one tensor a parameter) into
    // every rank's `values`: after ZeRO-1's update.
    void gather(const std::vector<Tensor*>& values);
    // Every rank's slice of `mine` (laid out as shard_grads), whole, one host tensor a parameter,
    // where `keep` (the rank that saves a checkpoint; the others only send theirs: empty).
    std::vector<Tensor> gather_on_host(const Tensor& mine, bool keep);

private:
    void install_hooks();
    void on_gradient(std::size_t param);
    void start(std::size_t bucket);
    // Every rank's slices into the buckets, this rank's from `values` or `mine`; then waits.
    void gather_into_buckets(const std::vector<Tensor*>* values, const Tensor* mine);

    std::vector<NamedParam> params_;
    Collectives& comm_;
    int rank_, world_;
    bool zero_;
    DType wire_;
    Device device_;
    std::vector<BucketLayout> layout_;
    std::vector<std::size_t> bucket_of_;    // the bucket of each parameter
    std::vector<int> pending_;              // per bucket: gradients not final yet
    std::vector<bool> received_;            // per parameter: a gradient came this step
    bool attached_ = false;                 // attach_gradients ran this step
    std::vector<Tensor> flat_;              // per bucket: the packed gradients (padded)
    std::vector<std::int64_t> shard_offsets_;
    std::int64_t shard_numel_ = 0;
    std::vector<Tensor> wire_flat_;         // bf16 wire: each bucket's rounded copy, until finish
    Tensor shard_sums_;                     // ZeRO: this rank's slices of the sums (wire type)
    Tensor shard_grads_;                    // ZeRO: the same divided by the number of ranks
    bool armed_ = false;
    std::size_t started_ = 0;               // buckets started, in order, since arm()
    std::size_t started_early_ = 0;
};

// AdamW (optim.h's arithmetic) for ZeRO-1: the moments of this rank's slices only (1 / world_size
// of AdamW's), the update of those values of the parameters from the exchange's shard_grads(),
// then the updated values gathered into every rank's parameters. For a checkpoint the moments are
// gathered whole on rank 0's host (gather_state) and saved as AdamW saves them, so a run resumes
// with any number of ranks, with or without ZeRO; a resume loads them on the host and keeps each
// rank's slice (prepare_state_load, shard_state).
class ShardedAdamW final : public Optimizer {
public:
    ShardedAdamW(std::vector<NamedParam> params, const AdamWOptions& options,
                 GradientExchange& exchange);
    using Optimizer::step;
    void step(double lr, const Tensor& grad_scale) override;
    // The whole moments, as AdamW names them, on the host: defined after gather_state() (on
    // rank 0) or prepare_state_load(), until shard_state().
    std::vector<std::pair<std::string, Tensor*>> named_state() override;
    const char* name() const override { return "adamw"; }
    void gather_state() override;
    void prepare_state_load() override;
    void shard_state() override;
    std::size_t state_bytes() override { return m_.nbytes() + v_.nbytes(); }

private:
    AdamWOptions opt_;
    GradientExchange& exchange_;
    Tensor m_, v_;  // this rank's slices, laid out as the exchange's shard_grads
    std::vector<bool> decay_;
    std::vector<Tensor> m_whole_, v_whole_;  // one a parameter, on the host, around a checkpoint
    bool loading_ = false;                   // m_whole_ / v_whole_ are to be loaded into
};

}  // namespace fg
