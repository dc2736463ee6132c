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
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/gpt_memory.h"
#include "plot.h"
#include "progress.h"
#include "checkpoint.h"
#include "safetensors.h"

#define XXH_INLINE_ALL  // header-only xxHash (train/CMakeLists.txt)
#include <xxhash.h>

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

// Copies a checkpoint tensor into `target`, keeping its device and requires_grad.
void assign(Tensor& target, const Tensor& source, const std::string& name, const std::string& file,
            Device device) {
    if (target.defined())
        FG_CHECK(source.shape() == target.shape(), "load", "'", file, "': ", name, " has shape ",
                 shape_str(source.shape()), ", the model needs ", shape_str(target.shape()),
                 " (a different model shape?)");
    bool grad = target.defined() && target.requires_grad();
    NoGradGuard no_grad;
    target = source.to(device).detach();
    if (grad) target.set_requires_grad(true);
}


// The activations' dtype (GPTConfig::compute_dtype) and the attention's head size D.
DType compute_dtype(const Config& c) { return precision_settings(c).compute; }
std::int64_t head_dim(const Config& c) { return c.model.n_embd / c.model.n_head; }

// The attention calls of this config's training steps on `device`, as the op sees them.
AttentionCall training_attention(const Config& c, Device device) {
    return {device, compute_dtype(c), head_dim(c), c.model.block_size, true, true};
}

}  // namespace

Device resolve_device(DeviceChoice choice) {
    if (choice == DeviceChoice::cpu) return Device::cpu;
    if (choice == DeviceChoice::cuda) {
        cuda_backend("train.device: cuda");  // a clear error without a GPU or a CUDA build
        return Device::cuda;
    }
    return cuda_is_available() ? Device::cuda : Device::cpu;
}

// The model a config describes, with `vocab` tokens unless model.vocab_size says more.
GPTConfig gpt_config(const Config& c, std::int64_t vocab) {
    GPTConfig g;
    g.vocab_size = c.model.vocab_size ? c.model.vocab_size : vocab;
    g.block_size = c.model.block_size;
    g.n_layer = c.model.n_layer;
    g.n_head = c.model.n_head;
    g.n_embd = c.model.n_embd;
    g.rmsnorm = c.model.norm == NormLayer::rmsnorm;
    g.gelu = c.model.gelu;
    g.bias = c.model.bias;
    g.dropout = c.model.dropout;
    g.compute_dtype = compute_dtype(c);
    return g;
}

// The model is built from its shape alone (gpt_config); the kernels' settings are a different
// concern and are set here, once, on the modules that read them. A setting added later (an
// attention backend, say) touches the config schema, this function and the layer that reads it,
// not every constructor between the config and that layer; a layer built by hand keeps its own
// constructor default (NormConfig::reduction) or its setter; and nothing global or mutable lives
// outside the modules.
void configure_kernels(Module& model, const Config& c) {
    const NormReduction reduction = c.kernels.norm_reduction;
    const AttentionBackend attention = c.kernels.attention;
    const bool tf32 = precision_settings(c).tf32;
    if (attention == AttentionBackend::cudnn) {
        const std::vector<Tensor*> params = model.parameters();
        const Device device = params.empty() ? Device::cpu : params.front()->device();
        const std::string why = cudnn_attention_unsupported(training_attention(c, device));
        FG_CHECK(why.empty(), "train", "kernels.attention is cudnn, but cuDNN's fused attention "
                 "cannot run this model: ", why, "; set kernels.attention to auto or fused");
    }
    model.apply([reduction, attention, tf32](Module& m) {
        if (auto* norm = dynamic_cast<NormBase*>(&m)) norm->set_reduction(reduction);
        if (auto* attn = dynamic_cast<CausalSelfAttention*>(&m)) attn->set_backend(attention);
        if (auto* layer = dynamic_cast<Linear*>(&m)) layer->set_tf32(tf32);
        if (auto* gpt = dynamic_cast<GPT*>(&m)) gpt->set_tf32(tf32);
    });
}

