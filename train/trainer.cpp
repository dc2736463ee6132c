// train/trainer.cpp: see trainer.h.
#include "trainer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/gpt_memory.h"
#include "progress.h"
#include "checkpoint.h"
#include "safetensors.h"
#include "step.h"

namespace fg {
namespace {

namespace fs = std::filesystem;
std::atomic<bool> g_stop{false};

std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

// `v` rounded as printf's `format` prints it ("%.6f": six decimals, "%.6g": six significant
// digits), for metrics.jsonl: the JSON writer prints the shortest text that reads back as the same
// double, so a rounded value keeps the line short ("2.302585", not 17 digits). Non-finite values
// pass through ("inf" reads back as inf), and the writer prints them as null.
double rounded(double v, const char* format) {
    return std::strtod(fmt(format, v).c_str(), nullptr);
}

std::vector<std::pair<std::string, Tensor>> to_list(
    const std::vector<std::pair<std::string, Tensor*>>& named) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [name, t] : named)
        if (t->defined()) out.emplace_back(name, *t);
    return out;
}

// Where a rank's log goes: rank 0's to `log`, the others' nowhere (their errors still reach the
// caller as exceptions).
std::ostream& rank_log(std::ostream& log, const Wing* wing) {
    static std::ostream nowhere(nullptr);
    return wing && wing->rank() != 0 ? nowhere : log;
}

}  // namespace

void Trainer::request_stop() { g_stop = true; }
bool Trainer::stop_requested() { return g_stop; }

Trainer::Trainer(const Config& config, std::ostream& log, std::unique_ptr<Wing> wing)
    : Trainer(config, log, false, std::move(wing)) {}

Trainer::Trainer(const Config& config, std::ostream& log, bool resuming, std::unique_ptr<Wing> wing)
    : cfg_(resuming ? config : with_absolute_data_paths(config)), log_(rank_log(log, wing.get())),
      device_(resolve_device(config.train.device)), dir_(config.train.out_dir),
      data_gen_(static_cast<std::uint64_t>(config.train.seed) + 1),
      wing_(wing ? std::move(wing) : std::make_unique<Wing>()) {
    const Config& c = cfg_;
    // Checked before the ranks meet: these fail on every rank alike when the ranks run one
    // config (which they check once they meet), and a launcher (fusegrad --ranks, torchrun,
    // srun --kill-on-bad-exit) stops the others when one rank fails.
    FG_CHECK(c.train.zero == 0 || c.optim.name == OptimizerKind::adamw, "train", "train.zero: 1 "
             "splits AdamW's state over the ranks, but optim.name is sgd");
    wing_->meet(c);
    data_ = make_dataset(c);
    std::int64_t vocab = data_->vocab().size();
    FG_CHECK(c.model.vocab_size == 0 || c.model.vocab_size >= vocab, "train", "model.vocab_size (",
             c.model.vocab_size, ") is smaller than the data's vocabulary (", vocab, ")");
    FG_CHECK(data_->sequence_length() <= c.model.block_size, "train", "model.block_size (",
             c.model.block_size, ") is shorter than one addition problem (",
             data_->sequence_length(), " tokens)");
    const TrainingMemory need =
        check_memory(c, gpt_config(c, vocab), data_->sequence_length(), device_, wing_->world_size());
    Generator init(static_cast<std::uint64_t>(c.train.seed));
    model_ = std::make_unique<GPT>(gpt_config(c, vocab), init, device_);
    configure_kernels(*model_, c);  // a resume's kernels.* too: the config it was given
    if (!resuming && !c.train.init_from.empty()) {
        check_init_from(c);
        load_weights(*model_, c.train.init_from, device_);
    }
    for (auto& [name, p] : model_->named_parameters()) params_.push_back({name, p});
    opt_ = wing_->attach(params_, c);  // ZeRO-1's sharded AdamW, or null
    if (!opt_) opt_ = make_optimizer(c, params_);
    default_generator().set_state(static_cast<std::uint64_t>(c.train.seed) + 2, 0);  // dropout
    // Ranks draw their rows' share of each dropout mask: one process's masks (core/random.h).
    default_generator().set_shard(wing_->rank(), wing_->world_size());
    const std::int64_t weights = model_->num_parameters(), seq = data_->sequence_length();
    flops_per_token_ = {gpt_flops_per_token(weights - model_->wpe.weight.numel(), c.model.n_layer,
                                            c.model.n_embd, seq, 12),  // PaLM's count
                        gpt_flops_per_token(weights, c.model.n_layer, c.model.n_embd, seq, 6)};
    if (device_ == Device::cuda)
        peak_tflops_ = peak_tflops(cuda_backend("train").device_info().name, c.train.precision);

    std::string taken_over;
    if (!resuming && writer()) {
        // A new run never writes over, or removes, a file it did not write.
        taken_over = claim_new_run_directory(dir_);
        write_run_files();
    }
    if (!taken_over.empty()) log_ << "note: " << taken_over << "\n";
    for (const std::string& w : c.warnings) log_ << "warning: " << w << "\n";
    log_ << "# resolved config (saved as " << (fs::path(dir_) / "config.yaml").string() << ")\n"
         << dump_config(cfg_) << "\n";
    wing_->describe(log_, *opt_);
    log_ << "fusegrad: " << model_->num_parameters() << " parameters, device "
         << device_name(device_) << ", run directory " << dir_ << "\n"
         << "data: " << data_->describe() << "\n"
         << "memory per step (estimated): " << need.describe() << "\n";
}

