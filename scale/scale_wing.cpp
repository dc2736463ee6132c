// scale/scale_wing.cpp: see scale_wing.h.
#include "scale_wing.h"

#include <cstdio>
#include <exception>
#include <ostream>

#include "core/allocator.h"  // format_bytes
#include "core/cuda_backend.h"
#include "core/error.h"
#include "cuda_graph.h"
#include "scale_backend.h"
#include "train/setup.h"
#include "train/trainer.h"

#define XXH_INLINE_ALL  // header-only xxHash (scale/CMakeLists.txt)
#include <xxhash.h>

namespace fg {
namespace {

// How long ranks wait for each other: to meet, and at every exchange. A rank that stops closes
// its connections, so the others hear of it at once; this bounds a rank that hangs.
constexpr double kRanksTimeoutSeconds = 600.0;

// Every rank must run the same config (the same model, batch, data and schedule): ranks that
// differ would exchange buckets of different sizes and wait for each other until the timeout.
// Rank 0's resolved config goes to the others; a rank whose own differs names the keys, and
// every rank stops.
void check_same_config(TcpGroup& group, const Config& c) {
    const std::string mine = dump_config(c);
    const std::vector<std::uint8_t> sent =
        group.broadcast(std::vector<std::uint8_t>(mine.begin(), mine.end()));
    const std::string theirs(sent.begin(), sent.end());
    std::string differences;  // the keys whose values differ (comments may, between builds)
    if (theirs != mine) {
        try {
            for (const std::string& key :
                 changed_keys(parse_config(theirs, "rank 0's config"), c))
                differences += (differences.empty() ? "" : ", ") + key;
        } catch (const std::exception& e) {
            differences = std::string("rank 0's config does not read here (") + e.what() +
                          "): another fusegrad?";
        }
    }
    double differing = differences.empty() ? 0.0 : 1.0;
    group.all_reduce_sum(&differing, 1);
    FG_CHECK(differences.empty(), "distributed", "rank ", group.rank(),
             "'s config differs from rank 0's: ", differences,
             " (rank 0's -> this rank's); every rank must be started with the same config");
    FG_CHECK(differing == 0.0, "distributed", static_cast<int>(differing), " rank(s) run another ",
             "config than rank 0 (their errors name the keys); every rank must be started with "
             "the same config");
}

}  // namespace

ScaleWing::ScaleWing() : dist_(distributed_env()) {}
ScaleWing::~ScaleWing() = default;

void ScaleWing::meet(const Config& c) {
    device_ = resolve_device(c.train.device);
    zero_asked_ = c.train.zero == 1;
    batch_size_ = c.train.batch_size;
    phases_asked_ = c.train.phase_times;
    if (!dist_.distributed()) return;
    if (device_ == Device::cuda) {
        // The GPU of this rank's LOCAL_RANK, before anything touches one; every GPU stays
        // visible (NCCL's peer-to-peer needs them). A process shown one GPU takes it.
        ScaleBackend& scale = scale_backend("train");
        const int gpus = scale.device_count();
        FG_CHECK(gpus == 1 || dist_.local_rank < gpus, "train", "LOCAL_RANK is ",
                 dist_.local_rank, " but this process sees ", gpus, " GPUs "
                 "(CUDA_VISIBLE_DEVICES): one rank a GPU");
        scale.select_device(gpus == 1 ? 0 : dist_.local_rank);
        const std::string no_nccl = scale.nccl_unavailable();
        FG_CHECK(no_nccl.empty(), "train", "WORLD_SIZE is ", dist_.world_size,
                 ": several CUDA ranks sum their gradients with NCCL, but ", no_nccl);
    }
    FG_CHECK(c.train.batch_size % dist_.world_size == 0, "train", "train.batch_size (",
             c.train.batch_size, ") must be a multiple of WORLD_SIZE (", dist_.world_size,
             "): each rank takes an equal share of every batch");
    // SIGTERM or Ctrl-C ends the ranks' meeting at once (later, a stop request is agreed on
    // between steps and saved, so it must not cut an exchange short).
    set_wait_interrupt([] { return Trainer::stop_requested(); });
    try {
        group_ = std::make_unique<TcpGroup>(dist_, kRanksTimeoutSeconds);
        check_same_config(*group_, c);
    } catch (...) {
        set_wait_interrupt(nullptr);
        throw;
    }
    set_wait_interrupt(nullptr);
    if (device_ == Device::cuda) {
        // Rank 0 makes NCCL's id, the TCP group hands it to the others, and every rank joins
        // the communicator.
        ScaleBackend& scale = scale_backend("train");
        const std::vector<std::uint8_t> id = group_->broadcast(
            dist_.rank == 0 ? scale.nccl_unique_id() : std::vector<std::uint8_t>{});
        nccl_ = std::shared_ptr<void>(
            scale.nccl_communicator(id, dist_.world_size, dist_.rank), [](void* comm) {
                if (cuda_backend_or_null()) scale_backend("train").nccl_destroy(comm);
            });
    }
}

std::unique_ptr<Optimizer> ScaleWing::attach(std::vector<NamedParam>& params, const Config& c) {
    params_ = params;
    if (c.train.phase_times && device_ == Device::cuda) phases_ = std::make_unique<StepPhases>();
    if (!group_) return nullptr;
    collectives_ = nccl_ ? nccl_collectives(nccl_.get(), *group_, kRanksTimeoutSeconds)
                         : tcp_collectives(*group_);
    exchange_ = std::make_unique<GradientExchange>(
        params, *collectives_, dist_.rank, dist_.world_size, c.train.zero == 1,
        static_cast<std::size_t>(c.train.bucket_mb * 1048576.0), precision_settings(c).exchange);
    if (!exchange_->zero()) return nullptr;
    return std::make_unique<ShardedAdamW>(params, adamw_options(c), *exchange_);
}

void ScaleWing::describe(std::ostream& log, Optimizer& opt) const {
    if (exchange_) {
        log << "ranks: " << dist_.world_size << ", " << exchange_->bucket_count()
            << " gradient buckets of at most " << format_bytes(exchange_->bucket_bytes_max())
            << " exchanged in " << dtype_name(exchange_->wire()) << " during the backward"
            << (exchange_->zero() ? " (ZeRO-1: reduce-scattered; AdamW's state and update split "
                                    "over the ranks, the weights all-gathered)"
                                  : " (all-reduced)")
            << ", batches of " << batch_size_ << " rows split " << batch_size_ / dist_.world_size
            << " a rank\n"
            << "ranks: each keeps " << format_bytes(opt.state_bytes())
            << " of optimizer state and " << format_bytes(exchange_->buffer_bytes())
            << " of gradient buckets\n";
    } else if (zero_asked_) {
        log << "note: train.zero: 1 splits AdamW's state over several ranks; with one it has no "
               "effect\n";
    }
    if (phases_asked_ && !phases_)
        log << "note: train.phase_times times GPU steps; on the CPU it has no effect\n";
}

Batch ScaleWing::draw(const Dataset& data, std::int64_t rows, Generator& gen, Device device) {
    if (!group_) return data.batch(Split::train, rows, gen, device);
    // Several ranks: every rank draws the whole batch, the same rows, and keeps its share.
    Batch b = shard_batch(data.batch(Split::train, rows, gen, Device::cpu), dist_.rank,
                          dist_.world_size);
    return Batch{b.inputs.to(device), b.targets.to(device)};
}

void ScaleWing::mark(StepMark mark) {
    if (!phases_) return;
    static constexpr StepPhases::Mark kMarks[] = {StepPhases::kStart, StepPhases::kBackwardDone,
                                                  StepPhases::kExchangeDone,
                                                  StepPhases::kUpdateDone};
    phases_->mark(kMarks[static_cast<int>(mark)]);
}

void ScaleWing::step_begin() {
    if (exchange_) exchange_->attach_gradients();  // the backward writes into the buckets
}

// The last micro-batch's backward finishes the gradients, and starts their exchange bucket by
// bucket as it goes.
void ScaleWing::before_last_backward() {
    if (exchange_) exchange_->arm();
}

double ScaleWing::loss_over_ranks(double loss, bool& stop) {
    if (!group_) return loss;
    const double share = 1.0 / static_cast<double>(dist_.world_size);
    exchange_->finish();
    // The loss, and whether any rank was asked to stop (Ctrl-C, SIGTERM): all ranks then stop
    // after this same step, and rank 0 saves it.
    double shared[2] = {loss, Trainer::stop_requested() ? 1.0 : 0.0};
    group_->all_reduce_sum(shared, 2);
    stop = shared[1] > 0;
    return shared[0] * share;
}

bool ScaleWing::grad_norm(double max_norm, GradNorm& out) {
    if (!exchange_ || !exchange_->zero()) return false;
    out = exchange_->grad_norm(max_norm);  // from the ranks' slices
    return true;
}

void ScaleWing::step_done(double wall_ms) {
    if (phases_) phases_->step_done(wall_ms);
}

std::string ScaleWing::queued_steps_unsupported(const Config& c, Device device,
                                                const Optimizer& opt) const {
    if (exchange_ && exchange_->zero() && device == Device::cuda)
        return "ZeRO-1 (train.zero: 1): its sharded update and the weights' gather are not part "
               "of the captured step";
    return cuda_graph_unsupported(c, device, opt);
}

std::unique_ptr<QueuedSteps> ScaleWing::queue_steps(GPT& model, Optimizer& opt,
                                                    const Config& c, std::int64_t seq_len) {
    CapturedRanks* ranks = group_ ? this : nullptr;
    if (!ranks) return std::make_unique<CapturedStep>(model, static_cast<AdamW&>(opt), c, seq_len);
    // Every rank queues its steps, or none does (the trainer then steps eagerly).
    std::unique_ptr<QueuedSteps> steps;
    std::exception_ptr failed;
    try {
        steps = std::make_unique<CapturedStep>(model, static_cast<AdamW&>(opt), c, seq_len, ranks);
    } catch (const std::exception&) {
        failed = std::current_exception();
    }
    const bool everyone = all(failed == nullptr);
    if (failed) std::rethrow_exception(failed);
    FG_CHECK(everyone, "cuda_graph", "another rank has no room for the captured step's buffers");
    return steps;
}

// The small sums ride behind the buckets the backward started, before those finish() starts.
void ScaleWing::exchange_done(float* sums, std::size_t n, int* codes, std::size_t m) {
    collectives_->all_reduce_sum(sums, n, DType::f32);
    collectives_->all_reduce_sum(codes, m, DType::i32);
    exchange_->finish(false);
}

void ScaleWing::wait(void* event) {
    scale_backend("train").nccl_wait(nccl_.get(), event, kRanksTimeoutSeconds,
                                     [this] { return group_->peers_lost(); });
}

bool ScaleWing::all(bool ok) {
    double failed = ok ? 0.0 : 1.0;
    group_->all_reduce_sum(&failed, 1);
    return failed == 0.0;
}

bool ScaleWing::stop_requested() const { return Trainer::stop_requested(); }

EvalShare ScaleWing::eval_share() {
    EvalShare share;
    if (group_) {
        share.rank = dist_.rank;
        share.world_size = dist_.world_size;
        share.sum = [this](double* v, std::size_t n) { group_->all_reduce_sum(v, n); };
    }
    return share;
}

void ScaleWing::run_begin() {
    if (phases_) phases_->reset();  // this call's steps alone
}

void ScaleWing::run_end(std::ostream& log, std::int64_t step) {
    if (phases_ && phases_->steps_timed() > 0) log << phases_->summary(10) << "\n";
    if (!group_) return;
    check_replicas_identical(log, step);
    log << "ranks: the last step started " << exchange_->started_during_backward() << " of "
        << exchange_->bucket_count() << " gradient buckets' exchanges during its backward\n";
}

void ScaleWing::check_replicas_identical(std::ostream& log, std::int64_t step) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (const NamedParam& p : params_) {
        const Tensor t = p.param->device() == Device::cpu ? *p.param : p.param->to(Device::cpu);
        XXH3_64bits_update(&state, t.raw_data(), static_cast<std::size_t>(t.numel()) *
                                                     dtype_size(t.dtype()));
    }
    const std::uint64_t mine = XXH3_64bits_digest(&state);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&mine);
    const auto all = group_->all_gather(std::vector<std::uint8_t>(bytes, bytes + sizeof mine));
    for (std::size_t r = 0; r < all.size(); ++r)
        FG_CHECK(all[r] == all[0], "train", "after step ", step, " rank ", r,
                 "'s weights differ from rank 0's: the ranks did not stay in step");
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(mine));
    log << "ranks: the " << dist_.world_size << " ranks' weights are identical after step "
        << step << " (xxh3 " << hex << ")\n";
}

}  // namespace fg