// The memory one step of this run needs, checked against what the device has available before
// the model is built or anything is written, so that a batch too large for the machine is
// refused with the number instead of ending in an out-of-memory error part way through.
TrainingMemory check_memory(const Config& c, const GPTConfig& g, std::int64_t seq_len,
                            Device device, int world_size) {
    // Each rank holds its share of the batch.
    TrainingMemory need = estimate_training_memory(g, c.train.batch_size / world_size, seq_len,
                                                   c.optim.name == OptimizerKind::sgd ? 1 : 2,
                                                   attention_runs_cudnn(training_attention(c, device),
                                                                        c.kernels.attention));
    if (world_size > 1) {
        // The gradients live in the exchange's buckets, all of them from the step's start; bf16
        // sums travel as rounded copies of the buckets (half their bytes); ZeRO-1 keeps
        // 1 / world_size of AdamW's state, and its slice of the sums (in the wire's type, then
        // averaged in f32).
        const double ranks = static_cast<double>(world_size);
        const double wire = precision_settings(c).exchange == DType::bf16 ? 0.5 : 1.0;
        need.gradients = need.parameters;
        need.exchange = wire < 1.0 ? wire * need.parameters : 0.0;
        if (c.train.zero == 1) {
            need.optimizer_state /= ranks;
            need.exchange += (wire + 1.0) * need.parameters / ranks;
        }
    }
    if (!c.train.memory_check) return need;
    const double available = static_cast<double>(available_memory(device));
    FG_CHECK(need.total() <= available, "train", "one step of this run needs about ",
             need.describe(), " (train.batch_size ", c.train.batch_size, " x ", seq_len,
             " tokens), but ", device_name(device), " has ",
             format_bytes(static_cast<std::size_t>(available)),
             " available: reduce train.batch_size (raise train.grad_accum to keep the tokens "
             "per step), model.block_size or the model's size; or set train.memory_check=false "
             "to try anyway");
    return need;
}

void load_weights(GPT& model, const std::string& path, Device device) {
    SafetensorsFile weights = load_safetensors(path);
    auto params = model.state_dict();
    for (const auto& [name, t] : weights.tensors) {  // every tensor is one of the model's
        bool known = false;
        for (const auto& [n, p] : params) known = known || n == name;
        FG_CHECK(known, "load", "'", path, "' holds a tensor '", name,
                 "' that the model does not have (a different model, or a damaged file)");
        const Tensor f = t.to(DType::f64);
        for (double v : f.to_vector<double>())
            FG_CHECK(std::isfinite(v), "load", "'", path, "': tensor '", name,
                     "' holds a non-finite value (", v, "): these weights cannot be used");
    }
    for (auto& [name, p] : params) {
        const Tensor* t = weights.find(name);
        FG_CHECK(t != nullptr, "load", "'", path, "' has no tensor '", name,
                 "' (a different model shape?)");
        assign(*p, *t, name, path, device);
    }
}

LoadedModel load_run(const std::string& run_dir, bool best, Device device) {
    LoadedModel out;
    fs::path dir(run_dir);
    out.config = load_config((dir / "config.yaml").string());
    std::ifstream vocab_file(dir / "vocab.txt", std::ios::binary);
    FG_CHECK(vocab_file.good(), "load", "'", run_dir, "' has no vocab.txt (is it a run directory?)");
    out.vocab = Vocab::parse(std::string(std::istreambuf_iterator<char>(vocab_file), {}));
    // The model config.yaml describes must fit before it is built (a damaged or edited config
    // could ask for any size): its weights, with the same estimate training uses.
    const GPTConfig shape = gpt_config(out.config, out.vocab.size());
    const double weights_bytes = estimate_training_memory(shape, 1, 1, 0).parameters;
    const double available = static_cast<double>(available_memory(device));
    FG_CHECK(weights_bytes <= available, "load", "the model '", (dir / "config.yaml").string(),
             "' describes needs ", format_bytes(weights_bytes),
             " for its weights, but ", device_name(device), " has ",
             format_bytes(static_cast<std::size_t>(available)), " available");
    Generator init(0);  // overwritten by the checkpoint
    out.model = std::make_unique<GPT>(shape, init, device);
    // Kernels are a matter of speed: a run trained with kernels.attention=cudnn is still read
    // where cuDNN cannot run (sample or eval on the CPU), with the automatic choice.
    Config kernels = out.config;
    if (kernels.kernels.attention == AttentionBackend::cudnn &&
        !cudnn_attention_unsupported(training_attention(kernels, device)).empty())
        kernels.kernels.attention = AttentionBackend::automatic;
    configure_kernels(*out.model, kernels);
    // The latest weights as --resume reads them: the checkpoint the manifest names, every file's
    // size and checksum verified (model.safetensors at the top is a link to the same bytes).
    std::string weights = (dir / (best ? "best.safetensors" : "model.safetensors")).string();
    if (!best && has_checkpoint(run_dir)) {
        const CheckpointManifest m = verified_checkpoint(run_dir);
        FG_CHECK(m.files.count("model.safetensors"), "load", "the checkpoint of step ", m.step,
                 " in '", run_dir, "' has no model.safetensors");
        weights = (dir / m.folder / "model.safetensors").string();
    }
    load_weights(*out.model, weights, device);
    out.model->train(false);
    return out;
}

