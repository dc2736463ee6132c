// tests/test_kernel_settings.cpp: kernel settings reach the layers of a built model, not its
// constructors: Module::apply visits every module of a GPT once; a norm layer's reduction is its
// constructor's default until set; and the trainer (new runs, resumed runs, load_run) sets
// kernels.norm_reduction on every norm of the model it builds, kernels.attention on every
// attention layer (refusing cudnn where cuDNN cannot run: here, the CPU), and
// kernels.matmul_autotune with train.precision's TF32 on the products; kernels.cuda_graph's log
// line and train.phase_times on the CPU.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_backend.h"
#include "layers/norm.h"
#include "scale/cuda_graph.h"
#include "scale/scale_wing.h"
#include "test_helpers.h"

using namespace fg;
namespace fs = std::filesystem;

namespace {

// Every norm layer of a GPT, named one by one (not found by Module::apply, which is under test).
std::vector<const NormBase*> norms_of(const GPT& model) {
    std::vector<const NormBase*> out;
    for (const auto& block : model.h) {
        out.push_back(block->ln_1.get());
        out.push_back(block->ln_2.get());
    }
    out.push_back(model.ln_f.get());
    return out;
}

void require_attention(const GPT& model, AttentionBackend want) {
    REQUIRE(!model.h.empty());
    for (std::size_t i = 0; i < model.h.size(); ++i) {
        INFO("block " << i);
        CHECK(model.h[i]->attn.backend() == want);
    }
}

void require_reduction(const GPT& model, NormReduction want) {
    const std::vector<const NormBase*> norms = norms_of(model);
    REQUIRE(norms.size() == 2 * model.h.size() + 1);
    for (std::size_t i = 0; i < norms.size(); ++i) {
        INFO("norm " << i << " of " << norms.size());
        CHECK(norms[i]->reduction() == want);
    }
}

}  // namespace

TEST_CASE("Module::apply visits every module of a GPT once, the root first", "[kernel_settings]") {
    Generator gen(1);
    const std::int64_t n_layer = 3;
    GPT model(test::small_gpt(11, 8, n_layer, 2, 8), gen);
    std::vector<const Module*> visited;
    model.apply([&](Module& m) { visited.push_back(&m); });
    // The GPT, its "transformer." group, wte, wpe, ln_f, and per block: the Block, ln_1, attn,
    // attn.c_attn, attn.c_proj, ln_2, mlp, mlp.c_fc, mlp.c_proj.
    CHECK(visited.size() == static_cast<std::size_t>(5 + 9 * n_layer));
    CHECK(std::set<const Module*>(visited.begin(), visited.end()).size() == visited.size());
    REQUIRE(!visited.empty());
    CHECK(visited.front() == &model);
    std::vector<const Module*> expected{&model.wte, &model.wpe, model.ln_f.get()};
    for (const auto& block : model.h)
        for (const Module* m : std::vector<const Module*>{
                 block.get(), block->ln_1.get(), &block->attn, &block->attn.c_attn,
                 &block->attn.c_proj, block->ln_2.get(), &block->mlp, &block->mlp.c_fc,
                 &block->mlp.c_proj})
            expected.push_back(m);
    for (const Module* m : expected)
        CHECK(std::count(visited.begin(), visited.end(), m) == 1);
    // Depth first in registration order: a block's modules follow it, before the next block.
    const auto at = [&](const Module* m) {
        return std::find(visited.begin(), visited.end(), m) - visited.begin();
    };
    CHECK(at(model.h[0].get()) < at(model.h[0]->ln_1.get()));
    CHECK(at(&model.h[0]->mlp.c_proj) < at(model.h[1].get()));
}

