// tests/gpu/test_gpu_low_precision.cpp: bf16 and f16 on the GPU. Every op of a GPT step against
// the float64 CPU reference (tests/low_precision.h; the measured errors are printed, in units of
// the dtype's rounding step), and the whole GPT in bf16 on CUDA against the same model in bf16
// on the CPU, which rounds at the same places. Labelled `gpu`; needs a CUDA device.
#include <cstdio>

#include "core/cuda_backend.h"
#include "../low_precision.h"

using namespace fg;

TEST_CASE("every op of a GPT step runs in bf16 and f16 on CUDA, close to float64", "[gpu]") {
    REQUIRE(cuda_is_available());
    std::printf("bf16 / f16 ops against float64 (errors in units of u = 2^-8 bf16, 2^-11 f16):\n");
    for (const test::LowPrecisionCase& c : test::low_precision_cases()) {
        test::check_low_precision(c, DType::bf16, Device::cuda, true);
        if (c.f16) test::check_low_precision(c, DType::f16, Device::cuda, true);
    }
}

TEST_CASE("the bf16 GPT on CUDA matches the bf16 GPT on the CPU", "[gpu][train]") {
    REQUIRE(cuda_is_available());
    for (bool rms : {false, true}) {
        GPTConfig c = test::small_gpt(37, 33, 2, 4, 64);
        c.rmsnorm = rms;
        c.compute_dtype = DType::bf16;
        Generator g1(9), g2(9);
        GPT cpu(c, g1);
        GPT dev(c, g2, Device::cuda);  // same seed: the same f32 weights
        // fusegrad's attention kernels, which the CPU's reference mirrors rounding for rounding
        // (the GPT with cuDNN's: tests/gpu/test_gpu_attention_cudnn.cpp).
        dev.apply([](Module& m) {
            if (auto* attn = dynamic_cast<CausalSelfAttention*>(&m))
                attn->set_backend(AttentionBackend::fused);
        });
        Tensor ids = randint({3, 33}, 37), targets = randint({3, 33}, 37);
        Tensor cpu_logits = cpu.forward(ids);
        Tensor dev_logits = dev.forward(ids.to(Device::cuda));
        REQUIRE(dev_logits.dtype() == DType::bf16);
        // Both round to bf16 at the same points; they differ in the order of fp32 sums (and so,
        // now and then, in which way a value rounds): a few units of bf16 rounding in all.
        const double u = test::rounding_unit(DType::bf16);
        double logits_err =
            test::rel_error(dev_logits.to_vector<double>(), cpu_logits.to_vector<double>());
        Tensor cpu_loss = cpu.loss(cpu_logits, targets);
        Tensor dev_loss = dev.loss(dev_logits, targets.to(Device::cuda));
        REQUIRE(dev_loss.dtype() == DType::f32);
        cpu_loss.backward();
        dev_loss.backward();
        std::printf("bf16 GPT (%s), CUDA vs CPU: logits %.3f u, loss %.2e relative\n",
                    rms ? "rmsnorm" : "layernorm", logits_err / u,
                    std::abs(dev_loss.item() - cpu_loss.item()) / cpu_loss.item());
        CHECK(logits_err <= 2 * u);
        CHECK(dev_loss.item() == Approx(cpu_loss.item()).epsilon(1e-3));
        auto cp = cpu.named_parameters(), dp = dev.named_parameters();
        REQUIRE(cp.size() == dp.size());
        for (std::size_t i = 0; i < cp.size(); ++i) {
            INFO(cp[i].first << " rmsnorm " << rms);
            REQUIRE(dp[i].second->grad().dtype() == DType::f32);  // into the f32 master weights
            double err = test::rel_error(dp[i].second->grad().to_vector<double>(),
                                         cp[i].second->grad().to_vector<double>());
            CHECK(err <= 4 * u);
        }
    }
}