void Trainer::request_stop() { g_stop = true; }
bool Trainer::stop_requested() { return g_stop; }

Trainer::Trainer(const Config& config, std::ostream& log) : Trainer(config, log, false) {}

namespace {

// Where a rank's log goes: rank 0's to `log`, the others' nowhere (their errors still reach the
// caller as exceptions).
std::ostream& rank_log(std::ostream& log) {
    static std::ostream nowhere(nullptr);
    return distributed_env().rank == 0 ? log : nowhere;
}

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

// How long ranks wait for each other: to meet, and at every exchange. A rank that stops closes
// its connections, so the others hear of it at once; this bounds a rank that hangs.
constexpr double kRanksTimeoutSeconds = 600.0;

// data.path and data.val_path made absolute (a glob's folders too), so that the run directory's
// config.yaml reads the same data from any working directory (sample, eval, --resume).
Config with_absolute_data_paths(Config c) {
    for (std::string* path : {&c.data.path, &c.data.val_path})
        if (!path->empty()) *path = fs::absolute(*path).lexically_normal().string();
    return c;
}

}  // namespace

void require_data_files(const Config& c, const std::string& run_dir) {
    if (c.data.kind != DataKind::text) return;  // shards name their own missing files
    std::error_code ec;
    FG_CHECK(fs::exists(c.data.path, ec), "data", "the run's text file '", c.data.path,
             "' is not there (data.path in ", (fs::path(run_dir) / "config.yaml").string(),
             "; a relative path is read from the working directory, ",
             fs::current_path(ec).string(), "): edit data.path there to the file's path");
}

