// train/config.cpp: the schema and the strict reader (see config.h).
#include "config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace fg {
namespace {

// One key of the schema: how to read it from a YAML scalar into a Config, how to write it back
// (into a YAML emitter, so that every value reads back exactly), and what it means. read()
// returns "" on success or what was wrong.
struct Field {
    std::string section, key, doc;
    bool resumable = false;  // a resume may change it (may_resume_with)
    std::function<std::string(Config&, const YAML::Node&)> read = nullptr;
    std::function<void(YAML::Emitter&, const Config&)> write = nullptr;
};

template <typename T>
std::string type_name() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean (true or false)";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "a string";
}

template <typename T>
std::string format_value(const T& v) {
    std::ostringstream out;
    if constexpr (std::is_same_v<T, bool>) out << (v ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>) out << '"' << v << '"';
    else out << v;
    return out.str();
}

// Writes a value so that the reader gets it back exactly: doubles in their shortest form that
// round-trips (std::to_chars), strings quoted and escaped by the emitter wherever needed.
template <typename T>
void emit_value(YAML::Emitter& out, const T& v) {
    if constexpr (std::is_floating_point_v<T>) {
        char buf[64];
        auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
        std::string text(buf, end);
        // A decimal point in the mantissa (6.0e-04, 3.0), so that the file shows the type and
        // YAML 1.1 readers (PyYAML) read a float, not the string "6e-04".
        if (text.find_first_of(".n") == std::string::npos)
            text.insert(std::min(text.find('e'), text.size()), ".0");
        out << text;
    } else if constexpr (std::is_same_v<T, std::string>) {
        out << YAML::DoubleQuoted << v;
    } else {
        out << v;
    }
}

// A field of section S (a member of Config) and member M of S, with a check on the value.
template <typename S, typename T>
Field field(const char* section, const char* key, S Config::*sec, T S::*member, const char* doc,
            std::function<std::string(const T&)> check = nullptr) {
    Field f{section, key, doc};
    f.read = [=](Config& c, const YAML::Node& node) -> std::string {
        if (!node.IsScalar()) return "expected " + type_name<T>() + ", got a " +
                                     (node.IsMap() ? "map" : node.IsSequence() ? "list" : "null");
        T value{};
        try {
            value = node.as<T>();
        } catch (const YAML::Exception&) {
            return "expected " + type_name<T>() + ", got '" + node.Scalar() + "'";
        }
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            // yaml-cpp reads "2.5" as the integer 2: refuse anything that is not all digits.
            const std::string& s = node.Scalar();
            if (s.find_first_not_of("+-0123456789") != std::string::npos)
                return "expected an integer, got '" + s + "'";
        }
        if constexpr (std::is_floating_point_v<T>) {
            if (!std::isfinite(value)) return "must be a finite number, got '" + node.Scalar() + "'";
        }
        if (check) {
            std::string why = check(value);
            if (!why.empty()) return why + ", got " + format_value(value);
        }
        (c.*sec).*member = value;
        return "";
    };
    f.write = [=](YAML::Emitter& out, const Config& c) { emit_value(out, (c.*sec).*member); };
    return f;
}

// The names of a setting's choices, in the order the messages list them.
template <typename E>
using Names = std::vector<std::pair<const char*, E>>;

const Names<NormLayer> kNormNames{{"layernorm", NormLayer::layernorm}, {"rmsnorm", NormLayer::rmsnorm}};
const Names<GeluForm> kGeluNames{{"exact", GeluForm::exact}, {"tanh", GeluForm::tanh}};
const Names<DataKind> kDataNames{{"addition", DataKind::addition}, {"text", DataKind::text},
                                 {"shards", DataKind::shards},
                                 {"random_tokens", DataKind::random_tokens}};
const Names<TokenFormat> kFormatNames{{"llmc", TokenFormat::llmc},
                                      {"raw_uint16", TokenFormat::raw_uint16}};
const Names<OptimizerKind> kOptimizerNames{{"adamw", OptimizerKind::adamw},
                                           {"sgd", OptimizerKind::sgd}};
const Names<DeviceChoice> kDeviceNames{{"auto", DeviceChoice::automatic},
                                       {"cpu", DeviceChoice::cpu}, {"cuda", DeviceChoice::cuda}};
const Names<Precision> kPrecisionNames{{"fp32", Precision::fp32}, {"tf32", Precision::tf32},
                                       {"bf16", Precision::bf16}};
