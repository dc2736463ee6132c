// train/config.h: the training configuration, read from a YAML file against a schema.
// Every key has a type, a default, a range check and a one-line description (the schema in
// config.cpp is the single place they are written). Reading is strict: unknown keys (with a "did
// you mean" for near misses), duplicate keys, wrong types and out-of-range values are all reported
// at once, one line each, as
//   configs/x.yaml:7:3: model.n_layerz: unknown key (did you mean 'n_layer'?)
// and thrown together as one fg::Error. `--set key.path=value` overrides are checked the same way.
// A setting with a few named choices is read into an enum (the names are the schema's): nothing
// after the reading compares a setting's text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ops.h"  // GeluForm, AttentionBackend, NormReduction

namespace fg {

enum class NormLayer { layernorm, rmsnorm };                     // model.norm
enum class DataKind { addition, text, shards, random_tokens };  // data.kind
enum class TokenFormat { llmc, raw_uint16 };                    // data.format (train/data.h)
enum class OptimizerKind { adamw, sgd };                        // optim.name
enum class DeviceChoice { automatic, cpu, cuda };               // train.device
enum class Precision { fp32, tf32, bf16 };                      // train.precision
enum class ExchangeDtype { automatic, f32, bf16 };              // train.exchange_dtype

struct Config {
    struct Model {
        std::int64_t n_layer = 2, n_head = 4, n_embd = 128, block_size = 32;
        std::int64_t vocab_size = 0;  // 0: from the data
        NormLayer norm = NormLayer::layernorm;
        GeluForm gelu = GeluForm::exact;  // exact (erf) or tanh (GPT-2's approximation)
        bool bias = true;
        double dropout = 0.0;
    } model;
    struct Data {
        DataKind kind = DataKind::addition;
        std::string path;                        // text: the file; shards: the train shards
        std::string val_path;                    // shards: the validation shards (file or glob)
        TokenFormat format = TokenFormat::llmc;  // shards: llm.c's header, or nanoGPT's raw ids
        std::int64_t vocab_size = 0;    // shards, random_tokens: the tokenizer's; 0: the format's
        double val_fraction = 0.1;
        std::int64_t digits = 2;
    } data;
    struct Optim {
        OptimizerKind name = OptimizerKind::adamw;
        double lr = 1e-3, min_lr = 1e-4;
        std::int64_t warmup_steps = 100;
        double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, grad_clip = 1.0, momentum = 0.9;
    } optim;
    struct Train {
        std::int64_t steps = 2000, batch_size = 64, grad_accum = 1;
        std::int64_t eval_interval = 250, eval_iters = 20, seed = 1337;
        DeviceChoice device = DeviceChoice::automatic;
        std::string out_dir = "runs/default";
        std::int64_t checkpoint_interval = 500;
        // fp32: f32 everywhere. tf32: f32, GPU matmuls on TF32 tensor cores. bf16: mixed
        // precision (f32 master weights and AdamW moments, bf16 activations and GEMMs).
        Precision precision = Precision::fp32;
        // Refuse, before allocating anything, a run whose estimated memory per step (models/
        // gpt_memory.h) exceeds what the device has available.
        bool memory_check = true;
        // Several ranks (the wing for scale, train/wing.h): 0, every rank keeps AdamW's whole
        // state; 1, ZeRO-1: each keeps and updates its 1/WORLD_SIZE slice of it.
        std::int64_t zero = 0;
        double bucket_mb = 25.0;  // several ranks: the most MiB of gradients exchanged at once
        // Several ranks: the gradients' sums travel as f32 or bf16; auto: bf16 when precision
        // is bf16, else f32.
        ExchangeDtype exchange_dtype = ExchangeDtype::automatic;
        // Time each eager step's phases on the GPU and log their medians at the end of a run
        // (train/wing.h's StepMark); the steps then run eagerly.
        bool phase_times = false;
        // A resume may run on another number of ranks than the run that saved the checkpoint.
        bool ranks_may_change = false;
        // A new run starts from these weights (a safetensors file of the model's names, as a
        // run's model.safetensors), not from the random init; "": the random init.
        std::string init_from;
    } train;
    struct Kernels {
        NormReduction norm_reduction = NormReduction::automatic;
        AttentionBackend attention = AttentionBackend::automatic;
        bool cuda_graph = true;  // capture the training step as a CUDA graph (train/wing.h)
        bool matmul_autotune = true;  // 16-bit products: cuBLASLt's fastest (core/ops.h)
    } kernels;
    // Notes for the user that are not errors (a deprecated key was read); the caller prints them.
    std::vector<std::string> warnings;
};

// Reads `path` over the defaults, then applies `overrides` ("key.path=value"). Throws fg::Error
// listing every problem found.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text (`origin` names it in messages).
Config parse_config(const std::string& yaml, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
// The resolved configuration as YAML, every key with its one-line description as a comment.
// Every value reads back exactly (written with yaml-cpp's emitter; doubles in shortest
// round-trip form).
std::string dump_config(const Config& config);
// train.precision and train.exchange_dtype as what they decide.
struct PrecisionSettings {
    DType compute = DType::f32;   // activations and GEMMs (master weights and moments stay f32)
    bool tf32 = false;            // f32 GEMMs on TF32 tensor cores
    DType exchange = DType::f32;  // several ranks: the type the gradients' sums travel in
};
PrecisionSettings precision_settings(const Config& c);
// A setting's name as the config writes it ("bf16", "rmsnorm", "tanh", ...).
const char* setting_name(Precision p);
const char* setting_name(NormLayer n);
const char* setting_name(GeluForm g);

// One key of the schema: its dotted name, default (as YAML writes it), meaning, and whether a
// resumed run may change it (how long and how often, where and in what arithmetic it runs, the
// kernels, the ranks' settings, and the schedule's and update's scalars: lr, min_lr, warmup_steps,
// weight_decay, grad_clip; not the model, the data, the batch, the seed, or the optimizer's kind,
// betas and momentum).
struct ConfigKey {
    std::string key, default_value, description;
    bool resumable = false;
};
std::vector<ConfigKey> config_keys();
// The dotted keys whose values differ between a and b, in schema order, as
// "model.n_embd (32 -> 64)".
std::vector<std::string> changed_keys(const Config& a, const Config& b);

}  // namespace fg