TEST_CASE("a norm layer built by hand keeps its reduction until it is set", "[kernel_settings]") {
    NormConfig c;
    c.dim = 8;
    CHECK(RMSNorm(c).reduction() == NormReduction::automatic);
    c.reduction = NormReduction::locked;
    LayerNorm norm(c);
    CHECK(norm.reduction() == NormReduction::locked);
    norm.set_reduction(NormReduction::grid);
    CHECK(norm.reduction() == NormReduction::grid);
    CHECK(norm.config().reduction == NormReduction::grid);  // what forward() hands the op
    // A GPT built without a Config has every norm at the default.
    Generator gen(1);
    GPT model(test::small_gpt(11, 8, 2, 2, 8), gen);
    require_reduction(model, NormReduction::automatic);
}

TEST_CASE("kernels.norm_reduction reaches every norm of the trainer's model", "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings";
    std::ostringstream log;
    for (const auto& [value, want] :
         std::vector<std::pair<std::string, NormReduction>>{{"locked", NormReduction::locked},
                                                            {"grid", NormReduction::grid},
                                                            {"auto", NormReduction::automatic}}) {
        INFO("kernels.norm_reduction=" << value);
        fs::remove_all(dir);
        Trainer t(test::tiny_addition_run(dir, 2, {"model.n_layer=3", "kernels.norm_reduction=" + value}),
                  log);
        require_reduction(t.model(), want);
        // A hand-set layer is overwritten: configure_kernels sets every norm, not only defaults.
        configure_kernels(t.model(), test::tiny_addition_run(dir, 2, {"kernels.norm_reduction=locked"}));
        require_reduction(t.model(), NormReduction::locked);
    }
}

TEST_CASE("train.precision tf32 reaches every product's layer, and nothing else turns it on",
          "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_tf32";
    std::ostringstream log;
    for (const std::string precision : {"tf32", "fp32", "bf16"}) {
        INFO("train.precision=" << precision);
        fs::remove_all(dir);
        Trainer t(test::tiny_addition_run(dir, 2, {"train.precision=" + precision}), log);
        const bool want = precision == "tf32";
        CHECK(t.model().matmul_options().tf32 == want);
        int linears = 0;
        t.model().apply([&](Module& m) {
            if (auto* layer = dynamic_cast<Linear*>(&m)) {
                CHECK(layer->matmul_options().tf32 == want);
                ++linears;
            }
        });
        CHECK(linears == 4 * t.model().config().n_layer);  // c_attn, c_proj, c_fc, c_proj
    }
    // A model built by hand multiplies in plain fp32 until told otherwise.
    Generator gen(1);
    GPT plain(test::small_gpt(11, 8, 1, 2, 8), gen);
    CHECK_FALSE(plain.matmul_options().tf32);
    CHECK_FALSE(plain.h[0]->attn.c_attn.matmul_options().tf32);
}

TEST_CASE("kernels.matmul_autotune reaches every product's layer and the head, a model built by "
          "hand keeps the heuristic's algorithms", "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_autotune";
    std::ostringstream log;
    for (const bool on : {true, false}) {
        INFO("kernels.matmul_autotune=" << on);
        fs::remove_all(dir);
        std::vector<std::string> sets;
        if (!on) sets.push_back("kernels.matmul_autotune=false");
        Trainer t(test::tiny_addition_run(dir, 2, sets), log);  // on unless set: the default
        CHECK(t.model().matmul_options().autotune == on);
        int linears = 0;
        t.model().apply([&](Module& m) {
            if (auto* layer = dynamic_cast<Linear*>(&m)) {
                CHECK(layer->matmul_options().autotune == on);
                ++linears;
            }
        });
        CHECK(linears == 4 * t.model().config().n_layer);
    }
    Generator gen(1);
    GPT plain(test::small_gpt(11, 8, 1, 2, 8), gen);
    CHECK_FALSE(plain.matmul_options().autotune);
    CHECK_FALSE(plain.h[0]->mlp.c_fc.matmul_options().autotune);
}

