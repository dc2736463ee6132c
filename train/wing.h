// train/wing.h: what the trainer asks of a wing for scale (several ranks and their gradient
// exchange, the step captured as a CUDA graph, phase timing), as an interface: the trainer knows
// no more of them than this. It takes a wing at construction; without one it gets this base
// class: one process, every step eager, no timing. Each method of the base class does the plain
// thing, so a reader of the trainer can take every call below as doing nothing more.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.h"
#include "core/error.h"
#include "data.h"
#include "evaluate.h"
#include "models/gpt.h"
#include "optim.h"

namespace fg {

// Points of a step that the wing may time (train.phase_times).
enum class StepMark { start, backward_done, exchange_done, update_done };

// Steps queued on the device and reported later (the captured step): what the trainer's loop
// needs of them.
class QueuedSteps {
public:
    // What enqueue throws when the capture itself failed (and nothing changed): the trainer
    // runs the step eagerly instead. Any other exception is an error of the run.
    struct CaptureFailed : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    // The steps collected since the last collect(), in order.
    struct Collected {
        std::vector<double> losses, norms;  // of each step: the mean loss, the gradient norm
        std::int64_t first_step = 0;        // the step of losses[0]
        std::int64_t halted_at = 0;  // 0, or the first step whose loss or norm was not finite
        // Several ranks: 0, or the step after which they agreed to stop (the steps queued after
        // it changed nothing), and the data generator as that step left it.
        std::int64_t stopped_at = 0;
        Generator data_at_stop;
    };
    // Steps between two collects, at most.
    static constexpr int kWindow = 64;

    virtual ~QueuedSteps() = default;
    // Queues the step after `done` steps, drawing its batches from `data` with `data_gen`.
    virtual void enqueue(const Dataset& data, Generator& data_gen, std::int64_t done) = 0;
    virtual Collected collect() = 0;
    virtual int pending() const = 0;
    virtual bool captured() const = 0;
};

class Wing {
public:
    virtual ~Wing() = default;
    virtual int rank() const { return 0; }
    virtual int world_size() const { return 1; }

    // The run begins: several ranks meet here (each checks it runs `config`), take their GPU and
    // their communicator. Before anything touches a GPU; once a wing. Without a wing for scale,
    // a process that a launcher started as one of several ranks is refused.
    virtual void meet(const Config& /*config*/) {
        const char* ranks = std::getenv("WORLD_SIZE");
        FG_CHECK(!ranks || std::atoi(ranks) <= 1, "train", "WORLD_SIZE is ", ranks, ", but this "
                 "trainer has no wing for scale: it would run as one process on every rank");
    }
    // The model exists: the optimizer the wing makes for `params` (ZeRO-1's sharded AdamW), or
    // null for the config's own. Then `describe` adds the wing's lines to the run's log.
    virtual std::unique_ptr<Optimizer> attach(std::vector<NamedParam>& /*params*/,
                                              const Config& /*config*/) {
        return nullptr;
    }
    virtual void describe(std::ostream& /*log*/, Optimizer& /*opt*/) const {}

    // The eager step (train/step.h's hooks call these). A micro-batch of `rows` rows: this
    // rank's share of it, on `device`.
    virtual Batch draw(const Dataset& data, std::int64_t rows, Generator& gen, Device device) {
        return data.batch(Split::train, rows, gen, device);
    }
    virtual void mark(StepMark /*mark*/) {}
    virtual void step_begin() {}            // the gradients were just dropped
    virtual void before_last_backward() {}  // the last micro-batch's backward completes them
    // The gradients are queued and `loss` is this rank's mean loss: returns the ranks' mean, and
    // sets `stop` when the ranks agreed to stop after this step (a stop requested on any of them
    // by the time its exchange was done). One process: `loss`, and `stop` left as it is.
    virtual double loss_over_ranks(double loss, bool& /*stop*/) { return loss; }
    // The gradients' norm and clip factor, where the wing has them (ZeRO-1: the ranks' slices);
    // false: over the model's parameters.
    virtual bool grad_norm(double /*max_norm*/, GradNorm& /*out*/) { return false; }
    virtual void step_done(double /*wall_ms*/) {}

    // Steps queued on the device: why not for this run ("" when they can be), and the queue.
    virtual std::string queued_steps_unsupported(const Config& /*config*/, Device /*device*/,
                                                 const Optimizer& /*opt*/) const {
        return "this trainer has no wing for scale";
    }
    virtual std::unique_ptr<QueuedSteps> queue_steps(GPT& /*model*/, Optimizer& /*opt*/,
                                                     const Config& /*config*/,
                                                     std::int64_t /*seq_len*/) {
        return nullptr;
    }

    // Evaluation: this rank's share of the batches and the sum over the ranks.
    virtual EvalShare eval_share() { return EvalShare{}; }
    // A Trainer::run call begins / ends after step `step` (the wing's summaries to `log`).
    virtual void run_begin() {}
    virtual void run_end(std::ostream& /*log*/, std::int64_t /*step*/) {}
};

}  // namespace fg