void Trainer::write_run_files() {
    if (!writer()) return;
    fs::create_directories(dir_);
    write_file_durably((fs::path(dir_) / "config.yaml").string(), dump_config(cfg_));
    write_file_durably((fs::path(dir_) / "vocab.txt").string(), data_->vocab().chars());
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& run_dir,
                                         const std::vector<std::string>& overrides,
                                         std::ostream& log, std::unique_ptr<Wing> wing) {
    // Everything is checked before anything in the run directory is written: a refused resume
    // leaves it exactly as it was.
    std::string cfg_path = (fs::path(run_dir) / "config.yaml").string();
    FG_CHECK(has_checkpoint(run_dir) || fs::exists(fs::path(run_dir) / "train_state.safetensors"),
             "resume", "'", run_dir, "' holds no checkpoint (checkpoint.json is missing)",
             fs::exists(fs::path(run_dir) / kRunMarker)
                 ? std::string(": its run stopped before its first checkpoint; start it again "
                               "with `fusegrad train CONFIG` and train.out_dir ") +
                       run_dir + " (the new run takes the directory over)"
                 : std::string());
    Config saved = load_config(cfg_path);
    Config cfg = load_config(cfg_path, overrides);
    cfg.train.out_dir = saved.train.out_dir = run_dir;
    const std::vector<ConfigKey> keys = config_keys();
    for (const std::string& change : changed_keys(saved, cfg)) {
        const std::string key = change.substr(0, change.find(' '));
        std::string allowed;
        bool resumable = false;
        for (const ConfigKey& k : keys) {
            if (k.resumable) allowed += (allowed.empty() ? "" : ", ") + k.key;
            resumable = resumable || (k.resumable && k.key == key);
        }
        FG_CHECK(resumable, "resume", key,
                 " cannot change when resuming '", run_dir, "': ", change.substr(key.size() + 1),
                 "; start a new run for that (a resumed run may change ", allowed, ")");
    }
    require_data_files(cfg, run_dir);
    std::unique_ptr<Trainer> t(new Trainer(cfg, log, true, std::move(wing)));
    std::ifstream vocab_file(fs::path(run_dir) / "vocab.txt", std::ios::binary);
    FG_CHECK(vocab_file.good(), "resume", "'", run_dir, "' has no vocab.txt");
    std::string vocab((std::istreambuf_iterator<char>(vocab_file)), {});
    FG_CHECK(vocab == t->data_->vocab().chars(), "resume", "the data's vocabulary (",
             t->data_->vocab().size(), " tokens) is not the one in '", run_dir,
             "/vocab.txt' (", vocab.size(), " tokens): did the data file change?");
    t->load_checkpoint(run_dir);
    t->write_run_files();  // the resumed config (a longer schedule, say) is now the run's
    t->trim_metrics();
    t->log_ << "resumed at step " << t->step_ << "\n";  // rank 0 alone says it
    return t;
}