const Names<ExchangeDtype> kExchangeNames{{"auto", ExchangeDtype::automatic},
                                          {"f32", ExchangeDtype::f32}, {"bf16", ExchangeDtype::bf16}};
const Names<NormReduction> kReductionNames{{"auto", NormReduction::automatic},
                                           {"grid", NormReduction::grid},
                                           {"locked", NormReduction::locked}};
const Names<AttentionBackend> kAttentionNames{{"auto", AttentionBackend::automatic},
                                              {"cudnn", AttentionBackend::cudnn},
                                              {"fused", AttentionBackend::fused}};

template <typename E>
const char* name_in(const Names<E>& names, E value) {
    for (const auto& [name, v] : names)
        if (v == value) return name;
    return "?";
}

// A field of section S whose value is one of `names`, read into the enum E.
template <typename S, typename E>
Field choice(const char* section, const char* key, S Config::*sec, E S::*member, const char* doc,
             const Names<E>& names) {
    Field f{section, key, doc};
    f.read = [=, &names](Config& c, const YAML::Node& node) -> std::string {
        std::string list;
        for (const auto& [name, value] : names) {
            if (node.IsScalar() && node.Scalar() == name) {
                (c.*sec).*member = value;
                return "";
            }
            list += (list.empty() ? "" : ", ") + std::string(name);
        }
        return "must be one of " + list + ", got " +
               (node.IsScalar() ? '"' + node.Scalar() + '"'
                                : std::string(node.IsMap() ? "a map" : node.IsSequence() ? "a list" : "null"));
    };
    f.write = [=, &names](YAML::Emitter& out, const Config& c) {
        out << YAML::DoubleQuoted << name_in(names, (c.*sec).*member);
    };
    return f;
}

std::function<std::string(const std::int64_t&)> at_least(std::int64_t lo) {
    return [lo](const std::int64_t& v) {
        return v >= lo ? std::string() : "must be >= " + std::to_string(lo);
    };
}
std::function<std::string(const double&)> in_range(double lo, double hi, bool lo_open, bool hi_open) {
    return [=](const double& v) {
        bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        if (ok) return std::string();
        std::ostringstream out;
        out << "must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
        return out.str();
    };
}
std::function<std::string(const std::int64_t&)> int_in(std::int64_t lo, std::int64_t hi) {
    return [lo, hi](const std::int64_t& v) {
        return v >= lo && v <= hi ? std::string()
                                  : "must be " + std::to_string(lo) + " to " + std::to_string(hi);
    };
}
std::function<std::string(const double&)> positive() {
    return [](const double& v) { return v > 0 ? std::string() : "must be > 0"; };
}
// The same field, marked as one a resumed run may change: how long and how often, where it runs
// and in what arithmetic, and the schedule's and update's scalars. Anything else (the model, the
// data, the batch, the seed, the optimizer and its betas) would make a checkpoint mean something
// else.
Field may_resume_with(Field f) {
    f.resumable = true;
    return f;
}

