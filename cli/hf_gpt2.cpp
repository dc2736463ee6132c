// cli/hf_gpt2.cpp: see hf_gpt2.h.
#include "hf_gpt2.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/evaluate.h"
#include "train/safetensors.h"
#include "train/setup.h"

namespace fs = std::filesystem;

namespace fg::cli {
namespace {

// The Linear weights, which transformers keeps as Conv1D (in, out).
bool is_conv1d(const std::string& name) {
    for (const char* end : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                            ".mlp.c_proj.weight"})
        if (name.size() > std::string(end).size() &&
            name.compare(name.size() - std::string(end).size(), std::string::npos, end) == 0)
            return true;
    return false;
}

// A 2-D tensor transposed (f32, on the CPU).
Tensor transposed(const Tensor& t) {
    const std::int64_t r = t.shape()[0], c = t.shape()[1];
    const std::vector<float> v = t.to_vector<float>();
    std::vector<float> out(v.size());
    for (std::int64_t i = 0; i < r; ++i)
        for (std::int64_t j = 0; j < c; ++j) out[j * r + i] = v[i * c + j];
    return Tensor::from_vector(out, {c, r});
}

// Its first `rows` rows.
Tensor first_rows(const Tensor& t, std::int64_t rows) {
    const std::int64_t c = t.shape()[1];
    std::vector<float> v = t.to_vector<float>();
    v.resize(static_cast<std::size_t>(rows * c));
    return Tensor::from_vector(v, {rows, c});
}

// A GPT-2's tensors (wte, wpe, every layer's, ln_f) with their shapes, for a model of n_layer x
// n_embd.
std::vector<std::pair<std::string, Shape>> gpt2_shapes(std::int64_t n_layer, std::int64_t c,
                                                       std::int64_t vocab, std::int64_t block) {
    std::vector<std::pair<std::string, Shape>> out{{"transformer.wte.weight", {vocab, c}},
                                                   {"transformer.wpe.weight", {block, c}}};
    for (std::int64_t l = 0; l < n_layer; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
                 {"ln_1.weight", {c}}, {"ln_1.bias", {c}},
                 {"attn.c_attn.weight", {c, 3 * c}}, {"attn.c_attn.bias", {3 * c}},
                 {"attn.c_proj.weight", {c, c}}, {"attn.c_proj.bias", {c}},
                 {"ln_2.weight", {c}}, {"ln_2.bias", {c}},
                 {"mlp.c_fc.weight", {c, 4 * c}}, {"mlp.c_fc.bias", {4 * c}},
                 {"mlp.c_proj.weight", {4 * c, c}}, {"mlp.c_proj.bias", {c}}})
            out.emplace_back(h + name, shape);
    }
    out.emplace_back("transformer.ln_f.weight", Shape{c});
    out.emplace_back("transformer.ln_f.bias", Shape{c});
    return out;
}

std::int64_t json_int(const nlohmann::json& j, const char* key, const std::string& file) {
    FG_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<std::int64_t>() > 0,
             "import", "'", file, "' has no positive integer \"", key, "\"");
    return j[key].get<std::int64_t>();
}

}  // namespace