void Trainer::trim_metrics() {
    if (!writer()) return;
    // Steps after the checkpoint (logged before a kill) are trained again: drop their old lines.
    const fs::path path = fs::path(dir_) / "metrics.jsonl";
    std::ifstream in(path);
    if (!in.good()) return;
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        // Dropped: a line of a step after the checkpoint, and a line that is not JSON, cut short
        // by a kill while it was written, so also of such a step (the checkpoint's lines were
        // complete before it was committed). (Or a line of an older fusegrad that printed a
        // non-finite number, which JSON cannot hold and the loss curves skip too.)
        const bool drop = j.is_discarded() || (j.is_object() && j.contains("step") &&
                                                j["step"].is_number() &&
                                                j["step"].get<std::int64_t>() > step_);
        if (drop) dropped = true;
        else kept += line + "\n";
    }
    if (dropped) write_file_durably(path.string(), kept);
}

namespace {

// A metadata number of a train_state file, with what is wrong named. `count`: a count of what a
// run did (a step, a generator offset), bounded below 2^62; seeds are not counts.
std::uint64_t metadata_number(const SafetensorsFile& state, const std::string& path,
                              const char* key, bool count = true) {
    auto it = state.metadata.find(key);
    FG_CHECK(it != state.metadata.end(), "resume", "'", path, "' lacks '", key,
             "' in its metadata (not a fusegrad train state, or damaged)");
    std::uint64_t v = 0;
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    FG_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(), "resume",
             "'", path, "': metadata '", key, "' is '", text, "', not a whole number >= 0");
    // Steps and generator offsets are counts of what a run did: none comes near 2^62, and one
    // past 2^63 would turn negative where it is kept signed.
    FG_CHECK(!count || v < (std::uint64_t{1} << 62), "resume", "'", path, "': metadata '", key, "' is ",
             text, ", more than any run reaches (damaged or crafted)");
    return v;
}

}  // namespace

void Trainer::load_checkpoint(const std::string& run_dir) {
    fs::path folder(run_dir);
    std::int64_t manifest_step = -1;
    if (has_checkpoint(run_dir)) {
        CheckpointManifest m = verified_checkpoint(run_dir);
        for (const char* f : {"model.safetensors", "train_state.safetensors"})
            FG_CHECK(m.files.count(f), "resume", "the checkpoint of step ", m.step, " in '",
                     run_dir, "' has no ", f);
        folder /= m.folder;
        manifest_step = m.step;
    } else {
        log_ << "warning: '" << run_dir << "' has no checkpoint.json (written by an older "
             << "fusegrad): its files are loaded without checksums\n";
    }
    std::string model_path = (folder / "model.safetensors").string();
    std::string state_path = (folder / "train_state.safetensors").string();
    SafetensorsFile weights = load_safetensors(model_path);
    SafetensorsFile state = load_safetensors(state_path);
    const std::uint64_t step = metadata_number(state, state_path, "step");
    FG_CHECK(metadata_number(weights, model_path, "step") == step, "resume", "'", model_path,
             "' is from step ", weights.metadata.at("step"), ", '", state_path, "' from step ",
             step, ": they are not one checkpoint");
    FG_CHECK(manifest_step < 0 || static_cast<std::int64_t>(step) == manifest_step, "resume", "'",
             state_path, "' is from step ", step, ", the manifest says ", manifest_step);
    FG_CHECK(state.metadata.count("optimizer") && state.metadata.at("optimizer") == opt_->name(),
             "resume", "'", state_path, "' was written by another optimizer than optim.name = ",
             opt_->name());
    for (auto& [name, p] : model_->state_dict()) {
        const Tensor* t = weights.find(name);
        FG_CHECK(t != nullptr, "resume", "'", model_path, "' has no tensor '", name, "'");
        FG_CHECK(t->dtype() == DType::f32, "resume", "'", model_path, "': '", name, "' is ",
                 dtype_name(t->dtype()), ", the master weights are f32");
        load_tensor(*p, *t, name, model_path, device_);
    }
    opt_->prepare_state_load();  // ZeRO-1: whole host tensors to load into (every rank loads)
    for (auto& [name, t] : opt_->named_state()) {
        const Tensor* s = state.find(name);
        // AdamW's moments exist from the start and must all be there; SGD's momentum buffers
        // appear at its first step.
        FG_CHECK(s != nullptr || !t->defined(), "resume", "'", state_path, "' has no '", name,
                 "': the optimizer state is incomplete");
        if (s) {
            FG_CHECK(s->dtype() == DType::f32, "resume", "'", state_path, "': '", name, "' is ",
                     dtype_name(s->dtype()), ", not f32");
            load_tensor(*t, *s, name, state_path, t->defined() ? t->device() : device_);
        }
    }
    opt_->shard_state();
    step_ = saved_step_ = static_cast<std::int64_t>(step);
    const std::uint64_t optimizer_steps = metadata_number(state, state_path, "optimizer_steps");
    FG_CHECK(optimizer_steps <= step, "resume", "'", state_path, "': optimizer_steps ",
             optimizer_steps, " is more than the step, ", step, " (damaged or crafted)");
    opt_->set_steps(static_cast<std::int64_t>(optimizer_steps));
    data_gen_.set_state(metadata_number(state, state_path, "data_seed", false),
                        metadata_number(state, state_path, "data_offset"));
    default_generator().set_state(metadata_number(state, state_path, "dropout_seed", false),
                                  metadata_number(state, state_path, "dropout_offset"));
    // Another number of ranks splits the same batches otherwise (the sums round otherwise): only
    // when the config says so. (Checkpoints of older fusegrads do not say how many wrote them.)
    if (state.metadata.count("world_size")) {
        const std::uint64_t saved_ranks = metadata_number(state, state_path, "world_size");
        const auto ranks = static_cast<std::uint64_t>(wing_->world_size());
        FG_CHECK(saved_ranks == ranks || cfg_.train.ranks_may_change, "resume", "the checkpoint in '",
                 run_dir, "' was saved by ", saved_ranks, " rank(s); this resume runs on ", ranks,
                 ": the same batches split otherwise round otherwise; set "
                 "train.ranks_may_change=true to resume on ", ranks, " anyway");
        if (saved_ranks != ranks)
            log_ << "note: resuming a checkpoint of " << saved_ranks << " rank(s) on " << ranks
                 << " (train.ranks_may_change): the sums round otherwise from here on\n";
    }
    auto best = state.metadata.find("best_val");
    FG_CHECK(best != state.metadata.end(), "resume", "'", state_path, "' lacks 'best_val'");
    char* end = nullptr;
    best_val_ = std::strtod(best->second.c_str(), &end);
    FG_CHECK(end && *end == '\0' && !best->second.empty(), "resume", "'", state_path,
             "': best_val is '", best->second, "', not a number");
}

