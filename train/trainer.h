// train/trainer.h: one training run, from a Config to a run directory: the loop, its reporting
// and its checkpoints. Building a run's parts from a config is train/setup.h; evaluation,
// generation and reading a run back are train/evaluate.h.
//
// The run directory holds: config.yaml (the resolved config), vocab.txt (the vocabulary: one
// character per id, as bytes, or for token data one line such as "tokens: gpt2 50257"), the
// checkpoint (checkpoints/step_N/ with model.safetensors and train_state.safetensors -
// optimizer moments, step, generator offsets, best loss - committed by checkpoint.json,
// train/checkpoint.h), model.safetensors (the latest weights, nanoGPT's names),
// best.safetensors (the weights of the best validation loss so far), metrics.jsonl (one JSON
// object a line, keys in this order: per step step, loss, lr, grad_norm, ms, tokens_per_s, then
// mfu and mfu_6lct (on a GPU of known peak: PaLM's count and llm.c's, progress.h) and
// peak_mem_mib (on a GPU); per evaluation step, train_loss,
// val_loss, then accuracy (addition); numbers rounded to a few places, a non-finite one written
// as null) and loss_curve.svg (train and validation loss against steps, drawn from metrics.jsonl
// by the command once the trainer returns).
//
// Reproducibility: every random draw (init, data, dropout) comes from generators seeded by
// train.seed whose offsets are saved, so a resumed run on the CPU continues with bitwise the same
// losses as an uninterrupted one.
#pragma once

#include <array>
#include <chrono>
#include <iosfwd>
#include <memory>
#include <string>

#include "config.h"
#include "data.h"
#include "evaluate.h"
#include "models/gpt.h"
#include "optim.h"
#include "setup.h"
#include "wing.h"

namespace fg {

class Trainer {
public:
    // A new run in config.train.out_dir (created; an existing checkpoint there is an error unless
    // resuming). `wing`: what scales the run (train/wing.h; null: one process, eager steps).
    Trainer(const Config& config, std::ostream& log, std::unique_ptr<Wing> wing = nullptr);
    // Continues the run in `run_dir` from its checkpoint; `overrides` may change training keys
    // (steps, eval_interval, ...) but not the model's shape.
    static std::unique_ptr<Trainer> resume(const std::string& run_dir,
                                           const std::vector<std::string>& overrides,
                                           std::ostream& log, std::unique_ptr<Wing> wing = nullptr);

    // Trains until train.steps, or until step `stop_at` (when >= 0), or until stop_requested()
    // turns true; then saves a checkpoint and returns. Stopping early changes nothing else: the
    // schedule still spans train.steps, so a resumed run continues exactly.
    void run(std::int64_t stop_at = -1);
    void save_checkpoint();
    // Redraw a one-line progress bar after every step (for a terminal; off by default).
    void set_progress_bar(bool on) { progress_bar_ = on; }
    std::int64_t step() const { return step_; }
    const std::vector<double>& losses() const { return losses_; }  // training loss of each step
    GPT& model() { return *model_; }
    const std::string& run_dir() const { return dir_; }
    // Several ranks (train/wing.h): rank 0 alone writes the run directory and the log.
    bool writer() const { return wing_->rank() == 0; }

    // Set from a SIGINT handler: finish the current step, save, return from run().
    static void request_stop();
    static bool stop_requested();

private:
    Trainer(const Config& config, std::ostream& log, bool resuming, std::unique_ptr<Wing> wing);
    void load_checkpoint(const std::string& run_dir);
    void write_run_files();  // config.yaml and vocab.txt
    void write_checkpoint();  // save_checkpoint's files, by rank 0
    void trim_metrics();     // metrics.jsonl without the lines of steps after step_
    class EagerStep;  // the hooks of train/step.h for an eager step
    // The step after step_ queued on the device (the wing's captured step); false when it could
    // not be captured (the log says why; from then on steps run eagerly).
    bool queued_step();
    // Waits for the steps queued since the last call and reports them (metrics, log), each with
    // the mean time of the steps since then; stops on a non-finite loss or norm.
    void collect_queued_steps();
    // The step's loss into losses(), its metrics line, and its log line when it is one the log
    // prints.
    void report_step(std::int64_t step, double loss, double lr, double norm, double ms);
    // Stops the run, before the update of step `step`, when its loss or gradient norm is not
    // finite (the last checkpoint stays the last good state).
    void check_finite(std::int64_t step, double loss, double norm) const;
    void log_metrics(const std::string& json_line);
    // Whether the loop stops now: a stop request; with several ranks, one the ranks agreed on at
    // the last step (so that all of them stop after the same step).
    bool should_stop() const { return wing_->world_size() > 1 ? stop_agreed_ : stop_requested(); }

    Config cfg_;
    std::ostream& log_;
    Device device_;
    std::string dir_;
    std::unique_ptr<Dataset> data_;
    std::unique_ptr<GPT> model_;
    std::unique_ptr<Optimizer> opt_;
    std::vector<NamedParam> params_;
    Generator data_gen_;
    std::int64_t step_ = 0;
    std::int64_t saved_step_ = -1;  // the step of the last checkpoint this trainer wrote
    double best_val_ = 1e300;
    std::vector<double> losses_;
    bool progress_bar_ = false;
    double peak_tflops_ = 0.0;      // of this GPU for this config's matmul precision; 0: unknown
    std::array<double, 2> flops_per_token_{};  // training FLOPs a token: PaLM's count, llm.c's
    // After model_ and opt_, so destroyed before them (as the ranks' exchange was before it
    // moved to the wing): its exchange holds the parameters' gradients, and is stopped before
    // they go. (ZeRO-1's optimizer holds the exchange too; its destructor does not touch it.)
    std::unique_ptr<Wing> wing_;
    bool stop_agreed_ = false;  // the ranks agreed to stop (should_stop)
    std::unique_ptr<QueuedSteps> queued_;  // once the first step of run() has run eagerly
    std::chrono::steady_clock::time_point collected_at_;  // of the last collect_queued_steps
    double ms_average_ = 0.0;  // smoothed ms/step for the progress bar's ETA
};

}  // namespace fg