TEST_CASE("a resume's kernels.norm_reduction reaches the modules, and load_run's too",
          "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_resume";
    fs::remove_all(dir);
    std::ostringstream log;
    {
        Trainer t(test::tiny_addition_run(dir, 4, {"model.n_layer=2", "kernels.norm_reduction=locked"}),
                  log);
        t.run(2);
        require_reduction(t.model(), NormReduction::locked);
    }
    require_reduction(*load_run(dir, false, Device::cpu).model, NormReduction::locked);
    auto resumed = Trainer::resume(dir, {"kernels.norm_reduction=grid"}, log);
    REQUIRE(resumed->step() == 2);
    require_reduction(resumed->model(), NormReduction::grid);
    resumed->run();
    // The resumed config is now the run's, and load_run (sample, eval) builds from it.
    require_reduction(*load_run(dir, false, Device::cpu).model, NormReduction::grid);
    require_reduction(*load_run(dir, true, Device::cpu).model, NormReduction::grid);
}

TEST_CASE(
    "kernels.attention reaches every attention layer, and cudnn is refused where cuDNN cannot run",
    "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_attention";
    std::ostringstream log;
    // A layer built by hand, or a GPT built without a Config: the automatic choice.
    Generator gen(1);
    GPT model(test::small_gpt(11, 8, 2, 2, 8), gen);
    require_attention(model, AttentionBackend::automatic);
    model.h[0]->attn.set_backend(AttentionBackend::fused);
    CHECK(model.h[0]->attn.backend() == AttentionBackend::fused);
    for (const auto& [value, want] : std::vector<std::pair<std::string, AttentionBackend>>{
             {"fused", AttentionBackend::fused}, {"auto", AttentionBackend::automatic}}) {
        INFO("kernels.attention=" << value);
        fs::remove_all(dir);
        Trainer t(test::tiny_addition_run(dir, 2, {"model.n_layer=3", "kernels.attention=" + value}),
                  log);
        require_attention(t.model(), want);
    }
    // cudnn on the CPU: refused when the trainer configures the model, before anything is written.
    fs::remove_all(dir);
    REQUIRE_THROWS_WITH(
        Trainer(test::tiny_addition_run(dir, 2, {"kernels.attention=cudnn"}), log),
        ContainsSubstring("[train] kernels.attention is cudnn, but cuDNN's fused attention cannot run this "
                 "model: the tensors are on the CPU") &&
            ContainsSubstring("set kernels.attention to auto or fused"));
    CHECK_FALSE(fs::exists(dir + "/config.yaml"));
    // The op itself, asked for cuDNN on CPU tensors (or, in a CPU-only build, anywhere).
    Tensor qkv = test::random_f32({3, 1, 2, 5, 8}).to(DType::bf16);
    REQUIRE_THROWS_WITH(causal_attention(qkv, 0.0, true, {AttentionBackend::cudnn}),
                        ContainsSubstring("[causal_attention] the cudnn backend cannot run this call: the "
                                 "tensors are on the CPU"));
    CHECK(cudnn_attention_unsupported({Device::cpu, DType::bf16, 64}).find("on the CPU") !=
          std::string::npos);
    if (!built_with_cuda())
        CHECK(cudnn_attention_unsupported({Device::cuda, DType::bf16, 64}) ==
              "fusegrad was built without CUDA");
    // What the op asks beyond the type (answered before the GPU is asked, so on any machine):
    // aligned data, and T >= 2 for a call that records a backward.
    CHECK(cudnn_attention_unsupported({Device::cuda, DType::bf16, 64, 16, true, false}) ==
          "qkv's data is not 16-byte aligned (a view at an odd offset)");
    CHECK(cudnn_attention_unsupported({Device::cuda, DType::bf16, 64, 1, true}) ==
          "cuDNN's backward takes sequences of T >= 2, not 1");
    CHECK(cudnn_attention_unsupported({Device::cuda, DType::f32, 64}).find("f32") !=
          std::string::npos);
    // Which backends run it: never fused; automatic only for calls that record a backward.
    const AttentionCall forward_only{Device::cuda, DType::bf16, 64, 1, false};
    CHECK_FALSE(attention_runs_cudnn(forward_only, AttentionBackend::fused));
    CHECK_FALSE(attention_runs_cudnn(forward_only, AttentionBackend::automatic));
    CHECK_FALSE(attention_runs_cudnn({Device::cpu, DType::bf16, 64}, AttentionBackend::cudnn));
    CHECK_FALSE(attention_runs_cudnn({Device::cuda, DType::bf16, 64, 1}, AttentionBackend::automatic));
    // A bad value is a config error naming the choices.
    REQUIRE_THROWS_WITH(parse_config("kernels:\n  attention: flash\n", "x.yaml"),
                        ContainsSubstring("x.yaml:2:14: kernels.attention: must be one of auto, "
                                 "cudnn, fused"));
}