void export_hf_gpt2(const std::string& run_dir, bool best, const std::string& out_dir) {
    for (const char* file : {"model.safetensors", "config.json"})
        FG_CHECK(!fs::exists(fs::path(out_dir) / file), "export", "'",
                 (fs::path(out_dir) / file).string(), "' exists; export writes into a folder "
                 "without model.safetensors and config.json, and never over a file");
    LoadedModel run = load_run(run_dir, best, Device::cpu);
    const Config::Model& m = run.config.model;
    FG_CHECK(m.norm == NormLayer::layernorm, "export", "'", run_dir, "' is a model with RMSNorm; "
             "GPT-2's layout (transformers' GPT2LMHeadModel) has LayerNorm");
    const std::int64_t vocab = run.vocab.size(), c = m.n_embd;
    std::map<std::string, Tensor> ours;
    for (const auto& [name, t] : run.model->state_dict()) ours.emplace(name, *t);
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [name, shape] : gpt2_shapes(m.n_layer, c, vocab, m.block_size)) {
        auto it = ours.find(name);
        if (it == ours.end()) {  // a model without biases: transformers' GPT-2 has them, zero
            out.emplace_back(name, Tensor::zeros(shape));
            continue;
        }
        Tensor t = it->second.to(DType::f32);
        if (name == "transformer.wte.weight") t = first_rows(t, vocab);  // no padding rows
        if (is_conv1d(name)) t = transposed(t);
        FG_CHECK(t.shape() == shape, "export", "internal error: ", name, " has shape ",
                 shape_str(t.shape()), ", not ", shape_str(shape));
        out.emplace_back(name, t);
    }
    const bool gpt2_ids = run.vocab.chars().rfind("tokens: gpt2 ", 0) == 0;
    nlohmann::ordered_json config{
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"vocab_size", vocab},
        {"n_positions", m.block_size},
        {"n_embd", c},
        {"n_layer", m.n_layer},
        {"n_head", m.n_head},
        {"n_inner", nullptr},
        {"activation_function", m.gelu == GeluForm::tanh ? "gelu_new" : "gelu"},
        {"layer_norm_epsilon", 1e-5},
        {"resid_pdrop", m.dropout},
        {"embd_pdrop", m.dropout},
        {"attn_pdrop", m.dropout},
        {"initializer_range", 0.02},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", true},
        {"torch_dtype", "float32"}};
    if (gpt2_ids && vocab == 50257) config["bos_token_id"] = config["eos_token_id"] = 50256;
    fs::create_directories(out_dir);
    save_safetensors((fs::path(out_dir) / "model.safetensors").string(), out, {{"format", "pt"}});
    write_file_durably((fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
}

std::string import_hf_gpt2(const std::string& hf_dir, const std::string& run_dir) {
    const std::string config_path = (fs::path(hf_dir) / "config.json").string();
    const std::string weights_path = (fs::path(hf_dir) / "model.safetensors").string();
    std::ifstream in(config_path, std::ios::binary);
    FG_CHECK(in.good(), "import", "cannot read '", config_path, "': a transformers GPT-2 folder "
             "has config.json and model.safetensors (save_pretrained writes both)");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
        fail("import", "'", config_path, "' is not JSON: ", e.what());
    }
    FG_CHECK(j.is_object() && j.value("model_type", "") == "gpt2", "import", "'", config_path,
             "' is not a GPT-2 (model_type \"", j.is_object() ? j.value("model_type", "") : "",
             "\", not \"gpt2\")");
    const std::string act = j.value("activation_function", "gelu_new");
    FG_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu", "import", "'",
             config_path, "': activation_function \"", act, "\" is neither GPT-2's tanh GELU "
             "(gelu_new) nor the exact one (gelu)");
    FG_CHECK(std::fabs(j.value("layer_norm_epsilon", 1e-5) - 1e-5) < 1e-12, "import", "'",
             config_path, "': layer_norm_epsilon ", j.value("layer_norm_epsilon", 1e-5),
             " (fusegrad's LayerNorm uses 1e-5)");
    FG_CHECK(j.value("tie_word_embeddings", true), "import", "'", config_path,
             "': an untied head (tie_word_embeddings false); fusegrad's GPT ties it to wte");
    FG_CHECK(!j.value("scale_attn_by_inverse_layer_idx", false) &&
                 j.value("scale_attn_weights", true),
             "import", "'", config_path, "': attention scaled otherwise than 1/sqrt(head size)");
    Config cfg;
    Config::Model& m = cfg.model;
    m.n_layer = json_int(j, "n_layer", config_path);
    m.n_head = json_int(j, "n_head", config_path);
    m.n_embd = json_int(j, "n_embd", config_path);
    m.block_size = json_int(j, "n_positions", config_path);
    const std::int64_t vocab = json_int(j, "vocab_size", config_path);
    FG_CHECK(!j.contains("n_inner") || j["n_inner"].is_null() ||
                 j["n_inner"] == nlohmann::json(4 * m.n_embd),
             "import", "'", config_path, "': n_inner ", j["n_inner"].dump(),
             " (fusegrad's MLP is 4 x n_embd)");
    m.vocab_size = vocab;  // exact: no padding rows
    m.norm = NormLayer::layernorm;
    m.gelu = act == "gelu" ? GeluForm::exact : GeluForm::tanh;
    m.bias = true;
    m.dropout = 0.0;
    // Data to fill in for training or evaluating losses: GPT-2 token shards, as
    // configs/gpt2_124m.yaml reads them; sample and eval --hellaswag need none.
    cfg.data.kind = DataKind::shards;
    cfg.data.format = TokenFormat::llmc;
    cfg.data.path = "data/fineweb10B/fineweb_train_*.bin";
    cfg.data.val_path = "data/fineweb10B/fineweb_val_*.bin";
    cfg.data.vocab_size = vocab == 50257 ? 0 : vocab;
    cfg.train.out_dir = run_dir;

    SafetensorsFile file = load_safetensors(weights_path);
    const std::int64_t c = m.n_embd;
    std::vector<std::pair<std::string, Tensor>> ours;
    for (const auto& [name, shape] : gpt2_shapes(m.n_layer, c, vocab, m.block_size)) {
        const Tensor* t = file.find(name);
        if (!t) t = file.find(name.substr(std::string("transformer.").size()));  // hub's names
        FG_CHECK(t != nullptr, "import", "'", weights_path, "' has no tensor '", name,
                 "' (or '", name.substr(std::string("transformer.").size()), "')");
        FG_CHECK(t->shape() == shape, "import", "'", weights_path, "': '", name, "' has shape ",
                 shape_str(t->shape()), ", not ", shape_str(shape), " as config.json says");
        Tensor v = t->to(DType::f32);
        if (is_conv1d(name)) v = transposed(v);
        ours.emplace_back(name, v);
    }
    const Tensor embedding = ours.front().second;  // wte, the first of gpt2_shapes
    if (const Tensor* head = file.find("lm_head.weight")) {
        FG_CHECK(head->to_vector<float>() == embedding.to_vector<float>(), "import", "'",
                 weights_path, "': lm_head.weight differs from wte: an untied head");
    }
    ours.emplace_back("lm_head.weight", embedding);  // fusegrad's files hold the alias too

    // A new or empty folder, without the marker of a training run: a run started into it later
    // is refused, and so never takes these files over.
    std::error_code ec;
    FG_CHECK(!fs::exists(run_dir, ec) || (fs::is_directory(run_dir, ec) &&
                                          fs::directory_iterator(run_dir, ec) == fs::directory_iterator()),
             "import", "'", run_dir, "' exists and is not an empty folder; import makes a new run "
             "directory and never writes over a file");
    fs::create_directories(run_dir);
    // GPT-2's own vocabulary reads and writes text through GPT-2's tokenizer; any other size is
    // a model of other ids (sample and eval take ids).
    const std::string vocab_text = Vocab::tokens(vocab == 50257 ? "gpt2" : "hf", vocab).chars();
    write_file_durably((fs::path(run_dir) / "config.yaml").string(), dump_config(cfg));
    write_file_durably((fs::path(run_dir) / "vocab.txt").string(), vocab_text);
    save_safetensors((fs::path(run_dir) / "model.safetensors").string(), ours,
                     {{"format", "pt"}, {"step", "0"}, {"source", hf_dir}});
    // Read back as sample and eval will: a file that does not load is found here.
    load_run(run_dir, false, Device::cpu);
    return "imported '" + hf_dir + "' into '" + run_dir + "': GPT-2 of " + std::to_string(m.n_layer) + " layers, " +
           std::to_string(c) + " channels, " + std::to_string(vocab) + " tokens";
}

}  // namespace fg::cli
