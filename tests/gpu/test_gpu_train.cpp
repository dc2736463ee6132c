// tests/gpu/test_gpu_train.cpp: the training path on the GPU: the fused AdamW kernel against the
// CPU step (same operations, so the same bits), and the tiny GPT's logits, loss and every
// parameter's gradient on CUDA against the same model in float64 on the CPU; and the whole
// trainer, 20 steps on each device from the same config and seed, to the same losses (1e-4);
// the memory estimate of a step against the CUDA allocator's measured peak, in f32 and bf16;
// train.phase_times' summary, with the same losses as without it; multi-tensor AdamW with a clip
// factor, the gradient norm from misaligned gradients and its refusals, a GPU index refused, and
// NCCL over one rank.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/cuda_backend.h"
#include "scale/scale_backend.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "models/gpt_memory.h"
#include "train/optim.h"
#include "train/trainer.h"
#include "scale/scale_wing.h"
#include "../test_helpers.h"

using namespace fg;

TEST_CASE("fused AdamW on CUDA equals the CPU step bit for bit", "[gpu][train]") {
    REQUIRE(cuda_is_available());
    for (std::int64_t n : {1, 7, 4097, 1 << 20}) {
        Tensor p0 = test::random_f32({n}), g0 = test::random_f32({n});
        Tensor pc = p0.clone().set_requires_grad(true);
        Tensor pg = p0.to(Device::cuda).detach().set_requires_grad(true);
        Tensor pc2 = p0.clone().reshape({1, n}).detach().set_requires_grad(true);  // decayed
        Tensor pg2 = pc2.to(Device::cuda).detach().set_requires_grad(true);
        AdamWOptions o;
        o.weight_decay = 0.1;
        o.beta2 = 0.95;
        AdamW cpu({{"p", &pc}, {"q", &pc2}}, o), gpu({{"p", &pg}, {"q", &pg2}}, o);
        for (int t = 0; t < 3; ++t) {
            pc.set_grad(g0);
            pc2.set_grad(g0.reshape({1, n}));
            pg.set_grad(g0.to(Device::cuda));
            pg2.set_grad(g0.reshape({1, n}).to(Device::cuda));
            cpu.step(1e-3);
            gpu.step(1e-3);
        }
        REQUIRE(pg.to_vector<float>() == pc.to_vector<float>());
        REQUIRE(pg2.to_vector<float>() == pc2.to_vector<float>());
    }
}

TEST_CASE("the gradient norm reads gradients that start off a 16-byte boundary", "[gpu][train]") {
    // Views of one buffer starting 0 to 3 floats in, of lengths with every remainder mod 4: the
    // sum of squares loads four floats at a time only from aligned starts, so each must agree
    // with the float64 sum over the same values.
    REQUIRE(cuda_is_available());
    Tensor whole = test::random_f32({(1 << 16) + 11});
    Tensor on_gpu = whole.to(Device::cuda);
    for (std::int64_t start : {0, 1, 2, 3}) {
        for (std::int64_t length : {1, 7, 4096, (1 << 16) + 5, (1 << 16) + 6}) {
            INFO("start " << start << ", length " << length);
            std::vector<double> v = whole.slice(start, start + length).to_vector<double>();
            double squares = 0.0;
            for (double x : v) squares += x * x;
            GradNorm g = grad_norm_of({on_gpu.slice(start, start + length)}, 0.0);
            CHECK(std::fabs(g.norm.item() - std::sqrt(squares)) <= 1e-6 * std::sqrt(squares));
        }
    }
}