const std::vector<Field>& schema() {
    using C = Config;
    static const std::vector<Field> fields{
        field("model", "n_layer", &C::model, &C::Model::n_layer, "transformer blocks", at_least(1)),
        field("model", "n_head", &C::model, &C::Model::n_head, "attention heads per block", at_least(1)),
        field("model", "n_embd", &C::model, &C::Model::n_embd, "channels (a multiple of n_head)", at_least(1)),
        field("model", "block_size", &C::model, &C::Model::block_size, "context length in tokens", at_least(1)),
        field("model", "vocab_size", &C::model, &C::Model::vocab_size, "vocabulary size; 0 takes it from the data", at_least(0)),
        choice("model", "norm", &C::model, &C::Model::norm, "layernorm or rmsnorm", kNormNames),
        choice("model", "gelu", &C::model, &C::Model::gelu, "the MLP's GELU: exact (erf, nanoGPT's) or tanh (GPT-2's approximation; on CUDA in bf16 / f16, with biases, it runs inside cuBLASLt's matmul epilogues)", kGeluNames),
        field("model", "bias", &C::model, &C::Model::bias, "biases in Linear layers and norms"),
        field("model", "dropout", &C::model, &C::Model::dropout, "dropout probability", in_range(0, 1, false, true)),
        choice("data", "kind", &C::data, &C::Data::kind, "addition (generated), text (a file), shards (token files of llm.c or nanoGPT) or random_tokens (uniform random ids, no files)", kDataNames),
        field("data", "path", &C::data, &C::Data::path, "the text file (kind text), or the training shards: a file or a glob such as data/fineweb10B/fineweb_train_*.bin (kind shards)"),
        field("data", "val_path", &C::data, &C::Data::val_path, "the validation shards, a file or a glob (kind shards)"),
        choice("data", "format", &C::data, &C::Data::format, "the shards' layout: llmc (llm.c's: a 256-int32 header, then uint16 GPT-2 or uint32 LLaMA-3 ids) or raw_uint16 (nanoGPT's train.bin / val.bin: uint16 ids, no header)", kFormatNames),
        field("data", "vocab_size", &C::data, &C::Data::vocab_size, "the tokenizer's vocabulary, for shards and random_tokens; 0: the format's (GPT-2's 50257; LLaMA-3's 128256 for llm.c's LLaMA-3 shards)", at_least(0)),
        field("data", "val_fraction", &C::data, &C::Data::val_fraction, "share held out for validation", in_range(0, 1, true, true)),
        field("data", "digits", &C::data, &C::Data::digits, "digits per operand, for kind addition", at_least(1)),
        choice("optim", "name", &C::optim, &C::Optim::name, "adamw or sgd", kOptimizerNames),
        may_resume_with(field("optim", "lr", &C::optim, &C::Optim::lr, "peak learning rate", positive())),
        may_resume_with(field("optim", "min_lr", &C::optim, &C::Optim::min_lr, "learning rate at the end of the cosine decay", in_range(0, 1e9, false, false))),
        may_resume_with(field("optim", "warmup_steps", &C::optim, &C::Optim::warmup_steps, "linear warmup steps", at_least(0))),
        may_resume_with(field("optim", "weight_decay", &C::optim, &C::Optim::weight_decay, "decoupled weight decay (matrices only)", in_range(0, 1e9, false, false))),
        field("optim", "beta1", &C::optim, &C::Optim::beta1, "AdamW beta1", in_range(0, 1, false, true)),
        field("optim", "beta2", &C::optim, &C::Optim::beta2, "AdamW beta2", in_range(0, 1, false, true)),
        may_resume_with(field("optim", "grad_clip", &C::optim, &C::Optim::grad_clip, "clip the global gradient norm to this; 0 turns clipping off", in_range(0, 1e9, false, false))),
        field("optim", "momentum", &C::optim, &C::Optim::momentum, "SGD momentum", in_range(0, 1, false, true)),
        may_resume_with(field("train", "steps", &C::train, &C::Train::steps, "optimizer steps", at_least(1))),
        field("train", "batch_size", &C::train, &C::Train::batch_size, "sequences per micro-batch", at_least(1)),
        field("train", "grad_accum", &C::train, &C::Train::grad_accum, "micro-batches per step", at_least(1)),
        may_resume_with(field("train", "eval_interval", &C::train, &C::Train::eval_interval, "steps between evaluations", at_least(1))),
        may_resume_with(field("train", "eval_iters", &C::train, &C::Train::eval_iters, "batches per evaluation", at_least(1))),
        field("train", "seed", &C::train, &C::Train::seed, "seed of every random draw", at_least(0)),
        may_resume_with(choice("train", "device", &C::train, &C::Train::device, "auto, cpu or cuda", kDeviceNames)),
        may_resume_with(field("train", "out_dir", &C::train, &C::Train::out_dir, "run directory (checkpoints, metrics, config)")),
        may_resume_with(field("train", "checkpoint_interval", &C::train, &C::Train::checkpoint_interval, "steps between checkpoints", at_least(1))),
        may_resume_with(choice("train", "precision", &C::train, &C::Train::precision, "fp32, tf32 (f32 with TF32 GPU matmuls) or bf16 (f32 master weights, bf16 activations and matmuls)", kPrecisionNames)),
        may_resume_with(field("train", "memory_check", &C::train, &C::Train::memory_check, "refuse a run whose estimated memory per step exceeds what its device has available")),
        may_resume_with(field("train", "bucket_mb", &C::train, &C::Train::bucket_mb, "with several ranks: the gradients are exchanged in buckets of at most this many MiB, each as soon as the backward has finished it", in_range(0, 1e6, true, false))),
        may_resume_with(choice("train", "exchange_dtype", &C::train, &C::Train::exchange_dtype, "with several ranks: the type the gradients' sums travel in: auto (bf16 when train.precision is bf16, else f32), f32 or bf16 (half the bytes; each bucket rounded once before it is summed)", kExchangeNames)),
        may_resume_with(field("train", "zero", &C::train, &C::Train::zero, "with several ranks: 0 (every rank holds AdamW's whole state) or 1 (ZeRO-1: each rank holds and updates 1/WORLD_SIZE of it; gradients reduce-scattered, weights all-gathered)", int_in(0, 1))),
        may_resume_with(field("train", "ranks_may_change", &C::train, &C::Train::ranks_may_change, "a resume may run on another number of ranks (WORLD_SIZE) than the run that saved the checkpoint: the same batches, split otherwise, so the sums round otherwise; the log says so")),
        field("train", "init_from", &C::train, &C::Train::init_from, "a new run starts from these weights, not the random init: a safetensors file under the model's names and of its shape (a run's model.safetensors, an imported GPT-2's; a config.yaml beside it must have this run's model.* keys, dropout aside); \"\": the random init"),
        may_resume_with(field("train", "phase_times", &C::train, &C::Train::phase_times, "on CUDA, time each step's phases on the GPU (forward + backward, gradient exchange, norm + update) and log their medians at the end of the run; the steps then run eagerly, not captured")),
        may_resume_with(choice("kernels", "norm_reduction", &C::kernels, &C::Kernels::norm_reduction, "dw/db reduction of the norm kernels: auto, grid or locked", kReductionNames)),
        may_resume_with(choice("kernels", "attention", &C::kernels, &C::Kernels::attention, "attention kernels on CUDA: auto (cuDNN's flash attention where it can run, else fused), cudnn or fused", kAttentionNames)),
        may_resume_with(field("kernels", "matmul_autotune", &C::kernels, &C::Kernels::matmul_autotune, "on CUDA, each shape of a training step's single 16-bit products runs the fastest of cuBLASLt's first eight algorithms, timed at the shape's first call, instead of the heuristic's first: faster, but another process may time another one fastest and round differently (false: the heuristic's, the same in every process; evaluation and sampling always take the heuristic's)")),
        may_resume_with(field("kernels", "cuda_graph", &C::kernels, &C::Kernels::cuda_graph, "on CUDA, capture the whole training step once as a CUDA graph and replay it (no host synchronisation inside a step); where it cannot be captured, steps run one launch at a time and the log says why")),

    };
    return fields;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diag = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            std::size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1u : 0u)});
            diag = up;
        }
    }
    return row[b.size()];
}