void Trainer::save_checkpoint() {
    // ZeRO-1: every rank sends its slice of AdamW's state, which rank 0 saves whole (so that the
    // checkpoint resumes with any number of ranks, with or without ZeRO).
    opt_->gather_state();
    try {
        write_checkpoint();
    } catch (...) {
        opt_->shard_state();
        throw;
    }
    opt_->shard_state();
}

void Trainer::write_checkpoint() {
    if (!writer()) {  // rank 0 saves; the ranks hold the same state
        saved_step_ = step_;
        return;
    }
    // Into checkpoints/.partial/, then committed (train/checkpoint.h): a crash or a failed write
    // anywhere leaves the last committed checkpoint as it was.
    const std::string partial = partial_folder(dir_);
    try {
        fs::remove_all(partial);
        fs::create_directories(partial);
        std::ostringstream best;
        best.precision(17);
        best << best_val_;
        save_safetensors((fs::path(partial) / "model.safetensors").string(),
                         to_list(model_->state_dict()),
                         {{"format", "pt"}, {"step", std::to_string(step_)}});
        save_safetensors((fs::path(partial) / "train_state.safetensors").string(),
                         to_list(opt_->named_state()),
                         {{"step", std::to_string(step_)},
                          {"optimizer", opt_->name()},
                          {"optimizer_steps", std::to_string(opt_->steps())},
                          {"data_seed", std::to_string(data_gen_.seed())},
                          {"data_offset", std::to_string(data_gen_.offset())},
                          {"dropout_seed", std::to_string(default_generator().seed())},
                          {"dropout_offset", std::to_string(default_generator().offset())},
                          {"best_val", best.str()},
                          {"world_size", std::to_string(wing_->world_size())}});
        commit_checkpoint(dir_, step_);
        saved_step_ = step_;
    } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove_all(partial, ec);
        fail("checkpoint", "saving step ", step_, " failed: ", e.what(), "; the last good ",
             "checkpoint in '", dir_, "' is kept");
    }
}

void Trainer::log_metrics(const std::string& json_line) {
    if (!writer()) return;
    append_line((fs::path(dir_) / "metrics.jsonl").string(), json_line, "train");
}

