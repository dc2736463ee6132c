// tests/test_gpt.cpp: the tiny GPT on the CPU: nanoGPT's parameter names and shapes, its
// initialisation, the loss at init, a gradient reaching every parameter, the whole model's
// gradient against float64 finite differences, the layers' and the model's argument checks, and
// the memory estimate of a training step against the measured peak (its parameters exactly).
#include <cmath>
#include <map>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "models/gpt.h"
#include "models/gpt_memory.h"
#include "test_helpers.h"

using namespace fg;

namespace {

GPTConfig tiny(bool bias, bool rmsnorm) {
    GPTConfig c = test::small_gpt(11, 8, 2, 2, 8);
    c.bias = bias;
    c.rmsnorm = rmsnorm;
    return c;
}

double stddev(const Tensor& t) {
    std::vector<double> v = t.to_vector<double>();
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / v.size());
}

}  // namespace

TEST_CASE("GPT parameters carry nanoGPT's names and layouts", "[gpt]") {
    Generator gen(1);
    GPT model(tiny(true, false), gen);
    std::map<std::string, Shape> got;
    for (auto& [name, p] : model.state_dict()) got[name] = p->shape();
    std::map<std::string, Shape> want{
        {"transformer.wte.weight", {11, 8}},
        {"transformer.wpe.weight", {8, 8}},
        {"transformer.ln_f.weight", {8}},
        {"transformer.ln_f.bias", {8}},
        {"lm_head.weight", {11, 8}},
    };
    for (int i = 0; i < 2; ++i) {
        std::string b = "transformer.h." + std::to_string(i) + ".";
        want[b + "ln_1.weight"] = {8};
        want[b + "ln_1.bias"] = {8};
        want[b + "attn.c_attn.weight"] = {24, 8};
        want[b + "attn.c_attn.bias"] = {24};
        want[b + "attn.c_proj.weight"] = {8, 8};
        want[b + "attn.c_proj.bias"] = {8};
        want[b + "ln_2.weight"] = {8};
        want[b + "ln_2.bias"] = {8};
        want[b + "mlp.c_fc.weight"] = {32, 8};
        want[b + "mlp.c_fc.bias"] = {32};
        want[b + "mlp.c_proj.weight"] = {8, 32};
        want[b + "mlp.c_proj.bias"] = {8};
    }
    REQUIRE(got == want);
    GPT no_bias(tiny(false, true), gen);
    for (auto& [name, p] : no_bias.state_dict())
        REQUIRE(name.find(".bias") == std::string::npos);
    REQUIRE(no_bias.num_parameters() == 11 * 8 + 8 * 8 + 8 + 2 * (8 + 24 * 8 + 8 * 8 + 8 + 32 * 8 + 8 * 32));
}

TEST_CASE("GPT initialisation follows nanoGPT", "[gpt]") {
    GPTConfig c = tiny(true, false);
    c.n_embd = 64;
    c.n_head = 4;
    c.vocab_size = 256;
    Generator gen(2);
    GPT model(c, gen);
    REQUIRE(stddev(model.wte.weight) == Approx(0.02).epsilon(0.05));
    REQUIRE(stddev(model.h[0]->mlp.c_fc.weight) == Approx(0.02).epsilon(0.05));
    REQUIRE(stddev(model.h[1]->mlp.c_proj.weight) == Approx(0.02 / std::sqrt(4.0)).epsilon(0.05));
    REQUIRE(stddev(model.h[0]->attn.c_proj.weight) == Approx(0.01).epsilon(0.05));
    for (float v : model.h[0]->attn.c_attn.bias.to_vector<float>()) REQUIRE(v == 0.0f);
    for (float v : model.ln_f->weight.to_vector<float>()) REQUIRE(v == 1.0f);
    // Same seed, same model.
    Generator again(2);
    GPT twin(c, again);
    REQUIRE(twin.h[1]->mlp.c_proj.weight.to_vector<float>() ==
            model.h[1]->mlp.c_proj.weight.to_vector<float>());
}

TEST_CASE("GPT forward: shapes, and a loss near log V at init", "[gpt]") {
    Generator gen(3);
    GPT model(tiny(true, false), gen);
    Tensor ids = randint({3, 8}, 11, Device::cpu, &gen);
    Tensor logits = model.forward(ids);
    REQUIRE(logits.shape() == Shape{3, 8, 11});
    double loss = model.loss(logits, randint({3, 8}, 11, Device::cpu, &gen)).item();
    REQUIRE(loss == Approx(std::log(11.0)).epsilon(0.05));
    REQUIRE_THROWS_WITH(model.forward(randint({1, 9}, 11)),
                        ContainsSubstring("[gpt] sequence length 9 is outside [1, block_size = 8]"));
    REQUIRE_THROWS_WITH(model.forward(Tensor::zeros({1, 4})), ContainsSubstring("ids must be i32"));
    GPTConfig bad = tiny(true, false);
    bad.n_head = 3;
    REQUIRE_THROWS_WITH(GPT(bad, gen), ContainsSubstring("n_embd (8) must be a positive multiple of n_head (3)"));
}