TEST_CASE("a resume may change kernels.attention, and load_run reads a cudnn run on the CPU",
          "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_attention_resume";
    fs::remove_all(dir);
    std::ostringstream log;
    {
        Trainer t(test::tiny_addition_run(dir, 4, {"kernels.attention=fused"}), log);
        t.run(2);
        require_attention(t.model(), AttentionBackend::fused);
    }
    auto resumed = Trainer::resume(dir, {"kernels.attention=auto"}, log);
    require_attention(resumed->model(), AttentionBackend::automatic);
    resumed->run();
    // A run whose config says cudnn (trained on a GPU, say) is still read on the CPU: load_run
    // falls back to the automatic choice there.
    {
        std::ifstream in(dir + "/config.yaml");
        std::string text((std::istreambuf_iterator<char>(in)), {});
        const std::string from = "attention: \"auto\"";
        REQUIRE(text.find(from) != std::string::npos);
        text.replace(text.find(from), from.size(), "attention: cudnn");
        std::ofstream(dir + "/config.yaml") << text;
    }
    LoadedModel loaded = load_run(dir, false, Device::cpu);
    require_attention(*loaded.model, AttentionBackend::automatic);
}

TEST_CASE("kernels.cuda_graph: the log says how steps run, and why not captured", "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_graph";
    auto first_line_about_steps = [&](const std::vector<std::string>& overrides) {
        fs::remove_all(dir);
        std::ostringstream log;
        Trainer t(test::tiny_addition_run(dir, 2, overrides), log, std::make_unique<ScaleWing>());
        t.run();
        const std::string text = log.str();
        const auto at = text.find("\nsteps: ");
        return at == std::string::npos ? std::string("(none)")
                                       : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
    };
    CHECK(first_line_about_steps({}) ==
          "steps: launched one kernel at a time (the run is on the CPU)");
    CHECK(first_line_about_steps({"kernels.cuda_graph=false"}) ==
          "steps: launched one kernel at a time (kernels.cuda_graph is false)");
    CHECK(cuda_graph_unsupported(test::tiny_addition_run(dir, 2, {"optim.name=sgd"}),
                                 Device::cuda, SGD({}, SGDOptions{})) ==
          "optim.name sgd has no device-side update (adamw has): its steps run eagerly");
    Tensor p = Tensor::zeros({2}).set_requires_grad(true);
    AdamW adamw({{"p", &p}}, AdamWOptions{});
    CHECK(cuda_graph_unsupported(test::tiny_addition_run(dir, 2), Device::cuda, adamw).empty());
    CHECK(cuda_graph_unsupported(test::tiny_addition_run(dir, 2, {"train.phase_times=true"}),
                                 Device::cuda, adamw) ==
          "train.phase_times times the phases between eager launches");
}

TEST_CASE("train.phase_times on the CPU says it has no effect", "[kernel_settings]") {
    const std::string dir = "/tmp/fg_kernel_settings_phases";
    fs::remove_all(dir);
    std::ostringstream log;
    Trainer t(test::tiny_addition_run(dir, 2, {"train.phase_times=true"}), log,
              std::make_unique<ScaleWing>());
    t.run();
    const std::string text = log.str();
    CHECK(text.find("note: train.phase_times times GPU steps; on the CPU it has no effect\n") !=
          std::string::npos);
    CHECK(text.find("phase times (median") == std::string::npos);
}