Trainer::Trainer(const Config& config, std::ostream& log, bool resuming)
    : cfg_(resuming ? config : with_absolute_data_paths(config)), log_(rank_log(log)), device_(resolve_device(config.train.device)),
      dir_(config.train.out_dir), data_gen_(static_cast<std::uint64_t>(config.train.seed) + 1),
      dist_(distributed_env()) {
    const Config& c = cfg_;
    // Checked before the ranks meet: these fail on every rank alike when the ranks run one
    // config (which they check once they meet), and a launcher (fusegrad --ranks, torchrun,
    // srun --kill-on-bad-exit) stops the others when one rank fails.
    FG_CHECK(c.train.zero == 0 || c.optim.name == OptimizerKind::adamw, "train", "train.zero: 1 "
             "splits AdamW's state over the ranks, but optim.name is sgd");
    if (dist_.distributed()) {
        if (device_ == Device::cuda) {
            // The GPU of this rank's LOCAL_RANK, before anything touches one; every GPU stays
            // visible (NCCL's peer-to-peer needs them). A process shown one GPU takes it.
            CudaBackend& cuda = cuda_backend("train");
            const int gpus = cuda.device_count();
            FG_CHECK(gpus == 1 || dist_.local_rank < gpus, "train", "LOCAL_RANK is ",
                     dist_.local_rank, " but this process sees ", gpus, " GPUs "
                     "(CUDA_VISIBLE_DEVICES): one rank a GPU");
            cuda.select_device(gpus == 1 ? 0 : dist_.local_rank);
            const std::string no_nccl = cuda.nccl_unavailable();
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
            // Rank 0 makes NCCL's id, the TCP group hands it to the others, and every rank
            // joins the communicator.
            CudaBackend& cuda = cuda_backend("train");
            const std::vector<std::uint8_t> id =
                group_->broadcast(dist_.rank == 0 ? cuda.nccl_unique_id()
                                                  : std::vector<std::uint8_t>{});
            nccl_ = std::shared_ptr<void>(
                cuda.nccl_communicator(id, dist_.world_size, dist_.rank), [](void* comm) {
                    if (CudaBackend* b = cuda_backend_or_null()) b->nccl_destroy(comm);
                });
        }
    }
    data_ = make_dataset(c);
    std::int64_t vocab = data_->vocab().size();
    FG_CHECK(c.model.vocab_size == 0 || c.model.vocab_size >= vocab, "train", "model.vocab_size (",
             c.model.vocab_size, ") is smaller than the data's vocabulary (", vocab, ")");
    FG_CHECK(data_->sequence_length() <= c.model.block_size, "train", "model.block_size (",
             c.model.block_size, ") is shorter than one addition problem (",
             data_->sequence_length(), " tokens)");
    const TrainingMemory need =
        check_memory(c, gpt_config(c, vocab), data_->sequence_length(), device_, dist_.world_size);
    Generator init(static_cast<std::uint64_t>(c.train.seed));
    model_ = std::make_unique<GPT>(gpt_config(c, vocab), init, device_);
    configure_kernels(*model_, c);  // a resume's kernels.* too: the config it was given
    for (auto& [name, p] : model_->named_parameters()) params_.push_back({name, p});
    if (group_) {
        collectives_ = nccl_ ? nccl_collectives(nccl_.get(), *group_, kRanksTimeoutSeconds)
                             : tcp_collectives(*group_);
        exchange_ = std::make_unique<GradientExchange>(params_, *collectives_, dist_.rank,
                                                       dist_.world_size, c.train.zero == 1,
                                                       static_cast<std::size_t>(
                                                           c.train.bucket_mb * 1048576.0),
                                                       precision_settings(c).exchange);
    }
    opt_ = exchange_ && exchange_->zero()
               ? std::make_unique<ShardedAdamW>(params_, adamw_options(c), *exchange_)
               : make_optimizer(c, params_);
    default_generator().set_state(static_cast<std::uint64_t>(c.train.seed) + 2, 0);  // dropout
    // Ranks draw their rows' share of each dropout mask: one process's masks (core/random.h).
    default_generator().set_shard(dist_.rank, dist_.world_size);
    flops_per_token_ = gpt_flops_per_token(model_->num_parameters() - model_->wpe.weight.numel(),
                                           c.model.n_layer, c.model.n_embd, data_->sequence_length());
    if (device_ == Device::cuda)
        peak_tflops_ = peak_tflops(cuda_backend("train").device_info().name, c.train.precision);
    if (c.train.phase_times && device_ == Device::cuda) phases_ = std::make_unique<StepPhases>();

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
    if (exchange_) {
        log_ << "ranks: " << dist_.world_size << ", " << exchange_->bucket_count()
             << " gradient buckets of at most "
             << format_bytes(exchange_->bucket_bytes_max()) << " exchanged in "
             << dtype_name(exchange_->wire()) << " during the backward"
             << (exchange_->zero() ? " (ZeRO-1: reduce-scattered; AdamW's state and update split "
                                     "over the ranks, the weights all-gathered)"
                                   : " (all-reduced)")
             << ", batches of " << c.train.batch_size << " rows split "
             << c.train.batch_size / dist_.world_size << " a rank\n"
             << "ranks: each keeps " << format_bytes(opt_->state_bytes())
             << " of optimizer state and " << format_bytes(exchange_->buffer_bytes())
             << " of gradient buckets\n";
    } else if (c.train.zero == 1) {
        log_ << "note: train.zero: 1 splits AdamW's state over several ranks; with one it has no "
                "effect\n";
    }
    if (c.train.phase_times && !phases_)
        log_ << "note: train.phase_times times GPU steps; on the CPU it has no effect\n";
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
                                         std::ostream& log) {
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
    std::unique_ptr<Trainer> t(new Trainer(cfg, log, true));
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
        // A line that is not JSON was cut short by a kill while it was written, so it is of a
        // step after the checkpoint (whose lines were complete before it was committed): dropped.
        // (Or a line of an older fusegrad that printed a non-finite number, which JSON cannot
        // hold and plot.cpp skips too.)
        if (j.is_discarded()) {
            dropped = true;
            continue;
        }
        const std::int64_t step = j.is_object() && j.contains("step") && j["step"].is_number()
                                      ? j["step"].get<std::int64_t>()
                                      : 0;
        if (step > step_) {
            dropped = true;
            continue;
        }
        kept += line + "\n";
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
        assign(*p, *t, name, model_path, device_);
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
            assign(*t, *s, name, state_path, t->defined() ? t->device() : device_);
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
        const auto ranks = static_cast<std::uint64_t>(dist_.world_size);
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
                          {"world_size", std::to_string(dist_.world_size)}});
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