const std::vector<std::string> kSections{"model", "data", "optim", "train", "kernels"};

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
    const auto best = std::min_element(known.begin(), known.end(), [&](auto& a, auto& b) {
        return edit_distance(key, a) < edit_distance(key, b);
    });
    const bool near = best != known.end() && edit_distance(key, *best) <= 2;  // two edits at most
    return near ? " (did you mean '" + *best + "'?)" : "";
}

// Field f's value in c, as the YAML scalar that dump_config writes.
std::string value_text(const Field& f, const Config& c) {
    YAML::Emitter out;
    f.write(out, c);
    return out.c_str();
}

class Reader {
public:
    Reader(std::string origin) : origin_(std::move(origin)) {}

    void error(const YAML::Mark& mark, const std::string& path, const std::string& what) {
        std::ostringstream out;
        out << origin_;
        if (!mark.is_null()) out << ":" << mark.line + 1 << ":" << mark.column + 1;
        out << ": " << path << ": " << what;
        errors_.push_back(out.str());
    }

    void read_document(Config& c, const YAML::Node& root) {
        if (root.IsNull()) return;  // an empty file: all defaults
        if (!root.IsMap()) {
            error(root.Mark(), "(top)", "expected a map of sections (model, data, optim, train, kernels)");
            return;
        }
        std::set<std::string> seen;
        for (auto it = root.begin(); it != root.end(); ++it) {
            const std::string name = it->first.Scalar();
            if (std::find(kSections.begin(), kSections.end(), name) == kSections.end())
                error(it->first.Mark(), name, "unknown section" + suggestion(name, kSections));
            else if (!seen.insert(name).second)
                error(it->first.Mark(), name, "duplicate section");
            else
                read_section(c, name, it->second);
        }
    }

