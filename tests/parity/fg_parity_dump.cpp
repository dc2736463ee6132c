// tests/parity/fg_parity_dump.cpp: the fusegrad half of the PyTorch parity test. Builds the GPT a
// fusegrad config describes, draws 3 training batches from its dataset, and writes to OUT_DIR:
//   model.safetensors   the initial weights under nanoGPT's state_dict names (what a PyTorch
//                        user would load with load_state_dict);
//   parity.safetensors   the batches (inputs.K, targets.K), the first step's logits, loss and
//                        every parameter's gradient (grad.NAME, before clipping), each step's
//                        loss and gradient norm, and every parameter after the 3 AdamW steps
//                        with clipping and the learning-rate schedule (after.NAME); the
//                        metadata holds the config values the reference needs, train.precision
//                        among them (with train.precision=bf16 the logits are stored in BF16,
//                        the loss, gradients and parameters in F32, as the model holds them).
// tests/parity/check_parity.py runs this and compares with PyTorch.
// usage: fg_parity_dump CONFIG.yaml OUT_DIR cpu|cuda [key.path=value]...
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_backend.h"
#include "core/ops.h"
#include "train/safetensors.h"
#include "train/trainer.h"

namespace {

std::string str(double v) {
    std::ostringstream out;
    out.precision(17);
    out << v;
    return out.str();
}

int dump(int argc, char** argv) {
    using namespace fg;
    if (argc < 4) {
        std::fprintf(stderr, "usage: fg_parity_dump CONFIG.yaml OUT_DIR cpu|cuda [key.path=value]...\n");
        return 2;
    }
    const std::string out_dir = argv[2], device_name_arg = argv[3];
    std::vector<std::string> overrides(argv + 4, argv + argc);
    overrides.push_back("train.device=" + device_name_arg);
    Config cfg = load_config(argv[1], overrides);
    const Device device = resolve_device(cfg.train.device);
    std::filesystem::create_directories(out_dir);

    std::unique_ptr<Dataset> data = make_dataset(cfg);
    Generator init(static_cast<std::uint64_t>(cfg.train.seed));
    GPT model(gpt_config(cfg, data->vocab().size()), init, device);
    // As the trainer does: kernels.* and TF32 (train.precision tf32 only: fp32 is judged in plain
    // fp32, and under bf16 the GEMMs take bf16 inputs) on the built model.
    configure_kernels(model, cfg);
    std::vector<std::pair<std::string, Tensor>> initial;
    for (auto& [name, p] : model.state_dict()) initial.emplace_back(name, p->to(Device::cpu));
    save_safetensors(out_dir + "/model.safetensors", initial, {{"format", "pt"}});

    std::vector<NamedParam> params;
    for (auto& [name, p] : model.named_parameters()) params.push_back({name, p});
    std::unique_ptr<Optimizer> opt = make_optimizer(cfg, params);
    Generator data_gen(static_cast<std::uint64_t>(cfg.train.seed) + 1);
    model.train(true);

    std::vector<std::pair<std::string, Tensor>> out;
    std::map<std::string, std::string> meta{
        {"vocab_size", std::to_string(model.config().vocab_size)},
        {"block_size", std::to_string(cfg.model.block_size)},
        {"n_layer", std::to_string(cfg.model.n_layer)},
        {"n_head", std::to_string(cfg.model.n_head)},
        {"n_embd", std::to_string(cfg.model.n_embd)},
        {"norm", setting_name(cfg.model.norm)},
        {"gelu", setting_name(cfg.model.gelu)},
        {"bias", cfg.model.bias ? "true" : "false"},
        {"dropout", str(cfg.model.dropout)},
        {"lr", str(cfg.optim.lr)},
        {"min_lr", str(cfg.optim.min_lr)},
        {"warmup_steps", std::to_string(cfg.optim.warmup_steps)},
        {"steps", std::to_string(cfg.train.steps)},
        {"weight_decay", str(cfg.optim.weight_decay)},
        {"beta1", str(cfg.optim.beta1)},
        {"beta2", str(cfg.optim.beta2)},
        {"grad_clip", str(cfg.optim.grad_clip)},
        {"device", device_name(device)},
        {"precision", setting_name(cfg.train.precision)},
    };
    const int kSteps = 3;
    for (int step = 0; step < kSteps; ++step) {
        Batch b = data->batch(Split::train, cfg.train.batch_size, data_gen, device);
        opt->zero_grad();
        Tensor logits = model.forward(b.inputs);
        Tensor loss = model.loss(logits, b.targets);
        loss.backward();
        out.emplace_back("inputs." + std::to_string(step), b.inputs.to(Device::cpu));
        out.emplace_back("targets." + std::to_string(step), b.targets.to(Device::cpu));
        meta["loss." + std::to_string(step)] = str(loss.item());
        if (step == 0) {
            out.emplace_back("logits", logits.detach().to(Device::cpu));
            for (const NamedParam& p : params) out.emplace_back("grad." + p.name, p.param->grad().to(Device::cpu));
        }
        double norm = clip_grad_norm(model.parameters(), cfg.optim.grad_clip);
        meta["grad_norm." + std::to_string(step)] = str(norm);
        opt->step(cosine_lr(step, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps));
    }
    for (const NamedParam& p : params) out.emplace_back("after." + p.name, p.param->to(Device::cpu));
    save_safetensors(out_dir + "/parity.safetensors", out, meta);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return dump(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