double Trainer::train_step() {
    const Config& c = cfg_;
    if (phases_) phases_->mark(StepPhases::kStart);
    model_->train(true);
    opt_->zero_grad();
    if (exchange_) exchange_->attach_gradients();  // the backward writes into the buckets
    // The micro-batches' losses are summed where they are computed, and the gradients' norm and
    // clip factor computed there too: the host waits once, for the sum and the norm, when the
    // whole forward and backward of the step are queued.
    Tensor loss_total;
    for (std::int64_t micro = 0; micro < c.train.grad_accum; ++micro) {
        // Several ranks: every rank draws the whole batch, the same rows, and keeps its share.
        Batch b = data_->batch(Split::train, c.train.batch_size, data_gen_,
                               group_ ? Device::cpu : device_);
        if (group_) {
            b = shard_batch(b, dist_.rank, dist_.world_size);
            b = Batch{b.inputs.to(device_), b.targets.to(device_)};
        }
        Tensor loss = model_->loss(model_->forward(b.inputs), b.targets);
        // Several ranks: the last micro-batch's backward finishes the gradients, and starts
        // their exchange bucket by bucket as it goes.
        if (exchange_ && micro == c.train.grad_accum - 1) exchange_->arm();
        scale(loss, 1.0 / static_cast<double>(c.train.grad_accum)).backward();
        loss_total = loss_total.defined() ? add(loss_total, loss.detach()) : loss.detach();
    }
    if (phases_) phases_->mark(StepPhases::kBackwardDone);
    double loss = loss_total.item() / static_cast<double>(c.train.grad_accum);
    if (group_) loss = average_over_ranks(loss);
    if (phases_) phases_->mark(StepPhases::kExchangeDone);
    GradNorm clip = exchange_ && exchange_->zero()
                        ? exchange_->grad_norm(c.optim.grad_clip)  // from the ranks' slices
                        : grad_norm(model_->parameters(), c.optim.grad_clip);
    const double norm = clip.norm.item();
    check_finite(step_ + 1, loss, norm);
    double lr = cosine_lr(step_, c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.train.steps);
    opt_->step(lr, clip.coef);  // AdamW applies the clip factor inside its update
    if (phases_) phases_->mark(StepPhases::kUpdateDone);
    ++step_;
    losses_.push_back(loss);
    last_lr_ = lr;
    last_norm_ = norm;
    return loss;
}

double Trainer::average_over_ranks(double loss) {
    const double share = 1.0 / static_cast<double>(dist_.world_size);
    exchange_->finish();
    // The loss, and whether any rank was asked to stop (Ctrl-C, SIGTERM): all ranks then stop
    // after this same step, and rank 0 saves it.
    double shared[2] = {loss, stop_requested() ? 1.0 : 0.0};
    group_->all_reduce_sum(shared, 2);
    if (shared[1] > 0) {
        stop_agreed_ = true;
        request_stop();
    }
    return shared[0] * share;
}

void Trainer::check_replicas_identical() {
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
        FG_CHECK(all[r] == all[0], "train", "after step ", step_, " rank ", r,
                 "'s weights differ from rank 0's: the ranks did not stay in step");
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(mine));
    log_ << "ranks: the " << dist_.world_size << " ranks' weights are identical after step "
         << step_ << " (xxh3 " << hex << ")\n";
}

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

bool Trainer::captured_step() {
    const bool first = !graph_->captured();
    try {
        graph_->enqueue(*data_, data_gen_, step_);
    } catch (const CaptureFailed& e) {  // anything else is the run's error
        log_ << "cuda_graph: the step could not be captured, steps run eagerly from here: "
             << e.what() << "\n";
        graph_.reset();
        return false;
    }
    ++step_;
    if (first) {
        log_ << "cuda_graph: step " << step_ << " captured; the steps after it replay it\n";
        collected_at_ = std::chrono::steady_clock::now();  // the capture is not a step's time
    }
    return true;
}

void Trainer::collect_captured_steps() {
    const CapturedStep::Collected got = graph_->collect();
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
            graph_.reset();
            check_finite(step, loss, norm);  // throws, unless the halt was for bad input:
            fail("train", "step ", step, " stopped on the device: a kernel found bad input "
                 "(reported at the next synchronisation); the last checkpoint in '", dir_,
                 "' is kept");
        }
        const double lr = cosine_lr(step - 1, c.optim.lr, c.optim.min_lr, c.optim.warmup_steps,
                                    c.train.steps);
        losses_.push_back(loss);
        last_lr_ = lr;
        last_norm_ = norm;
        report_step(step, loss, lr, norm, ms);
    }
}

EvalResult Trainer::evaluate() {
    EvalShare share;
    if (group_) {
        share.rank = dist_.rank;
        share.world_size = dist_.world_size;
        share.sum = [this](double* v, std::size_t n) { group_->all_reduce_sum(v, n); };
    }
    return evaluate_model(*model_, *data_, cfg_, device_, share);
}