    void read_section(Config& c, const std::string& section, const YAML::Node& node) {
        if (node.IsNull()) return;
        if (!node.IsMap()) {
            error(node.Mark(), section, "expected a map of keys");
            return;
        }
        std::set<std::string> seen;
        for (auto it = node.begin(); it != node.end(); ++it) {
            const std::string key = it->first.Scalar();
            if (seen.insert(key).second) set(c, section, key, it->second, it->first.Mark());
            else error(it->first.Mark(), section + "." + key, "duplicate key");
        }
    }

    void set(Config& c, const std::string& section, const std::string& key, const YAML::Node& value,
             const YAML::Mark& mark) {
        std::string path = section + "." + key;
        explicitly_set_.insert(path);
        if (path == "kernels.tf32") {  // the key train.precision replaced: read as an alias
            bool on = false;
            if (!value.IsScalar() || !YAML::convert<bool>::decode(value, on))
                error(value.Mark().is_null() ? mark : value.Mark(), path,
                      "expected a boolean (true or false)");
            else
                tf32_alias_ = on ? 1 : 0;
            return;
        }
        for (const Field& f : schema()) {
            if (f.section != section || f.key != key) continue;
            std::string why = f.read(c, value);
            if (!why.empty()) error(value.Mark().is_null() ? mark : value.Mark(), path, why);
            return;
        }
        std::vector<std::string> keys;  // the section's, for the suggestion
        for (const Field& f : schema())
            if (f.section == section) keys.push_back(f.key);
        error(mark, path, "unknown key" + suggestion(key, keys));
    }

    // key.path=value from the command line.
    void apply_override(Config& c, const std::string& text) {
        auto eq = text.find('=');
        auto dot = text.find('.');
        if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
            errors_.push_back("--set " + text + ": expected key.path=value");
            return;
        }
        std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
        const std::string file_origin = std::exchange(origin_, "--set " + text);
        if (std::find(kSections.begin(), kSections.end(), section) == kSections.end()) {
            error(YAML::Mark::null_mark(), section, "unknown section" + suggestion(section, kSections));
        } else {
            try {
                set(c, section, key, YAML::Load(text.substr(eq + 1)), YAML::Mark::null_mark());
            } catch (const YAML::Exception& e) {
                error(YAML::Mark::null_mark(), section + "." + key, e.msg);
            }
        }
        origin_ = file_origin;
    }

    // kernels.tf32 (before train.precision existed): true means precision tf32, false fp32.
    // Old run directories keep resuming; a contradiction with train.precision is an error.
    void resolve_tf32_alias(Config& c) {
        if (tf32_alias_ < 0) return;
        const Precision meant = tf32_alias_ ? Precision::tf32 : Precision::fp32;
        if (explicitly_set_.count("train.precision") && c.train.precision != meant) {
            error(YAML::Mark::null_mark(), "kernels.tf32",
                  "is " + std::string(tf32_alias_ ? "true" : "false") +
                      " but train.precision is " + setting_name(c.train.precision) +
                      "; kernels.tf32 was replaced by train.precision: remove it");
            return;
        }
        c.train.precision = meant;
        c.warnings.push_back(origin_ + ": kernels.tf32 is deprecated: it was read as " +
                             "train.precision: " + setting_name(meant) + " (write that instead)");
    }

    // Checks that involve several keys.
    void cross_checks(const Config& c) {
        const YAML::Mark none = YAML::Mark::null_mark();
        if (c.model.n_embd % c.model.n_head != 0)
            error(none, "model.n_embd", "n_embd (" + std::to_string(c.model.n_embd) +
                                            ") must be a multiple of model.n_head (" +
                                            std::to_string(c.model.n_head) + ")");
        // Sizes are counted in 64-bit integers: a micro-batch of more than 2^50 tokens (no
        // machine holds one) overflows the counts of its tensors' elements and bytes.
        const double tokens =
            static_cast<double>(c.train.batch_size) * static_cast<double>(c.model.block_size + 1);
        if (tokens > 1125899906842624.0) {
            char count[32];
            std::snprintf(count, sizeof count, "%.3g", tokens);
            error(none, "train.batch_size",
                  std::string("train.batch_size x (model.block_size + 1) = ") + count +
                      " tokens a micro-batch, more than 2^50: far past any machine's memory");
        }
        if (c.train.out_dir.empty())
            error(none, "train.out_dir", "must name a directory (the run's files go there)");
        if (c.data.kind == DataKind::text && c.data.path.empty())
            error(none, "data.path", "data.kind is text, so data.path must name a text file");
        if (c.data.kind == DataKind::shards && c.data.path.empty())
            error(none, "data.path", "data.kind is shards, so data.path must name the training "
                  "shards (a file or a glob such as data/fineweb10B/fineweb_train_*.bin)");
        if (c.data.kind == DataKind::shards && c.data.val_path.empty())
            error(none, "data.val_path", "data.kind is shards, so data.val_path must name the "
                  "validation shards (a file or a glob such as data/fineweb10B/fineweb_val_*.bin)");
        if (c.optim.min_lr > c.optim.lr)
            error(none, "optim.min_lr", "min_lr must not exceed optim.lr");
    }

    void raise_if_any() const {
        if (errors_.empty()) return;
        std::string all;
        for (const std::string& e : errors_) all += (all.empty() ? "" : "\n") + e;
        throw Error(all);
    }