// The eager step's hooks (train/step.h): batches drawn as the step goes, the host's learning
// rate, and what the wing adds (train/wing.h: ranks' shares and exchange, phase marks).
class Trainer::EagerStep : public StepHooks {
public:
    explicit EagerStep(Trainer& t) : t_(t), wing_(*t.wing_) {}
    double loss = 0.0, norm = 0.0, lr = 0.0;  // of the step, once update() has run

    void begin() override {
        wing_.mark(StepMark::start);
        wing_.step_begin();
    }
    Batch micro_batch(std::int64_t) override {
        return wing_.draw(*t_.data_, t_.cfg_.train.batch_size, t_.data_gen_, t_.device_);
    }
    void before_last_backward() override { wing_.before_last_backward(); }
    // The host waits here, once, for the loss (ranks: then for their exchange).
    GradNorm gradients_done(const Tensor& loss_sum, GPT& model, double max_norm) override {
        wing_.mark(StepMark::backward_done);
        loss = loss_sum.item() / static_cast<double>(t_.cfg_.train.grad_accum);
        bool stop = false;
        loss = wing_.loss_over_ranks(loss, stop);
        if (stop) {  // every rank stops after this step
            t_.stop_agreed_ = true;
            request_stop();
        }
        wing_.mark(StepMark::exchange_done);
        GradNorm clip;
        if (wing_.grad_norm(max_norm, clip)) return clip;
        return StepHooks::gradients_done(loss_sum, model, max_norm);
    }
    void update(const Tensor&, const GradNorm& clip) override {
        const Config& c = t_.cfg_;
        norm = clip.norm.item();
        t_.check_finite(t_.step_ + 1, loss, norm);
        lr = cosine_lr(t_.step_, c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.train.steps);
        t_.opt_->step(lr, clip.coef);  // AdamW applies the clip factor inside its update
        wing_.mark(StepMark::update_done);
    }

private:
    Trainer& t_;
    Wing& wing_;
};

void Trainer::check_finite(std::int64_t step, double loss, double norm) const {
    // A non-finite loss or norm (too high a learning rate, bad data) would turn every weight
    // into NaN at the update: stop before it, so the last checkpoint stays the last good state.
    const bool loss_bad = !std::isfinite(loss);
    FG_CHECK(!loss_bad && std::isfinite(norm), "train", "the ",
             loss_bad ? "training loss" : "gradient norm", " at step ", step, " is ",
             loss_bad ? loss : norm, " (optim.lr = ", cfg_.optim.lr,
             "); stopped before updating the weights, the last checkpoint in '", dir_,
             "' is kept");
}

bool Trainer::queued_step() {
    const bool first = !queued_->captured();
    try {
        queued_->enqueue(*data_, data_gen_, step_);
    } catch (const QueuedSteps::CaptureFailed& e) {  // anything else is the run's error
        log_ << "cuda_graph: the step could not be captured, steps run eagerly from here: "
             << e.what() << "\n";
        queued_.reset();
        return false;
    }
    ++step_;
    if (first) {
        log_ << "cuda_graph: step " << step_ << " captured; the steps after it replay it\n";
        collected_at_ = std::chrono::steady_clock::now();  // the capture is not a step's time
    }
    return true;
}

void Trainer::collect_queued_steps() {
    const QueuedSteps::Collected got = queued_->collect();
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - collected_at_).count() /
                      static_cast<double>(std::max<std::size_t>(1, got.losses.size()));
    collected_at_ = now;
    const Config& c = cfg_;
    for (std::size_t i = 0; i < got.losses.size(); ++i) {
        const std::int64_t step = got.first_step + static_cast<std::int64_t>(i);
        const double loss = got.losses[i], norm = got.norms[i];
        if (step == got.halted_at) {
            // The device skipped this update and the later ones: the trainer is at the step
            // before, as after an eager stop, and the graph (its device state halted) is gone.
            step_ = step - 1;
            queued_.reset();
            check_finite(step, loss, norm);  // throws, unless the halt was for bad input:
            fail("train", "step ", step, " stopped on the device: a kernel found bad input "
                 "(reported at the next synchronisation of the rank that found it); the last "
                 "checkpoint in '", dir_, "' is kept");
        }
        const double lr = cosine_lr(step - 1, c.optim.lr, c.optim.min_lr, c.optim.warmup_steps,
                                    c.train.steps);
        report_step(step, loss, lr, norm, ms);
    }
    if (got.stopped_at != 0) {  // as after an eager step's agreed stop
        step_ = got.stopped_at;
        data_gen_ = got.data_at_stop;
        stop_agreed_ = true;
        request_stop();
    }
}

