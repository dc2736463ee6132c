// scale/cuda_graph.h: the whole training step captured once as a CUDA graph and replayed.
//
// One step is hundreds of launches (every op of the forward and backward of each micro-batch, the
// gradient norm, AdamW). Launched one by one, the GPU waits whenever the host falls behind, and
// small models spend much of a step waiting. A CUDA graph records the launches once; each replay
// queues them all with one call. For that, nothing a replay needs may come from the host in the
// middle of a step, and every address the graph was captured with must mean the same at every
// replay. What changes from step to step, and how a replay sees it:
//   the batch            copied from page-locked host memory into fixed device buffers, in
//                        stream order, before the replay (two host buffers, so the host fills
//                        the next while the last copy may still be queued);
//   lr, AdamW's factors  a device table of the next kWindow steps' factors, the floats an eager
//                        step would pass (AdamW::factors), indexed on the device by the step
//                        counter; the host refills it every kWindow steps;
//   dropout masks        the kernels add a device-side base to their Philox counters while
//                        captured (kernels/runtime.h, philox_offset_base); the graph's last
//                        kernel moves the base on by the step's counters (where it updated);
//   loss, gradient norm  written to a ring on the device, which the host reads when it logs
//                        (at least every kWindow steps); otherwise the host waits only for the
//                        copy of the batch two steps back, so it runs at most two steps ahead;
//   a non-finite loss    the device records the step, and the update of that step and of every
//   or norm, a bad id    later one changes nothing; the host stops at its next read, naming it
//                        (a token id out of range, found by a kernel, stops the updates too);
//   memory               a private pool (core/allocator.h, GraphMemoryScope): the blocks the
//                        graph uses are never handed to anything else.
// The first step of a run (or of a resumed run) runs eagerly: it creates the libraries' handles
// and plans and fills the allocator's cache, so that the capture of the next step needs neither.
// The graph holds the addresses of the parameters, gradients and AdamW moments: it lives for one
// Trainer::run call (the trainer destroys it at the end, and after a non-finite stop).
// The dropout generator's offset, at capture, is rounded up to a multiple of 4, as the eager
// step's next dropout draw would round it (so the masks are the same).
// Several ranks (CapturedRanks, from the wing) capture their exchange too: NCCL's collectives
// join the graph, the host's wait for them becomes the stream's (Collectives::join), and each
// rank's loss and stop request (a flag in page-locked memory that the graph copies at each
// replay) are summed over the ranks on the device, where the one-GPU step reads its loss. The
// ranks' device states then agree on the stop step; the hosts, meeting the devices at the same
// steps, all see it at the same meeting: the steps queued after it change nothing, and each
// host goes back to it (its step, its data generator). Every host wait is bounded and watches
// the other ranks, as the exchange's own waits do.
// Captured or not, a step does the same arithmetic: tests/gpu/test_gpu_cuda_graph.cpp compares
// the two bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "core/random.h"
#include "train/data.h"
#include "kernels/captured_step.h"  // StepState, StepRecord, AdamWStep (plain C++)
#include "models/gpt.h"
#include "train/optim.h"
#include "train/step.h"
#include "train/wing.h"

namespace fg {

// Why this run's steps cannot be captured ("" when they can): the reason the log gives.
std::string cuda_graph_unsupported(const Config& config, Device device, const Optimizer& opt);

// What several ranks add to a captured step (the wing gives one; one process has none). The
// first four are the wing's eager methods of the same names (train/wing.h).
class CapturedRanks {
public:
    virtual ~CapturedRanks() = default;
    virtual int world_size() const = 0;
    virtual void step_begin() = 0;            // the gradients were just dropped
    virtual void before_last_backward() = 0;  // the last micro-batch's backward completes them
    // A micro-batch of `rows` rows drawn with `gen`: this rank's share of it, on `device`.
    virtual Batch draw(const Dataset& data, std::int64_t rows, Generator& gen, Device device) = 0;
    // Queues on the stream: `sums` (n f32 on the device) and `codes` (m i32) summed over the
    // ranks in place, and the end of the gradients' exchange; the host does not wait.
    virtual void exchange_done(float* sums, std::size_t n, int* codes, std::size_t m) = 0;
    // The host waits for `event` (null: all the work queued so far), bounded and watching the
    // other ranks.
    virtual void wait(void* event) = 0;
    // Whether `ok` on every rank (each rank calls it at the same point).
    virtual bool all(bool ok) = 0;
    virtual bool stop_requested() const = 0;  // this rank's (Ctrl-C, SIGTERM)
};

// The queued steps of train/wing.h. The step's body is training_step (train/step.h); these are
// its hooks for a replay. kWindow: steps between two reads of the ring by the host, at most (and
// the factor table's length).
class CapturedStep final : public QueuedSteps, private StepHooks {
public:

    // For `model` trained by `opt` (AdamW, on CUDA) on batches of config.train.batch_size x
    // seq_len tokens, config.train.grad_accum of them a step, by one process or by `ranks`.
    // Allocates the fixed buffers; the graph is captured at the first enqueue.
    CapturedStep(GPT& model, AdamW& opt, const Config& config, std::int64_t seq_len,
                 CapturedRanks* ranks = nullptr);
    ~CapturedStep();
    CapturedStep(const CapturedStep&) = delete;
    CapturedStep& operator=(const CapturedStep&) = delete;

    // Queues the step after `done` steps: draws its batches from `data` with `data_gen`, stages
    // them and replays the graph (capturing it first, the first time). Waits for the GPU only
    // for the batch copy of two steps back and, every kWindow steps, the refill of the factor
    // table. Throws CaptureFailed when the capture fails (ranks: on any rank): then the
    // generators, the optimizer and the gradients are as they were before the call, and the
    // caller runs the step eagerly.
    void enqueue(const Dataset& data, Generator& data_gen, std::int64_t done) override;

    // Waits for the queued steps and returns their losses and norms in order (then forgets
    // them); the optimizer's step count and the dropout generator are brought up to date.
    // `halted_at` is 0, or the first step whose loss or norm was not finite (the last returned);
    // `stopped_at` likewise the ranks' agreed stop.
    Collected collect() override;
    int pending() const override { return pending_; }
    bool captured() const override { return graph_ != nullptr; }

private:
    void capture(std::int64_t done);
    void allocate(std::int64_t accum, std::int64_t seq_len);  // the buffers
    void release() noexcept;  // what allocate and capture made
    void wait(void* event);  // for `event`, or with null for all the queued work
    // The step's hooks (train/step.h): the fixed device buffers, and the ranks' exchange.
    void begin() override;
    Batch micro_batch(std::int64_t micro) override;
    void before_last_backward() override;
    GradNorm gradients_done(const Tensor& loss_sum, GPT& model, double max_norm) override;
    // The device's step counter picks the learning rate's factors from the table; a non-finite
    // loss or norm is recorded, and turns this and every later update into nothing.
    void update(const Tensor& loss_sum, const GradNorm& clip) override;
    void refill_table(std::int64_t first_step);

    GPT& model_;
    AdamW& opt_;
    const Config& config_;
    CapturedRanks* ranks_;       // null: one process
    std::int64_t rows_;          // B of one micro-batch (ranks: of this rank's share)
    std::int64_t batch_tokens_;  // B x T
    std::vector<Tensor> inputs_, targets_;  // fixed device buffers, one pair a micro-batch
    std::int32_t* pinned_[2] = {nullptr, nullptr};  // inputs then targets of every micro-batch
    void* pinned_ready_[2] = {nullptr, nullptr};    // events: the slot's last copy has run
    // Device memory of fixed address: the state, the ring, the factor table and the current
    // step's factors (one allocation, carved up).
    void* device_block_ = nullptr;
    std::size_t device_bytes_ = 0;
    kernels::StepState* state_ = nullptr;
    kernels::StepRecord* ring_ = nullptr;
    kernels::AdamWStep* table_ = nullptr;
    kernels::AdamWStep* current_ = nullptr;
    float* rank_sums_ = nullptr;  // ranks: the loss sum and the stop requests, summed over them
    int* bad_input_ = nullptr;    // ranks: their device error records' codes, summed
    float* stop_flag_ = nullptr;  // ranks: page-locked, this rank's stop request (0 or 1)
    // Ranks: the data generator after each queued step s, at (s - 1) % kWindow.
    std::vector<Generator> data_after_;
    std::int64_t table_first_ = -1;  // the table holds steps table_first_ + 1 .. + kWindow
    void* graph_ = nullptr;          // the executable graph
    int pool_ = 0;                   // its memory pool
    std::uint64_t philox_per_step_ = 0;
    std::int64_t first_pending_ = 0;  // the step of the oldest record not yet collected
    int pending_ = 0;
};

}  // namespace fg