private:
    std::string origin_;
    std::vector<std::string> errors_;
    std::set<std::string> explicitly_set_;  // dotted keys the file or --set gave
    int tf32_alias_ = -1;                   // kernels.tf32 as read: -1 absent, 0 false, 1 true
};

}  // namespace

Config parse_config(const std::string& yaml, const std::string& origin,
                    const std::vector<std::string>& overrides) {
    Config c;
    Reader reader(origin);
    YAML::Node root;
    try {
        root = YAML::Load(yaml);
    } catch (const YAML::ParserException& e) {
        reader.error(e.mark, "(yaml)", e.msg);
        reader.raise_if_any();
    }
    reader.read_document(c, root);
    for (const std::string& o : overrides) reader.apply_override(c, o);
    reader.resolve_tf32_alias(c);
    reader.cross_checks(c);
    reader.raise_if_any();
    return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
    std::error_code ec;
    FG_CHECK(!std::filesystem::is_directory(path, ec), "config", "'", path,
             "' is a directory, not a config file");
    std::ifstream in(path);
    FG_CHECK(in.good(), "config", "cannot read '", path, "'");
    std::stringstream text;
    text << in.rdbuf();
    // A file with nothing in it is a mistake (a wrong path, a failed copy), not "all defaults".
    bool empty = true;
    try {
        empty = YAML::Load(text.str()).IsNull();
    } catch (const YAML::Exception&) {
        empty = false;  // parse_config reports the syntax error with its position
    }
    FG_CHECK(!empty, "config", "'", path, "' is empty (no keys, only blanks or comments); give a "
             "config such as configs/addition.yaml");
    return parse_config(text.str(), path, overrides);
}

std::vector<std::string> changed_keys(const Config& a, const Config& b) {
    std::vector<std::string> changed;
    for (const Field& f : schema()) {
        std::string va = value_text(f, a), vb = value_text(f, b);
        if (va != vb) changed.push_back(f.section + "." + f.key + " (" + va + " -> " + vb + ")");
    }
    return changed;
}

PrecisionSettings precision_settings(const Config& c) {
    PrecisionSettings p;
    p.compute = c.train.precision == Precision::bf16 ? DType::bf16 : DType::f32;
    p.tf32 = c.train.precision == Precision::tf32;
    p.exchange = c.train.exchange_dtype == ExchangeDtype::bf16 ? DType::bf16
                 : c.train.exchange_dtype == ExchangeDtype::f32 ? DType::f32
                                                                 : p.compute;
    return p;
}

const char* setting_name(Precision p) { return name_in(kPrecisionNames, p); }
const char* setting_name(NormLayer n) { return name_in(kNormNames, n); }
const char* setting_name(GeluForm g) { return name_in(kGeluNames, g); }

std::vector<ConfigKey> config_keys() {
    const Config defaults;
    std::vector<ConfigKey> keys;
    for (const Field& f : schema())
        keys.push_back({f.section + "." + f.key, value_text(f, defaults), f.doc, f.resumable});
    return keys;
}

std::string dump_config(const Config& c) {
    YAML::Emitter out;
    out << YAML::BeginMap;
    std::string section;
    for (const Field& f : schema()) {
        if (f.section != section) {
            if (!section.empty()) out << YAML::EndMap;
            section = f.section;
            out << YAML::Key << section << YAML::Value << YAML::BeginMap;
        }
        out << YAML::Key << f.key << YAML::Value;
        f.write(out, c);
        out << YAML::Comment(f.doc);
    }
    if (!section.empty()) out << YAML::EndMap;
    out << YAML::EndMap;
    FG_ASSERT(out.good(), "config: the YAML emitter failed: ", out.GetLastError());
    return std::string(out.c_str()) + "\n";
}

}  // namespace fg
