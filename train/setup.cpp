// train/setup.cpp: see setup.h.
#include "setup.h"

#include <filesystem>

#include "core/allocator.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"

namespace fg {
namespace {

namespace fs = std::filesystem;

// The activations' dtype (GPTConfig::compute_dtype) and the attention's head size D.
DType compute_dtype(const Config& c) { return precision_settings(c).compute; }
std::int64_t head_dim(const Config& c) { return c.model.n_embd / c.model.n_head; }

}  // namespace

AttentionCall training_attention(const Config& c, Device device) {
    return {device, compute_dtype(c), head_dim(c), c.model.block_size, true, true};
}

Device resolve_device(DeviceChoice choice) {
    if (choice == DeviceChoice::cpu) return Device::cpu;
    if (choice == DeviceChoice::cuda) {
        cuda_backend("train.device: cuda");  // a clear error without a GPU or a CUDA build
        return Device::cuda;
    }
    return cuda_is_available() ? Device::cuda : Device::cpu;
}

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
    const MatmulOptions products{precision_settings(c).tf32, c.kernels.matmul_autotune};
    if (attention == AttentionBackend::cudnn) {
        const std::vector<Tensor*> params = model.parameters();
        const Device device = params.empty() ? Device::cpu : params.front()->device();
        const std::string why = cudnn_attention_unsupported(training_attention(c, device));
        FG_CHECK(why.empty(), "train", "kernels.attention is cudnn, but cuDNN's fused attention "
                 "cannot run this model: ", why, "; set kernels.attention to auto or fused");
    }
    model.apply([reduction, attention, products](Module& m) {
        if (auto* norm = dynamic_cast<NormBase*>(&m)) norm->set_reduction(reduction);
        if (auto* attn = dynamic_cast<CausalSelfAttention*>(&m)) attn->set_backend(attention);
        if (auto* layer = dynamic_cast<Linear*>(&m)) layer->set_matmul_options(products);
        if (auto* gpt = dynamic_cast<GPT*>(&m)) gpt->set_matmul_options(products);
    });
}

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

Config with_absolute_data_paths(Config c) {
    for (std::string* path : {&c.data.path, &c.data.val_path, &c.train.init_from})
        if (!path->empty()) *path = fs::absolute(*path).lexically_normal().string();
    return c;
}

void check_init_from(const Config& c) {
    const fs::path beside = fs::path(c.train.init_from).parent_path() / "config.yaml";
    std::error_code ec;
    if (!fs::exists(beside, ec)) return;
    std::string differ;
    for (const std::string& change : changed_keys(load_config(beside.string()), c))
        if (change.rfind("model.", 0) == 0 && change.rfind("model.dropout ", 0) != 0 &&
            change.rfind("model.vocab_size ", 0) != 0)
            differ += (differ.empty() ? "" : ", ") + change;
    FG_CHECK(differ.empty(), "train", "train.init_from '", c.train.init_from, "' is a model ",
             "whose ", beside.string(), " differs from this one: ", differ);
}

void require_data_files(const Config& c, const std::string& run_dir) {
    if (c.data.kind != DataKind::text) return;  // shards name their own missing files
    std::error_code ec;
    FG_CHECK(fs::exists(c.data.path, ec), "data", "the run's text file '", c.data.path,
             "' is not there (data.path in ", (fs::path(run_dir) / "config.yaml").string(),
             "; a relative path is read from the working directory, ",
             fs::current_path(ec).string(), "): edit data.path there to the file's path");
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

}  // namespace fg
