// train/evaluate.cpp: see evaluate.h.
#include "evaluate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/gpt_memory.h"
#include "safetensors.h"
#include "setup.h"

namespace fg {

namespace fs = std::filesystem;

void load_tensor(Tensor& target, const Tensor& source, const std::string& name, const std::string& file,
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
        load_tensor(*p, t->to(p->dtype()), name, path, device);  // a 16-bit file: f32 weights
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

EvalResult evaluate_model(GPT& model, const Dataset& data, const Config& cfg, Device device,
                          const EvalShare& share,
                          const std::function<std::int64_t(std::int32_t)>& token_bytes) {
    NoGradGuard no_grad;
    bool was_training = model.training();
    model.train(false);
    EvalResult r;
    Generator gen(static_cast<std::uint64_t>(cfg.train.seed) + 3);  // the same batches each time
    const auto mine = [&share](std::int64_t i) { return i % share.world_size == share.rank; };
    // Train loss, val loss, held-out problems right, val tokens and their bytes.
    double totals[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (Split split : {Split::train, Split::val}) {
        double& total = totals[split == Split::train ? 0 : 1];
        for (std::int64_t i = 0; i < cfg.train.eval_iters; ++i) {
            // Every rank draws every batch (the generator moves the same way), its own it uses.
            Batch b = data.batch(split, cfg.train.batch_size, gen, mine(i) ? device : Device::cpu);
            if (!mine(i)) continue;
            total += model.loss(model.forward(b.inputs), b.targets).item();
            if (split == Split::val && token_bytes)
                for (std::int32_t id : b.targets.to_vector<std::int32_t>()) {
                    if (id < 0) continue;  // an ignored target (addition's prompt) has no loss
                    totals[3] += 1.0;
                    totals[4] += static_cast<double>(token_bytes(id));
                }
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
    if (share.sum) share.sum(totals, 5);
    r.train_loss = totals[0] / static_cast<double>(cfg.train.eval_iters);
    r.val_loss = totals[1] / static_cast<double>(cfg.train.eval_iters);
    if (totals[4] > 0) r.val_bits_per_byte = r.val_loss / std::log(2.0) * totals[3] / totals[4];
    if (add) r.accuracy = problems ? totals[2] / static_cast<double>(problems) : 0.0;
    model.train(was_training);
    return r;
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
        for (std::int64_t i = 0; i < n; ++i) {  // the window was copied: written in place
            const float* row = all.data() + (i * ctx + ctx - 1) * row_size;
            std::int32_t& next = seq[i * total + len];
            if (temperature <= 0.0) {
                next = static_cast<std::int32_t>(std::max_element(row, row + vocab) - row);
                continue;
            }
            std::vector<std::pair<float, std::int32_t>> cand;
            for (std::int64_t v = 0; v < vocab; ++v) cand.emplace_back(row[v], static_cast<std::int32_t>(v));
            std::sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
            if (top_k > 0 && top_k < vocab) cand.resize(top_k);
            double sum = 0.0;
            std::vector<double> w(cand.size());
            for (std::size_t k = 0; k < cand.size(); ++k)
                sum += w[k] = std::exp((cand[k].first - cand[0].first) / temperature);
            double u = rand({1}, Device::cpu, &gen).to_vector<float>()[0] * sum;
            std::size_t k = 0;
            while (k + 1 < cand.size() && u >= w[k]) u -= w[k++];
            next = cand[k].second;
        }
    }
    model.train(was_training);
    return Tensor::from_vector(seq, {n, total}, prompts.device());
}

}  // namespace fg