TEST_CASE("multi-tensor AdamW with a clip factor, and the gradient norm, on CUDA and the CPU",
          "[gpu][train]") {
    // 30 tensors (two launches of up to 24), of sizes 0 to 2^20 + 3, half of them decayed, some
    // without a gradient; the clip factor 1 (no clipping) and one below 1, both read on the
    // device. AdamW: the same bits on both devices. The norm: the CPU sums in float64, CUDA adds
    // fp32 partial sums in float64.
    REQUIRE(cuda_is_available());
    std::vector<Tensor> cpu_p, gpu_p;
    std::vector<Tensor> grads;
    for (int i = 0; i < 30; ++i) {
        const std::int64_t n = i == 3 ? 0 : i == 7 ? (1 << 20) + 3 : 1 + 37 * i * i;
        Tensor p0 = test::random_f32({n});
        grads.push_back(test::random_f32({n}, Device::cpu, 0.5f + 0.1f * static_cast<float>(i)));
        Tensor c = i % 2 ? p0.clone().reshape({1, n}).detach() : p0.clone();
        cpu_p.push_back(c.set_requires_grad(true));
        gpu_p.push_back(c.to(Device::cuda).detach().set_requires_grad(true));
    }
    std::vector<NamedParam> cn, gn;
    std::vector<Tensor*> cptr, gptr;
    for (int i = 0; i < 30; ++i) {
        cn.push_back({"p" + std::to_string(i), &cpu_p[i]});
        gn.push_back({"p" + std::to_string(i), &gpu_p[i]});
        cptr.push_back(&cpu_p[i]);
        gptr.push_back(&gpu_p[i]);
    }
    AdamWOptions o;
    o.weight_decay = 0.1;
    o.beta2 = 0.95;
    AdamW cpu(cn, o), gpu(gn, o);
    for (double max_norm : {0.0, 1e9, 1.0}) {
        for (int i = 0; i < 30; ++i) {
            if (i % 5 == 4) continue;  // no gradient: skipped by the norm and the step
            cpu_p[i].set_grad(grads[i].reshape(cpu_p[i].shape()));
            gpu_p[i].set_grad(grads[i].reshape(gpu_p[i].shape()).to(Device::cuda));
        }
        INFO("max_norm " << max_norm);
        GradNorm c = grad_norm(cptr, max_norm), g = grad_norm(gptr, max_norm);
        REQUIRE(g.norm.is_cuda());
        const double norm = c.norm.item();
        CHECK(std::fabs(g.norm.item() - norm) <= 1e-6 * norm);
        CHECK(std::fabs(g.coef.item() - c.coef.item()) <= 1e-6);
        if (max_norm == 1.0) CHECK(c.coef.item() < 0.01);
        else CHECK(g.coef.item() == 1.0);
        // The same factor on both devices (the CPU's, rounded to f32), so the steps can agree
        // bit for bit.
        const float coef = static_cast<float>(c.coef.item());
        cpu.step(1e-3, Tensor::full({}, coef, DType::f32, Device::cpu));
        gpu.step(1e-3, Tensor::full({}, coef, DType::f32, Device::cuda));
        for (int i = 0; i < 30; ++i) {
            INFO("tensor " << i);
            REQUIRE(gpu_p[i].to_vector<float>() == cpu_p[i].to_vector<float>());
        }
        for (auto& [name, m] : cpu.named_state()) {
            Tensor* other = nullptr;
            for (auto& [gname, gm] : gpu.named_state())
                if (gname == name) other = gm;
            REQUIRE(other != nullptr);
            REQUIRE(other->to_vector<float>() == m->to_vector<float>());
        }
    }
}

TEST_CASE("the gradient norm refuses 16-bit CUDA gradients and gradients on two devices",
          "[gpu][train][errors]") {
    REQUIRE(cuda_is_available());
    Tensor half = Tensor::zeros({4}, DType::bf16, Device::cuda).set_requires_grad(true);
    half.set_grad(Tensor::ones({4}, DType::bf16, Device::cuda));
    REQUIRE_THROWS_WITH(grad_norm({&half}, 1.0),
                        ContainsSubstring("[grad_norm] CUDA gradients must be f32, got bf16"));
    Tensor on_gpu = Tensor::zeros({4}, DType::f32, Device::cuda).set_requires_grad(true);
    Tensor on_cpu = Tensor::zeros({4}, DType::f32).set_requires_grad(true);
    on_gpu.set_grad(Tensor::ones({4}, DType::f32, Device::cuda));
    on_cpu.set_grad(Tensor::ones({4}, DType::f32));
    REQUIRE_THROWS_WITH(grad_norm({&on_gpu, &on_cpu}, 1.0),
                        ContainsSubstring(
                            "[grad_norm] the gradients are on both the CPU and CUDA"));
}

TEST_CASE("the GPT on CUDA matches the float64 CPU model", "[gpu][train]") {
    REQUIRE(cuda_is_available());
    for (bool rms : {false, true}) {
        GPTConfig c = test::small_gpt(37, 33, 2, 4, 64);
        c.rmsnorm = rms;
        Generator g1(9), g2(9);
        GPT ref(c, g1);
        GPT dev(c, g2, Device::cuda);  // same seed: the same weights, drawn on the GPU
        ref.to(DType::f64);
        Tensor ids = randint({3, 33}, 37), targets = randint({3, 33}, 37);
        Tensor ref_logits = ref.forward(ids);
        Tensor dev_logits = dev.forward(ids.to(Device::cuda));
        CHECK(test::rel_error(dev_logits.to_vector<double>(), ref_logits.to_vector<double>()) < 1e-5);
        Tensor ref_loss = ref.loss(ref_logits, targets);
        Tensor dev_loss = dev.loss(dev_logits, targets.to(Device::cuda));
        CHECK(dev_loss.item() == Approx(ref_loss.item()).epsilon(1e-5));
        ref_loss.backward();
        dev_loss.backward();
        auto rp = ref.named_parameters(), dp = dev.named_parameters();
        REQUIRE(rp.size() == dp.size());
        for (std::size_t i = 0; i < rp.size(); ++i) {
            INFO(rp[i].first << " rmsnorm " << rms);
            CHECK(test::rel_error(dp[i].second->grad().to_vector<double>(),
                                  rp[i].second->grad().to_vector<double>()) < 1e-4);
        }
    }
}