TEST_CASE("every GPT parameter receives a non-zero gradient", "[gpt]") {
    for (bool rms : {false, true}) {
        for (bool bias : {false, true}) {
            Generator gen(4);
            GPT model(tiny(bias, rms), gen);
            Tensor ids = randint({2, 8}, 11, Device::cpu, &gen);
            Tensor targets = randint({2, 8}, 11, Device::cpu, &gen);
            model.loss(model.forward(ids), targets).backward();
            for (auto& [name, p] : model.named_parameters()) {
                INFO(name << " rmsnorm " << rms << " bias " << bias);
                REQUIRE(p->grad().defined());
                double norm = 0;
                for (double g : p->grad().to_vector<double>()) norm += g * g;
                REQUIRE(norm > 0.0);
            }
        }
    }
}

TEST_CASE("the whole GPT's gradient matches finite differences in float64", "[gpt][grad]") {
    for (bool rms : {false, true}) {
        Generator gen(5);
        GPT model(tiny(true, rms), gen);
        model.to(DType::f64);
        Tensor ids = randint({2, 6}, 11, Device::cpu, &gen);
        Tensor targets = randint({2, 6}, 11, Device::cpu, &gen);
        model.loss(model.forward(ids), targets).backward();
        auto loss_at = [&] {
            NoGradGuard no_grad;
            return model.loss(model.forward(ids), targets).item();
        };
        INFO("rmsnorm " << rms);
        test::check_parameter_gradients(loss_at, model.named_parameters(), 1e-6, 1e-7, 1e-5, 5);
    }
}

TEST_CASE("layer and model arguments are checked", "[gpt][errors]") {
    Generator gen(1);
    REQUIRE_THROWS_WITH(Linear(0, 4, true, 0.02f, gen), ContainsSubstring("[linear] features must be positive, got 0 -> 4"));
    Linear lin(4, 2, true, 0.02f, gen);
    REQUIRE_THROWS_WITH(lin.forward(Tensor::zeros({3, 5})), ContainsSubstring("[linear] input's last dim is 5, the layer takes 4"));
    REQUIRE_THROWS_WITH(Embedding(0, 4, 0.02f, gen), ContainsSubstring("[embedding] table must be non-empty, got 0 x 4"));
    TransformerConfig t;
    t.n_embd = 8;
    t.n_head = 2;
    CausalSelfAttention attn(t, gen);
    REQUIRE_THROWS_WITH(attn.forward(Tensor::zeros({2, 8})), ContainsSubstring("[attention] expects (B, T, C), got (2, 8)"));
    t.dropout = 1.0;
    REQUIRE_THROWS_WITH(CausalSelfAttention(t, gen), ContainsSubstring("[transformer] dropout must be in [0, 1), got 1"));
    GPTConfig c = tiny(true, false);
    c.vocab_size = 0;
    REQUIRE_THROWS_WITH(GPT(c, gen), ContainsSubstring("[gpt] vocab_size, block_size and n_layer must be positive, got 0"));
    if (cuda_is_available()) {
        GPT model(tiny(true, false), gen);  // on the CPU
        REQUIRE_THROWS_WITH(model.forward(randint({1, 4}, 11, Device::cuda)),
                            ContainsSubstring("[gpt] ids are on cuda, the model is on cpu"));
    }
}

TEST_CASE("the memory estimate of a training step is close to the measured peak", "[gpt][memory]") {
    auto make = [](std::int64_t vocab, std::int64_t block, std::int64_t layers, std::int64_t heads,
                   std::int64_t embd, bool rmsnorm, bool bias, double dropout) {
        GPTConfig c = test::small_gpt(vocab, block, layers, heads, embd);
        c.rmsnorm = rmsnorm;
        c.bias = bias;
        c.dropout = dropout;
        return c;
    };
    const std::vector<std::tuple<const char*, GPTConfig, std::int64_t, std::int64_t>> cases{
        {"activations dominate", make(65, 64, 2, 4, 64, false, true, 0.1), 16, 64},
        {"long sequences (attention scores)", make(65, 256, 1, 4, 32, false, true, 0.0), 4, 256},
        {"large vocabulary (logits)", make(2000, 32, 1, 2, 32, true, false, 0.0), 16, 32},
        {"weights dominate", make(500, 16, 3, 4, 128, true, true, 0.0), 2, 16},
        {"shorter than block_size", make(65, 128, 2, 2, 32, false, false, 0.2), 8, 40},
    };
    for (const auto& [what, config, batch, seq_len] : cases) {
        TrainingMemory est = estimate_training_memory(config, batch, seq_len, 2);
        double peak = test::measured_step_peak(config, batch, seq_len, Device::cpu);
        INFO(what << ": estimate " << est.describe() << ", measured peak "
                  << format_bytes(static_cast<std::size_t>(peak)));
        REQUIRE(est.total() >= 0.95 * peak);
        REQUIRE(est.total() <= 1.10 * peak);
    }
    // The parameters' part is exact: the allocator's blocks of every tensor the model holds, for
    // both norms with and without biases (an RMSNorm takes a bias too when model.bias is set).
    for (bool rmsnorm : {false, true}) {
        for (bool bias : {false, true}) {
            INFO("rmsnorm " << rmsnorm << ", bias " << bias);
            const GPTConfig config = make(65, 32, 2, 2, 32, rmsnorm, bias, 0.0);
            Generator gen(1);
            GPT model(config, gen);
            double held = 0;
            for (Tensor* p : model.parameters())
                held += static_cast<double>(allocation_size(p->nbytes()));
            CHECK(estimate_training_memory(config, 4, 32, 2).parameters == held);
        }
    }
}
