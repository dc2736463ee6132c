// scale/cuda_graph.cpp: see cuda_graph.h.
#include "cuda_graph.h"

#include <cstring>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "scale/scale_backend.h"

namespace fg {
namespace {

constexpr std::uint64_t round_up4(std::uint64_t n) { return (n + 3) / 4 * 4; }
constexpr std::size_t round_up16(std::size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

std::string cuda_graph_unsupported(const Config& c, Device device, const Optimizer& opt) {
    if (!c.kernels.cuda_graph) return "kernels.cuda_graph is false";
    if (device != Device::cuda) return "the run is on the CPU";
    if (c.train.phase_times) return "train.phase_times times the phases between eager launches";
    if (dynamic_cast<const AdamW*>(&opt) == nullptr)
        return std::string("optim.name ") + opt.name() +
               " has no device-side update (adamw has): its steps run eagerly";
    return "";
}

CapturedStep::CapturedStep(GPT& model, AdamW& opt, const Config& config, std::int64_t seq_len,
                           CapturedRanks* ranks)
    : model_(model), opt_(opt), config_(config), ranks_(ranks),
      rows_(config.train.batch_size / (ranks ? ranks->world_size() : 1)),
      batch_tokens_(rows_ * seq_len) {
    const std::int64_t accum = config.train.grad_accum;
    try {
        allocate(accum, seq_len);
    } catch (...) {
        release();
        throw;
    }
}

void CapturedStep::allocate(std::int64_t accum, std::int64_t seq_len) {
    ScaleBackend& scale = scale_backend("cuda_graph");
    for (std::int64_t i = 0; i < accum; ++i) {
        inputs_.push_back(Tensor::empty({rows_, seq_len}, DType::i32, Device::cuda));
        targets_.push_back(Tensor::empty({rows_, seq_len}, DType::i32, Device::cuda));
    }
    const std::size_t staged = static_cast<std::size_t>(2 * accum * batch_tokens_) * sizeof(std::int32_t);
    for (int slot = 0; slot < 2; ++slot) {
        pinned_[slot] = static_cast<std::int32_t*>(scale.pinned_malloc(staged));
        pinned_ready_[slot] = scale.event_create();
    }
    if (ranks_) {
        // Rewritten by the host while a replay's copy may read it: a float, read whole or not.
        stop_flag_ = static_cast<float*>(scale.pinned_malloc(sizeof(float)));
        *stop_flag_ = 0.0f;
        data_after_.resize(kWindow);
    }
    const std::size_t state_bytes = round_up16(sizeof(kernels::StepState));
    const std::size_t ring_bytes = round_up16(kWindow * sizeof(kernels::StepRecord));
    const std::size_t table_bytes = round_up16(2 * kWindow * sizeof(kernels::AdamWStep));
    const std::size_t current_bytes = round_up16(2 * sizeof(kernels::AdamWStep));
    device_bytes_ = state_bytes + ring_bytes + table_bytes + current_bytes + 2 * sizeof(float) +
                    sizeof(int);
    device_block_ = allocate_bytes(Device::cuda, device_bytes_);
    char* at = static_cast<char*>(device_block_);
    state_ = reinterpret_cast<kernels::StepState*>(at);
    ring_ = reinterpret_cast<kernels::StepRecord*>(at + state_bytes);
    table_ = reinterpret_cast<kernels::AdamWStep*>(at + state_bytes + ring_bytes);
    current_ = reinterpret_cast<kernels::AdamWStep*>(at + state_bytes + ring_bytes + table_bytes);
    rank_sums_ = reinterpret_cast<float*>(reinterpret_cast<char*>(current_) + current_bytes);
    bad_input_ = reinterpret_cast<int*>(rank_sums_ + 2);
}

CapturedStep::~CapturedStep() { release(); }

void CapturedStep::release() noexcept {
    if (!cuda_backend_or_null()) return;
    try {
        // The last replay and copies are done with what is freed below (ranks: or the wait
        // gave up on a lost rank, and aborted the collectives a replay waits in).
        wait(nullptr);
    } catch (...) {
        // A device error is reported by whoever synchronises next; freeing goes on.
    }
    ScaleBackend& scale = scale_backend("cuda_graph");  // there is a device (above)
    scale.destroy_graph(graph_);
    graph_ = nullptr;
    if (pool_ != 0) release_graph_pool(pool_);
    pool_ = 0;
    for (int slot = 0; slot < 2; ++slot) {
        scale.pinned_free(pinned_[slot]);
        scale.event_destroy(pinned_ready_[slot]);
        pinned_[slot] = nullptr;
        pinned_ready_[slot] = nullptr;
    }
    scale.pinned_free(stop_flag_);
    stop_flag_ = nullptr;
    if (device_block_) free_bytes(Device::cuda, device_block_, device_bytes_);
    device_block_ = nullptr;
}

void CapturedStep::wait(void* event) {
    if (ranks_)
        ranks_->wait(event);
    else if (event)
        scale_backend("cuda_graph").event_synchronize(event);
    else
        cuda_backend("cuda_graph").synchronize();
}

void CapturedStep::refill_table(std::int64_t first_step) {
    CudaBackend& cuda = cuda_backend("cuda_graph");
    wait(nullptr);  // queued replays may still read the table
    const Config& c = config_;
    std::vector<kernels::AdamWStep> table(2 * kWindow);
    for (std::int64_t s = first_step + 1; s <= first_step + kWindow; ++s) {
        // Step s (1-based) is the optimizer's update t = s; its learning rate is the schedule's
        // at iteration s - 1, as in the eager step.
        const double lr = cosine_lr(s - 1, c.optim.lr, c.optim.min_lr, c.optim.warmup_steps,
                                    c.train.steps);
        const std::size_t slot = static_cast<std::size_t>((s - 1) % kWindow);
        table[2 * slot] = opt_.factors(lr, true, s);
        table[2 * slot + 1] = opt_.factors(lr, false, s);
    }
    cuda.copy_host_to_device(table_, table.data(), table.size() * sizeof(kernels::AdamWStep));
    table_first_ = first_step;
}

void CapturedStep::begin() {
    if (ranks_) ranks_->step_begin();
}

Batch CapturedStep::micro_batch(std::int64_t micro) {
    const auto i = static_cast<std::size_t>(micro);
    return Batch{inputs_[i], targets_[i]};
}

void CapturedStep::before_last_backward() {
    if (ranks_) ranks_->before_last_backward();
}

GradNorm CapturedStep::gradients_done(const Tensor& loss_sum, GPT& model, double max_norm) {
    if (ranks_) {
        // Summed over the ranks: the loss, the stop flag as the host left it when this replay
        // reaches the copy, and the code of any bad input a kernel found (so that every rank
        // halts at the step where one did).
        CudaBackend& cuda = cuda_backend("cuda_graph");
        ScaleBackend& scale = scale_backend("cuda_graph");
        cuda.copy_device_to_device(rank_sums_, loss_sum.raw_data(), sizeof(float));
        scale.copy_pinned_to_device(rank_sums_ + 1, stop_flag_, sizeof(float));
        cuda.copy_device_to_device(bad_input_, scale.device_error_code(), sizeof(int));
        ranks_->exchange_done(rank_sums_, 2, bad_input_, 1);
    }
    return StepHooks::gradients_done(loss_sum, model, max_norm);
}

void CapturedStep::update(const Tensor& loss_sum, const GradNorm& clip) {
    ScaleBackend& scale = scale_backend("cuda_graph");
    // Ranks: the loss summed over them (collect() divides), their stop requests and bad input.
    scale.step_begin(state_, ranks_ ? rank_sums_ : loss_sum.data<float>(), clip.norm.data<float>(),
                     ranks_ ? rank_sums_ + 1 : nullptr, ranks_ ? bad_input_ : nullptr, ring_,
                     table_, kWindow, current_);
    opt_.step_on_device(clip.coef, current_, &state_->skip);
    // The dropout counters this step drew (relative to the base: see capture()), rounded up to
    // a multiple of 4 as the next eager draw would round its offset.
    philox_per_step_ = round_up4(default_generator().offset());
    scale.step_end(state_, philox_per_step_);
}

void CapturedStep::capture(std::int64_t done) {
    CudaBackend& cuda = cuda_backend("cuda_graph");
    ScaleBackend& scale = scale_backend("cuda_graph");
    // The device counts steps by the optimizer's updates, the host by the trainer's steps: one
    // update a step, so they agree.
    FG_CHECK(opt_.steps() == done, "cuda_graph", "internal error: the optimizer has taken ",
             opt_.steps(), " steps, the trainer ", done);
    Generator& dropout = default_generator();
    const std::uint64_t seed = dropout.seed(), original = dropout.offset();
    const std::uint64_t base = round_up4(original);
    const kernels::StepState start{opt_.steps(), base, 0, 0, 0, 0};
    cuda.copy_host_to_device(state_, &start, sizeof start);
    // While captured, the dropout generator counts from 0 and the kernels add the device's base.
    dropout.set_state(seed, 0);
    scale.set_philox_offset_base(&state_->philox_base);
    pool_ = create_graph_pool();
    // What a failed capture leaves is undone: the generators, the gradients, the graph.
    auto undo = [&] {
        scale.abort_capture();
        scale.destroy_graph(graph_);
        graph_ = nullptr;
        scale.set_philox_offset_base(nullptr);
        dropout.set_state(seed, original);
        opt_.zero_grad();  // the gradients the capture left belong to its pool
        try {
            cuda.synchronize();
        } catch (...) {
            // The capture's own error is the one to report.
        }
        release_graph_pool(pool_);
        pool_ = 0;
    };
    try {
        GraphMemoryScope memory(pool_);
        scale.begin_capture();
        training_step(model_, opt_, config_.train.grad_accum, config_.optim.grad_clip, *this);
        graph_ = scale.end_capture();
    } catch (const std::exception& e) {
        undo();
        if (ranks_) ranks_->all(false);
        throw CaptureFailed(e.what());
    }
    // Every rank replays, or none: a rank stepping eagerly would meet no collective of a replay.
    bool everyone = true;
    try {
        everyone = !ranks_ || ranks_->all(true);
    } catch (...) {
        undo();  // a lost rank: the run's error, with nothing of the capture left behind
        throw;
    }
    if (!everyone) {
        undo();
        throw CaptureFailed("another rank could not capture its step");
    }
    scale.set_philox_offset_base(nullptr);
    dropout.set_state(seed, base);
}

void CapturedStep::enqueue(const Dataset& data, Generator& data_gen, std::int64_t done) {
    FG_CHECK(pending_ < kWindow, "cuda_graph", "internal error: ", pending_,
             " steps queued without collect()");
    ScaleBackend& scale = scale_backend("cuda_graph");
    if (table_first_ < 0 || done < table_first_ || done >= table_first_ + kWindow)
        refill_table(done);
    // Stage the batches: drawn on the host exactly as the eager step draws them.
    const Generator data_before = data_gen;
    const int slot = static_cast<int>(done % 2);
    wait(pinned_ready_[slot]);  // its previous copy has run
    std::int32_t* host = pinned_[slot];
    const std::int64_t accum = config_.train.grad_accum;
    const std::size_t bytes = static_cast<std::size_t>(batch_tokens_) * sizeof(std::int32_t);
    for (std::int64_t micro = 0; micro < accum; ++micro) {
        const std::int64_t rows = config_.train.batch_size;  // ranks: each keeps its share
        Batch b = ranks_ ? ranks_->draw(data, rows, data_gen, Device::cpu)
                         : data.batch(Split::train, rows, data_gen, Device::cpu);
        std::memcpy(host + (2 * micro) * batch_tokens_, b.inputs.data<std::int32_t>(), bytes);
        std::memcpy(host + (2 * micro + 1) * batch_tokens_, b.targets.data<std::int32_t>(), bytes);
    }
    for (std::int64_t micro = 0; micro < accum; ++micro) {
        scale.copy_pinned_to_device(inputs_[micro].raw_data(), host + (2 * micro) * batch_tokens_, bytes);
        scale.copy_pinned_to_device(targets_[micro].raw_data(), host + (2 * micro + 1) * batch_tokens_,
                                    bytes);
    }
    scale.event_record(pinned_ready_[slot]);
    if (ranks_) {
        data_after_[static_cast<std::size_t>(done % kWindow)] = data_gen;  // step done + 1's
        *stop_flag_ = ranks_->stop_requested() ? 1.0f : 0.0f;
    }
    if (!graph_) {
        try {
            capture(done);
        } catch (const CaptureFailed&) {
            data_gen = data_before;
            throw;
        }
    }
    scale.launch_graph(graph_);
    if (pending_ == 0) first_pending_ = done + 1;
    ++pending_;
}

CapturedStep::Collected CapturedStep::collect() {
    Collected out;
    if (pending_ == 0) return out;
    CudaBackend& cuda = cuda_backend("cuda_graph");
    kernels::StepState state{};
    std::vector<kernels::StepRecord> ring(kWindow);
    wait(nullptr);  // for the queued steps
    cuda.copy_device_to_host(&state, state_, sizeof state);
    cuda.copy_device_to_host(ring.data(), ring_, ring.size() * sizeof(kernels::StepRecord));
    const std::int64_t last = first_pending_ + pending_ - 1;
    FG_CHECK(state.halted_at == 0 || state.halted_at >= first_pending_, "cuda_graph",
             "internal error: replays went on after the halt at step ", state.halted_at);
    out.first_step = first_pending_;
    out.halted_at = state.halted_at;
    out.stopped_at = state.stopped_at;
    std::int64_t end = last;  // the halted step, or the last that updated
    if (state.halted_at != 0) {
        end = state.halted_at;
    } else if (state.stopped_at != 0) {
        end = state.stopped_at;
        out.data_at_stop = data_after_[static_cast<std::size_t>((end - 1) % kWindow)];
    }
    const int ranks = ranks_ ? ranks_->world_size() : 1;
    for (std::int64_t s = first_pending_; s <= end; ++s) {
        const kernels::StepRecord& r = ring[static_cast<std::size_t>((s - 1) % kWindow)];
        // The mean as the eager step computes it: the float sum, divided in double (ranks: the
        // float sum of theirs, where eager ranks add their means in double).
        out.losses.push_back(static_cast<double>(r.loss_sum) /
                             static_cast<double>(config_.train.grad_accum * ranks));
        out.norms.push_back(r.norm);
    }
    opt_.set_steps(state.step);
    default_generator().set_state(default_generator().seed(), state.philox_base);
    pending_ = 0;
    return out;
}

}  // namespace fg
