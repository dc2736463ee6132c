// scale/scale_wing.h: the wing for scale, as the trainer sees it (train/wing.h): several ranks
// (their rendezvous, one GPU each, the gradients' exchange during the backward, ZeRO-1's sharded
// AdamW, the agreed stop, identical weights checked at the end), the step captured as a CUDA
// graph (cuda_graph.h; ranks without ZeRO-1 capture their exchange too) and the phases of eager
// steps timed (step_phases.h). The fusegrad
// command hands one to every Trainer it makes.
#pragma once

#include <memory>

#include "cuda_graph.h"
#include "distributed.h"
#include "grad_exchange.h"
#include "step_phases.h"
#include "train/wing.h"

namespace fg {

// Its CapturedRanks side is what a rank's captured step asks of it (world_size, draw,
// step_begin and before_last_backward each override both bases' methods of that name).
class ScaleWing final : public Wing, private CapturedRanks {
public:
    ScaleWing();  // this process's rank among WORLD_SIZE (distributed_env())
    ~ScaleWing() override;

    int rank() const override { return dist_.rank; }
    int world_size() const override { return dist_.world_size; }
    void meet(const Config& config) override;
    std::unique_ptr<Optimizer> attach(std::vector<NamedParam>& params,
                                      const Config& config) override;
    void describe(std::ostream& log, Optimizer& opt) const override;

    Batch draw(const Dataset& data, std::int64_t rows, Generator& gen, Device device) override;
    void mark(StepMark mark) override;
    void step_begin() override;
    void before_last_backward() override;
    double loss_over_ranks(double loss, bool& stop) override;
    bool grad_norm(double max_norm, GradNorm& out) override;
    void step_done(double wall_ms) override;

    std::string queued_steps_unsupported(const Config& config, Device device,
                                         const Optimizer& opt) const override;
    std::unique_ptr<QueuedSteps> queue_steps(GPT& model, Optimizer& opt, const Config& config,
                                             std::int64_t seq_len) override;

    EvalShare eval_share() override;
    void run_begin() override;
    void run_end(std::ostream& log, std::int64_t step) override;

private:
    void exchange_done(float* sums, std::size_t n, int* codes, std::size_t m) override;
    void wait(void* event) override;
    bool all(bool ok) override;
    bool stop_requested() const override;
    // Stops the run when the ranks' weights are not bitwise identical (they must be).
    void check_replicas_identical(std::ostream& log, std::int64_t step);

    DistributedEnv dist_;
    Device device_ = Device::cpu;
    bool zero_asked_ = false, phases_asked_ = false;  // train.zero, train.phase_times
    std::int64_t batch_size_ = 0;
    std::vector<NamedParam> params_;
    std::unique_ptr<TcpGroup> group_;  // the other ranks, when there are several
    std::unique_ptr<GradientExchange> exchange_;  // the gradients' sums over the ranks
    // Declared after exchange_, so destroyed before it: an exchange still in flight when the
    // run fails is stopped (the TCP worker joined, the NCCL communicator aborted) before the
    // buckets it writes are freed.
    std::shared_ptr<void> nccl_;  // CUDA ranks: their NCCL communicator
    std::unique_ptr<Collectives> collectives_;  // over group_ (CPU) or nccl_ (CUDA)
    std::unique_ptr<StepPhases> phases_;        // train.phase_times on CUDA
};

}  // namespace fg