AdamWOptions adamw_options(const Config& c) {
    AdamWOptions o;
    o.beta1 = c.optim.beta1;
    o.beta2 = c.optim.beta2;
    o.weight_decay = c.optim.weight_decay;
    return o;
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const std::vector<NamedParam>& params) {
    if (c.optim.name == OptimizerKind::sgd)
        return std::make_unique<SGD>(params, SGDOptions{c.optim.momentum, c.optim.weight_decay});
    return std::make_unique<AdamW>(params, adamw_options(c));
}

std::unique_ptr<Dataset> make_dataset(const Config& c) {
    if (c.data.kind == DataKind::addition)
        return std::make_unique<AdditionData>(c.data.digits, c.data.val_fraction,
                                              static_cast<std::uint64_t>(c.train.seed));
    if (c.data.kind == DataKind::shards)
        return std::make_unique<ShardData>(c.data.path, c.data.val_path, c.data.format,
                                           c.data.vocab_size, c.model.block_size);
    if (c.data.kind == DataKind::random_tokens)
        return std::make_unique<RandomTokenData>(c.data.vocab_size, c.model.block_size);
    return std::make_unique<TextData>(c.data.path, c.data.val_fraction, c.model.block_size);
}

EvalResult evaluate_model(GPT& model, const Dataset& data, const Config& cfg, Device device,
                          const EvalShare& share) {
    NoGradGuard no_grad;
    bool was_training = model.training();
    model.train(false);
    EvalResult r;
    Generator gen(static_cast<std::uint64_t>(cfg.train.seed) + 3);  // the same batches each time
    const auto mine = [&share](std::int64_t i) { return i % share.world_size == share.rank; };
    double totals[3] = {0.0, 0.0, 0.0};  // train loss, val loss, held-out problems right
    for (Split split : {Split::train, Split::val}) {
        double& total = totals[split == Split::train ? 0 : 1];
        for (std::int64_t i = 0; i < cfg.train.eval_iters; ++i) {
            // Every rank draws every batch (the generator moves the same way), its own it uses.
            Batch b = data.batch(split, cfg.train.batch_size, gen, mine(i) ? device : Device::cpu);
            if (mine(i)) total += model.loss(model.forward(b.inputs), b.targets).item();
        }
    }
    const AdditionData* add = dynamic_cast<const AdditionData*>(&data);
    std::int64_t problems = 0;
    if (add) {
        auto all_pairs = add->held_out_pairs();
        if (all_pairs.size() > 2000) all_pairs.resize(2000);
        problems = static_cast<std::int64_t>(all_pairs.size());
        std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
        for (std::size_t i = 0; i < all_pairs.size(); ++i)
            if (mine(static_cast<std::int64_t>(i))) pairs.push_back(all_pairs[i]);
        if (!pairs.empty()) {  // a rank may have none of few problems
            std::vector<std::int32_t> prompt_ids;
            for (auto [a, b] : pairs) {
                std::vector<std::int32_t> ids = add->vocab().encode(add->prompt(a, b));
                prompt_ids.insert(prompt_ids.end(), ids.begin(), ids.end());
            }
            const auto n = static_cast<std::int64_t>(pairs.size()), p = 2 * add->digits() + 2;
            Tensor out = generate(model, Tensor::from_vector(prompt_ids, {n, p}, device),
                                  add->digits() + 1, 0.0, 0, gen, add->vocab().size());
            std::vector<std::int32_t> ids = out.to_vector<std::int32_t>();
            const std::int64_t width = p + add->digits() + 1;
            for (std::int64_t i = 0; i < n; ++i) {
                std::vector<std::int32_t> row(ids.begin() + i * width,
                                              ids.begin() + (i + 1) * width);
                const auto [x, y] = pairs[static_cast<std::size_t>(i)];
                totals[2] += add->vocab().decode(row) == add->problem(x, y);
            }
        }
    }
    if (share.sum) share.sum(totals, 3);
    r.train_loss = totals[0] / static_cast<double>(cfg.train.eval_iters);
    r.val_loss = totals[1] / static_cast<double>(cfg.train.eval_iters);
    if (add) r.accuracy = problems ? totals[2] / static_cast<double>(problems) : 0.0;
    model.train(was_training);
    return r;
}