TEST_CASE("the same config and seed train to the same losses on CPU and CUDA", "[gpu][train]") {
    // 20 steps of the whole trainer (data, dropout, clipping, schedule, AdamW) on each device.
    auto losses_on = [](const std::string& device) {
        const std::string dir = "/tmp/fg_gpu_agree_" + device;
        std::filesystem::remove_all(dir);
        std::string yaml =
            "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 16, dropout: 0.1}\n"
            "data: {kind: addition, digits: 2}\n"
            "optim: {lr: 3.0e-3, warmup_steps: 5}\n"
            "train: {steps: 20, batch_size: 32, eval_interval: 1000, eval_iters: 1, "
            "checkpoint_interval: 1000, device: " + device + ", out_dir: " + dir + "}\n";
        std::ostringstream log;
        Trainer t(parse_config(yaml, "agree.yaml"), log, std::make_unique<ScaleWing>());
        t.run();
        return t.losses();
    };
    std::vector<double> cpu = losses_on("cpu"), cuda = losses_on("cuda");
    REQUIRE(cpu.size() == 20);
    REQUIRE(cuda.size() == 20);
    double worst = 0.0;
    for (std::size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::abs(cpu[i] - cuda[i]));
    INFO("first loss " << cpu[0] << ", last " << cpu.back() << " (cpu) vs " << cuda.back() << " (cuda)");
    CHECK(cpu.back() < cpu.front() - 0.3);  // it learned something
    CHECK(worst <= 1e-4);
}

TEST_CASE("the memory estimate of a step is close to the CUDA allocator's peak", "[gpu][train]") {
    REQUIRE(cuda_is_available());
    REQUIRE(available_memory(Device::cuda) > 0);
    REQUIRE(available_memory(Device::cuda) <= cuda_backend("test").device_info().total_bytes);
    auto make = [](std::int64_t vocab, std::int64_t block, std::int64_t layers, std::int64_t heads,
                   std::int64_t embd, double dropout, DType dtype) {
        GPTConfig c = test::small_gpt(vocab, block, layers, heads, embd);
        c.dropout = dropout;
        c.compute_dtype = dtype;
        return c;
    };
    for (DType dtype : {DType::f32, DType::bf16}) {
        // The baby GPT of configs/shakespeare_char.yaml; a long-sequence one; a large vocabulary.
        const std::vector<std::tuple<const char*, GPTConfig, std::int64_t, std::int64_t>> cases{
            {"baby GPT", make(65, 256, 6, 6, 384, 0.2, dtype), 64, 256},
            {"long sequences", make(65, 1024, 2, 12, 768, 0.0, dtype), 4, 1024},
            {"large vocabulary", make(50304, 128, 2, 4, 256, 0.0, dtype), 16, 128},
        };
        for (const auto& [what, config, batch, seq_len] : cases) {
            // A GPT built by hand runs cuDNN's attention where it can (AttentionBackend::automatic).
            const bool cudnn = attention_runs_cudnn(
                {Device::cuda, dtype, config.n_embd / config.n_head, seq_len},
                AttentionBackend::automatic);
            TrainingMemory est = estimate_training_memory(config, batch, seq_len, 2, cudnn);
            double peak = test::measured_step_peak(config, batch, seq_len, Device::cuda);
            INFO(what << " " << dtype_name(dtype) << ": estimate " << est.describe()
                      << ", measured peak " << format_bytes(static_cast<std::size_t>(peak)));
            WARN(what << " " << dtype_name(dtype) << (cudnn ? " (cuDNN attention)" : "")
                      << ": estimate / measured peak " << est.total() / peak);
            REQUIRE(est.total() >= 0.95 * peak);
            REQUIRE(est.total() <= 1.10 * peak);
        }
    }
}

TEST_CASE("a GPU index this process does not see is refused, naming both", "[gpu][train]") {
    REQUIRE(cuda_is_available());
    ScaleBackend& cuda = scale_backend("test");
    const int gpus = cuda.device_count();
    REQUIRE(gpus >= 1);
    CHECK_THROWS_WITH(cuda.select_device(gpus), ContainsSubstring(
                                                    "GPU " + std::to_string(gpus) +
                                                    " asked for, but this process sees " +
                                                    std::to_string(gpus)));
    cuda.select_device(0);  // the device every other test uses
}