void Trainer::report_step(std::int64_t step, double loss, double lr, double norm, double ms) {
    const Config& c = cfg_;
    losses_.push_back(loss);
    const std::int64_t tokens_per_step =
        c.train.batch_size * c.train.grad_accum * data_->sequence_length();
    const std::int64_t print_every = std::max<std::int64_t>(1, c.train.eval_interval / 5);
    const double tps = tokens_per_step / (ms / 1000.0);
    ms_average_ = ms_average_ == 0.0 ? ms : 0.9 * ms_average_ + 0.1 * ms;
    // MFU: achieved model FLOP/s over the GPU's dense peak (absent on CPU or an unknown GPU), by
    // PaLM's count and by llm.c's. With several ranks, tps is all of them: each GPU's share.
    double mfu[2] = {-1.0, -1.0};
    for (int k = 0; k < 2 && peak_tflops_ > 0; ++k)
        mfu[k] = flops_per_token_[k] * tps / wing_->world_size() / (peak_tflops_ * 1e12);
    const double peak_mib =
        device_ == Device::cuda
            ? memory_stats(Device::cuda).peak_bytes_in_use / (1024.0 * 1024.0) : -1.0;
    nlohmann::ordered_json line{{"step", step},
                                {"loss", rounded(loss, "%.6f")},
                                {"lr", rounded(lr, "%.6g")},
                                {"grad_norm", rounded(norm, "%.5f")},
                                {"ms", rounded(ms, "%.2f")}};
    // Tokens per second as a whole number (null for a step too short for the clock).
    line["tokens_per_s"] = std::isfinite(tps) ? nlohmann::ordered_json(std::llround(tps))
                                              : nlohmann::ordered_json();
    if (mfu[0] >= 0) {
        line["mfu"] = rounded(mfu[0], "%.4f");
        line["mfu_6lct"] = rounded(mfu[1], "%.4f");
    }
    if (peak_mib >= 0) line["peak_mem_mib"] = rounded(peak_mib, "%.1f");
    log_metrics(line.dump());
    if (step % print_every == 0 || step == 1) {
        log_ << (progress_bar_ ? "\r\x1b[K" : "") << "step " << step << "/" << c.train.steps
             << "  loss " << fmt("%.4f", loss) << "  lr " << fmt("%.2e", lr) << "  |g| "
             << fmt("%.3f", norm) << "  " << fmt("%.1f", ms) << " ms/step  " << fmt("%.0f", tps)
             << " tok/s";
        if (mfu[0] >= 0)
            log_ << "  MFU " << fmt("%.1f", 100 * mfu[0]) << "% (6LCT "
                 << fmt("%.1f", 100 * mfu[1]) << "%)";
        if (peak_mib >= 0) log_ << "  peak " << fmt("%.0f", peak_mib) << " MiB";
        log_ << "\n" << std::flush;
    }
}