void Trainer::report_step(std::int64_t step, double loss, double lr, double norm, double ms) {
    const Config& c = cfg_;
    const std::int64_t tokens_per_step =
        c.train.batch_size * c.train.grad_accum * data_->sequence_length();
    const std::int64_t print_every = std::max<std::int64_t>(1, c.train.eval_interval / 5);
    const double tps = tokens_per_step / (ms / 1000.0);
    ms_average_ = ms_average_ == 0.0 ? ms : 0.9 * ms_average_ + 0.1 * ms;
    // MFU: achieved model FLOP/s over the GPU's dense peak (absent on CPU or an unknown GPU).
    // With several ranks, tps is all of them together: each GPU's share.
    const double mfu = peak_tflops_ > 0 ? flops_per_token_ * tps / dist_.world_size /
                                              (peak_tflops_ * 1e12)
                                        : -1.0;
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
    if (mfu >= 0) line["mfu"] = rounded(mfu, "%.4f");
    if (peak_mib >= 0) line["peak_mem_mib"] = rounded(peak_mib, "%.1f");
    log_metrics(line.dump());
    if (step % print_every == 0 || step == 1) {
        log_ << (progress_bar_ ? "\r\x1b[K" : "") << "step " << step << "/" << c.train.steps
             << "  loss " << fmt("%.4f", loss) << "  lr " << fmt("%.2e", lr) << "  |g| "
             << fmt("%.3f", norm) << "  " << fmt("%.1f", ms) << " ms/step  " << fmt("%.0f", tps)
             << " tok/s";
        if (mfu >= 0) log_ << "  MFU " << fmt("%.1f", 100 * mfu) << "%";
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
    const std::string no_graph =
        group_ && device_ == Device::cuda
            ? "several ranks: the gradients' exchange is not part of the captured step yet"
            : cuda_graph_unsupported(c, device_, *opt_);
    if (step_ < last)
        log_ << "steps: " << (no_graph.empty() ? "captured as one CUDA graph from the second "
                                                 "step on (kernels.cuda_graph)"
                                               : "launched one kernel at a time (" + no_graph + ")")
             << "\n";
    bool first = true;
    ms_average_ = 0.0;
    if (phases_) phases_->reset();  // this call's steps alone
    // The captured step lives for this call only, also when it ends in an error (its device
    // state may then be halted, and the parameters' addresses it holds may change after it).
    struct DropGraph {
        std::unique_ptr<CapturedStep>& graph;
        ~DropGraph() { graph.reset(); }
    } drop_graph{graph_};
    graph_.reset();
    while (step_ < last && !should_stop()) {
        if (graph_) {
            if (!captured_step()) continue;  // could not capture: this step again, eagerly
            // The host meets the device where it logs, evaluates or saves, and every kWindow
            // steps (the ring's length).
            const bool meet = step_ % print_every == 0 || step_ % c.train.eval_interval == 0 ||
                              step_ % c.train.checkpoint_interval == 0 || step_ == last ||
                              graph_->pending() == CapturedStep::kWindow || should_stop();
            if (!meet) continue;
            collect_captured_steps();
        } else {
            const auto start = std::chrono::steady_clock::now();
            const double loss = train_step();
            const auto end = std::chrono::steady_clock::now();
            const double ms = std::chrono::duration<double, std::milli>(end - start).count();
            report_step(step_, loss, last_lr_, last_norm_, ms);
            if (phases_) phases_->step_done(ms);
            if (first && !packed_cudnn_attention_failure().empty())
                log_ << "attention: cuDNN refused q, k, v where the QKV projection writes them, "
                        "so it runs between permutes: " << packed_cudnn_attention_failure()
                     << "\n";
            if (first && !linear_epilogue_failure().empty())
                log_ << "linear: " << linear_epilogue_failure() << "\n";
            if (first && no_graph.empty()) {
                try {
                    graph_ = std::make_unique<CapturedStep>(
                        *model_, static_cast<AdamW&>(*opt_), cfg_, data_->sequence_length());
                } catch (const std::exception& e) {
                    log_ << "cuda_graph: no room for the captured step's buffers, steps run "
                            "eagerly: " << e.what() << "\n";
                }
                collected_at_ = std::chrono::steady_clock::now();
            }
            first = false;
        }
        if (step_ % c.train.eval_interval == 0 || step_ == c.train.steps) {
            EvalResult e = evaluate();
            bool best = e.val_loss < best_val_;
            if (best && writer()) {
                try {
                    save_safetensors((fs::path(dir_) / "best.safetensors").string(),
                                     to_list(model_->state_dict()),
                                     {{"format", "pt"}, {"step", std::to_string(step_)}});
                } catch (const std::exception& e) {
                    fail("checkpoint", "saving the best weights at step ", step_, " failed: ",
                         e.what(), "; the last good checkpoint in '", dir_, "' is kept");
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
            if (graph_) collected_at_ = std::chrono::steady_clock::now();  // not a step's time
        }
        if (step_ % c.train.checkpoint_interval == 0) {
            save_checkpoint();
            if (graph_) collected_at_ = std::chrono::steady_clock::now();
        }
        if (progress_bar_ && !losses_.empty())
            log_ << "\r" << progress_line(step_, c.train.steps, losses_.back(), ms_average_)
                 << std::flush;
    }
    if (graph_ && graph_->pending() > 0) collect_captured_steps();
    graph_.reset();  // it holds the parameters' addresses: the next run() captures anew
    if (progress_bar_) log_ << clear_bar;
    if (phases_ && phases_->steps_timed() > 0) log_ << phases_->summary(10) << "\n";
    if (group_) {
        check_replicas_identical();
        log_ << "ranks: the last step started " << exchange_->started_during_backward() << " of "
             << exchange_->bucket_count() << " gradient buckets' exchanges during its backward\n";
    }
    if (saved_step_ != step_) save_checkpoint();  // unless the loop just saved this step
    if (writer())
        write_loss_curve((fs::path(dir_) / "metrics.jsonl").string(),
                         (fs::path(dir_) / "loss_curve.svg").string(), "fusegrad: " + dir_);
    if (should_stop()) log_ << "stopped at step " << step_ << "; checkpoint saved in " << dir_ << "\n";
}

Tensor generate(GPT& model, const Tensor& prompts, std::int64_t steps, double temperature,
                std::int64_t top_k, Generator& gen, std::int64_t drawn_vocab) {
    NoGradGuard no_grad;
    bool was_training = model.training();
    model.train(false);
    const std::int64_t n = prompts.size(0), block = model.config().block_size;
    const std::int64_t row_size = model.config().vocab_size;  // logits per position
    const std::int64_t vocab =
        drawn_vocab > 0 ? std::min(drawn_vocab, row_size) : row_size;  // the ids drawn
    // Every row's whole sequence, prompt then new tokens, in a buffer of its final length: each
    // new token is written in place (no copy of the sequence a token).
    const std::int64_t first = prompts.size(1), total = first + steps;
    const std::vector<std::int32_t> prompt_ids = prompts.to_vector<std::int32_t>();
    std::vector<std::int32_t> seq(static_cast<std::size_t>(n * total));
    for (std::int64_t i = 0; i < n; ++i)
        std::copy(prompt_ids.begin() + i * first, prompt_ids.begin() + (i + 1) * first,
                  seq.begin() + i * total);
    for (std::int64_t len = first; len < total; ++len) {
        std::int64_t ctx = std::min(len, block);
        std::vector<std::int32_t> window(n * ctx);
        for (std::int64_t i = 0; i < n; ++i)
            std::copy(seq.begin() + i * total + (len - ctx), seq.begin() + i * total + len,
                      window.begin() + i * ctx);
        Tensor logits = model.forward(Tensor::from_vector(window, {n, ctx}, prompts.device()));
        std::vector<float> all = logits.to_vector<float>();
        std::vector<std::int32_t> next(n);
        for (std::int64_t i = 0; i < n; ++i) {
            const float* row = all.data() + (i * ctx + ctx - 1) * row_size;
            if (temperature <= 0.0) {
                next[i] = static_cast<std::int32_t>(std::max_element(row, row + vocab) - row);
                continue;
            }
            std::vector<std::pair<float, std::int32_t>> cand;
            for (std::int64_t v = 0; v < vocab; ++v) cand.emplace_back(row[v], static_cast<std::int32_t>(v));
            std::sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
            if (top_k > 0 && top_k < vocab) cand.resize(top_k);
            double total = 0.0;
            std::vector<double> w(cand.size());
            for (std::size_t k = 0; k < cand.size(); ++k)
                total += w[k] = std::exp((cand[k].first - cand[0].first) / temperature);
            double u = rand({1}, Device::cpu, &gen).to_vector<float>()[0] * total;
            std::size_t k = 0;
            while (k + 1 < cand.size() && u >= w[k]) u -= w[k++];
            next[i] = cand[k].second;
        }
        for (std::int64_t i = 0; i < n; ++i) seq[i * total + len] = next[i];
    }
    model.train(was_training);
    return Tensor::from_vector(seq, {n, total}, prompts.device());
}

}  // namespace fg