TEST_CASE("NCCL sums over one rank, or a build without it refuses CUDA ranks saying so",
          "[gpu][train][distributed]") {
    REQUIRE(cuda_is_available());
    ScaleBackend& cuda = scale_backend("test");
    if (!cuda.nccl_unavailable().empty()) {
        ::setenv("WORLD_SIZE", "2", 1);
        ::setenv("RANK", "0", 1);
        std::ostringstream log;
        Config c = test::tiny_addition_run("/tmp/fg_gpu_two_ranks", 2, {"train.device=cuda"});
        CHECK_THROWS_WITH(Trainer(c, log, std::make_unique<ScaleWing>()), ContainsSubstring(
                                               "several CUDA ranks sum their gradients with NCCL, "
                                               "but this fusegrad was built without NCCL"));
        ::unsetenv("WORLD_SIZE");
        ::unsetenv("RANK");
        return;
    }
    // One rank: the communicator is made from a fresh id, and a sum over one rank is the
    // values themselves, in f32 and bf16.
    CHECK_FALSE(cuda.nccl_version().empty());
    void* comm = cuda.nccl_communicator(cuda.nccl_unique_id(), 1, 0);
    for (DType dt : {DType::f32, DType::bf16}) {
        Tensor x = test::random_f32({1000}).to(Device::cuda);
        if (dt == DType::bf16) x = cast(x, dt);
        const std::vector<float> before = cast(x, DType::f32).to_vector<float>();
        const kernels::ScalarType type =
            dt == DType::f32 ? kernels::ScalarType::f32 : kernels::ScalarType::bf16;
        cuda.nccl_all_reduce_sum(comm, x.raw_data(), 1000, type);
        // Reduce-scatter and all-gather over one rank copy; on the communicator's stream, after
        // what fusegrad's stream queued before them, and read after the join.
        Tensor scattered = Tensor::empty({1000}, dt, Device::cuda);
        Tensor gathered = Tensor::empty({1000}, dt, Device::cuda);
        cuda.nccl_reduce_scatter_sum(comm, x.raw_data(), scattered.raw_data(), 1000, type);
        cuda.nccl_all_gather(comm, scattered.raw_data(), gathered.raw_data(), 1000, type);
        cuda.nccl_join(comm);
        CHECK(cast(x, DType::f32).to_vector<float>() == before);
        CHECK(cast(scattered, DType::f32).to_vector<float>() == before);
        CHECK(cast(gathered, DType::f32).to_vector<float>() == before);
    }
    cuda.nccl_destroy(comm);
}

TEST_CASE("train.phase_times logs each phase's GPU time and changes no loss", "[gpu][train]") {
    // The tiny addition run on CUDA, eager, with and without the phase marks: the same losses
    // bit for bit (events change no arithmetic), and a summary line whose phases are positive
    // and add up to about the marks' span.
    auto run = [](bool phases, std::string& log_text) {
        const std::string dir = std::string("/tmp/fg_gpu_phases_") + (phases ? "on" : "off");
        std::filesystem::remove_all(dir);
        std::ostringstream log;
        Trainer t(test::tiny_addition_run(dir, 30,
                                          {"train.device=cuda", "kernels.cuda_graph=false",
                                           std::string("train.phase_times=") +
                                               (phases ? "true" : "false")}),
                  log, std::make_unique<ScaleWing>());
        t.run();
        log_text = log.str();
        return t.losses();
    };
    std::string with_log, without_log;
    const std::vector<double> with = run(true, with_log), without = run(false, without_log);
    REQUIRE(with.size() == 30);
    CHECK(with == without);
    CHECK(without_log.find("phase times") == std::string::npos);
    const std::size_t at = with_log.find("phase times (median of ");
    INFO(with_log);
    REQUIRE(at != std::string::npos);
    std::size_t steps = 0;
    double fwd_bwd = -1, exchange = -1, update = -1, span = -1, wall = -1;
    REQUIRE(std::sscanf(with_log.c_str() + at,
                        "phase times (median of %zu eager steps, GPU ms): forward + backward %lf, "
                        "gradient exchange %lf, norm + update %lf; start to end %lf of the "
                        "step's %lf ms wall",
                        &steps, &fwd_bwd, &exchange, &update, &span, &wall) == 6);
    CHECK(steps == 20);  // 30 steps, the first 10 left out
    CHECK(fwd_bwd > 0.0);
    CHECK(exchange >= 0.0);
    CHECK(update > 0.0);
    CHECK(span >= fwd_bwd);
    CHECK(wall > 0.0);
}