void Trainer::run(std::int64_t stop_at) {
    const Config& c = cfg_;
    const std::int64_t last = stop_at >= 0 ? std::min(stop_at, c.train.steps) : c.train.steps;
    const std::int64_t print_every = std::max<std::int64_t>(1, c.train.eval_interval / 5);
    const char* clear_bar = progress_bar_ ? "\r\x1b[K" : "";  // erase the bar before a log line
    if (device_ == Device::cuda) reset_peak_memory(Device::cuda);
    // The first step of this call runs eagerly; the next is captured, when it can be.
    const std::string no_graph = wing_->queued_steps_unsupported(c, device_, *opt_);
    if (step_ < last)
        log_ << "steps: " << (no_graph.empty() ? "captured as one CUDA graph from the second "
                                                 "step on (kernels.cuda_graph)"
                                               : "launched one kernel at a time (" + no_graph + ")")
             << "\n";
    bool first = true;
    ms_average_ = 0.0;
    wing_->run_begin();
    // The queued steps live for this call only, also when it ends in an error (their device
    // state may then be halted, and the parameters' addresses they hold may change after it).
    struct DropQueue {
        std::unique_ptr<QueuedSteps>& queued;
        ~DropQueue() { queued.reset(); }
    } drop_queue{queued_};
    queued_.reset();
    while (step_ < last && !should_stop()) {
        if (queued_) {
            if (!queued_step()) continue;  // could not capture: this step again, eagerly
            // The host meets the device where it logs, evaluates or saves, and every kWindow
            // steps (the ring's length).
            const bool meet = step_ % print_every == 0 || step_ % c.train.eval_interval == 0 ||
                              step_ % c.train.checkpoint_interval == 0 || step_ == last ||
                              queued_->pending() == QueuedSteps::kWindow || should_stop();
            if (!meet) continue;
            collect_queued_steps();
        } else {
            const auto start = std::chrono::steady_clock::now();
            EagerStep hooks(*this);
            training_step(*model_, *opt_, c.train.grad_accum, c.optim.grad_clip, hooks);
            ++step_;
            const auto end = std::chrono::steady_clock::now();
            const double ms = std::chrono::duration<double, std::milli>(end - start).count();
            report_step(step_, hooks.loss, hooks.lr, hooks.norm, ms);
            wing_->step_done(ms);
            if (first && !packed_cudnn_attention_failure().empty())
                log_ << "attention: cuDNN refused q, k, v where the QKV projection writes them, "
                        "so it runs between permutes: " << packed_cudnn_attention_failure()
                     << "\n";
            if (first && !linear_epilogue_failure().empty())
                log_ << "linear: " << linear_epilogue_failure() << "\n";
            if (first && no_graph.empty()) {
                try {
                    queued_ = wing_->queue_steps(*model_, *opt_, cfg_, data_->sequence_length());
                } catch (const std::exception& e) {
                    log_ << "cuda_graph: no room for the captured step's buffers, steps run "
                            "eagerly: " << e.what() << "\n";
                }
                collected_at_ = std::chrono::steady_clock::now();
            }
            first = false;
        }
        if (step_ % c.train.eval_interval == 0 || step_ == c.train.steps) {
            EvalResult e = evaluate_model(*model_, *data_, cfg_, device_, wing_->eval_share());
            bool best = e.val_loss < best_val_;
            if (best && writer()) {
                try {
                    save_safetensors((fs::path(dir_) / "best.safetensors").string(),
                                     to_list(model_->state_dict()),
                                     {{"format", "pt"}, {"step", std::to_string(step_)}});
                } catch (const std::exception& e) {
                    fail("checkpoint", "saving the best weights at step ", step_, " failed: ",
                         e.what(), has_checkpoint(dir_) ? "; the last good checkpoint in '" +
                                                              dir_ + "' is kept"
                                                        : "; no checkpoint was written before it");
                }
            }
            if (best) best_val_ = e.val_loss;
            nlohmann::ordered_json eval_line{{"step", step_},
                                             {"train_loss", rounded(e.train_loss, "%.6f")},
                                             {"val_loss", rounded(e.val_loss, "%.6f")}};
            if (e.accuracy >= 0) eval_line["accuracy"] = rounded(e.accuracy, "%.4f");
            log_metrics(eval_line.dump());
            log_ << clear_bar << "eval step " << step_ << ": train loss " << fmt("%.4f", e.train_loss)
                 << ", val loss " << fmt("%.4f", e.val_loss);
            if (e.accuracy >= 0) log_ << ", held-out exact match " << fmt("%.1f", 100 * e.accuracy) << "%";
            log_ << (best ? " (best so far)" : "") << "\n" << std::flush;
            if (queued_) collected_at_ = std::chrono::steady_clock::now();  // not a step's time
        }
        if (step_ % c.train.checkpoint_interval == 0) {
            save_checkpoint();
            if (queued_) collected_at_ = std::chrono::steady_clock::now();
        }
        if (progress_bar_ && !losses_.empty())
            log_ << "\r" << progress_line(step_, c.train.steps, losses_.back(), ms_average_)
                 << std::flush;
    }
    if (queued_ && queued_->pending() > 0) collect_queued_steps();
    queued_.reset();  // it holds the parameters' addresses: the next run() captures anew
    if (progress_bar_) log_ << clear_bar;
    wing_->run_end(log_, step_);
    if (saved_step_ != step_) save_checkpoint();  // unless the loop just saved this step
    if (should_stop()) log_ << "stopped at step " << step_ << "; checkpoint saved in " << dir_ << "\n";
}

}  // namespace fg
