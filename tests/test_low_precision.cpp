// tests/test_low_precision.cpp: bf16 (and f16) on the CPU, where 16-bit tensors are stored in 16
// bits and computed in float: every op of a GPT step against the float64 reference
// (low_precision.h), the config's train.precision and its deprecated alias kernels.tf32, and a
// small GPT trained in bf16 beside the same run in fp32: it learns, stays close, checkpoints f32
// master weights and resumes bit for bit.
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "low_precision.h"
#include "train/config.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace fg;
namespace fs = std::filesystem;

TEST_CASE("every op of a GPT step runs in bf16 and f16 on the CPU, close to float64",
          "[low_precision]") {
    for (const test::LowPrecisionCase& c : test::low_precision_cases()) {
        test::check_low_precision(c, DType::bf16, Device::cpu);
        if (c.f16) test::check_low_precision(c, DType::f16, Device::cpu);
    }
}

TEST_CASE("16-bit ops keep their dtype, and the loss is f32", "[low_precision]") {
    Tensor x = test::random_f32({4, 8}).to(DType::bf16);
    CHECK(gelu(x).dtype() == DType::bf16);
    CHECK(matmul(x, x, false, true).dtype() == DType::bf16);
    CHECK(sum(x).dtype() == DType::bf16);
    Tensor targets = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 0}, {4});
    CHECK(cross_entropy(x, targets).dtype() == DType::f32);
    // A Linear layer's f32 weight meets bf16 input as a bf16 copy; its gradient comes back f32.
    Generator gen(3);
    Linear lin(8, 5, true, 0.02f, gen);
    Tensor y = lin.forward(x.detach().set_requires_grad(true));
    CHECK(y.dtype() == DType::bf16);
    sum(y).backward();
    CHECK(lin.weight.grad().dtype() == DType::f32);
    CHECK(lin.bias.grad().dtype() == DType::f32);
}

TEST_CASE("a GPT's compute dtype must be a floating type the kernels take", "[low_precision]") {
    GPTConfig c = test::small_gpt(11, 8, 1, 2, 16);
    c.compute_dtype = DType::f64;
    Generator gen(1);
    REQUIRE_THROWS_WITH(GPT(c, gen),
                        ContainsSubstring("[gpt] compute dtype must be f32, bf16 or f16, got f64"));
}

TEST_CASE("train.precision, and kernels.tf32 read as its alias", "[low_precision][config]") {
    CHECK(parse_config("", "empty.yaml").train.precision == Precision::fp32);
    CHECK(parse_config("train: {precision: bf16}", "x.yaml").train.precision == Precision::bf16);
    CHECK(parse_config("", "x.yaml", {"train.precision=tf32"}).train.precision == Precision::tf32);
    REQUIRE_THROWS_WITH(parse_config("train: {precision: fp16}", "x.yaml"),
                        ContainsSubstring("x.yaml:1:20: train.precision: must be one of fp32, tf32, "
                                 "bf16, got \"fp16\""));
    Config old = parse_config("kernels: {tf32: true}", "old.yaml");
    CHECK(old.train.precision == Precision::tf32);
    REQUIRE(old.warnings.size() == 1);
    CHECK_THAT(old.warnings[0], ContainsSubstring("kernels.tf32 is deprecated") &&
                                    ContainsSubstring("train.precision: tf32"));
    CHECK(parse_config("kernels: {tf32: false}", "old.yaml").train.precision == Precision::fp32);
    REQUIRE_THROWS_WITH(parse_config("kernels: {tf32: true}\ntrain: {precision: bf16}", "x.yaml"),
                        ContainsSubstring("kernels.tf32: is true but train.precision is bf16"));
    REQUIRE_THROWS_WITH(parse_config("kernels: {tf32: maybe}", "x.yaml"),
                        ContainsSubstring("kernels.tf32: expected a boolean"));
    // The resolved config no longer writes the alias.
    CHECK(dump_config(old).find("tf32:") == std::string::npos);
    CHECK_THAT(dump_config(old), ContainsSubstring("precision: \"tf32\""));
}

namespace {

Config addition_run(const std::string& dir, const std::string& precision, std::int64_t steps) {
    return test::tiny_addition_run(dir, steps,
                                   {"model.n_layer=2", "model.n_embd=32", "model.dropout=0.1",
                                    "train.batch_size=16", "train.grad_accum=2",
                                    "train.checkpoint_interval=100", "train.precision=" + precision});
}

}  // namespace

TEST_CASE("a GPT trained in bf16 on the CPU follows the fp32 run", "[low_precision][trainer]") {
    fs::remove_all("/tmp/fg_bf16_run");
    fs::remove_all("/tmp/fg_fp32_run");
    std::ostringstream log;
    Trainer low(addition_run("/tmp/fg_bf16_run", "bf16", 30), log);
    low.run();
    Trainer high(addition_run("/tmp/fg_fp32_run", "fp32", 30), log);
    high.run();
    // The same initial weights, batches and dropout masks; only the arithmetic differs. bf16
    // activations (8 significant bits) move each loss by well under 1% early on; the runs then
    // drift apart as any two orderings of rounding do, but learn alike.
    const std::vector<double>& a = low.losses();
    const std::vector<double>& b = high.losses();
    REQUIRE(a.size() == 30);
    for (std::size_t i = 0; i < 5; ++i) {
        INFO("step " << i << ": bf16 " << a[i] << ", fp32 " << b[i]);
        CHECK(std::abs(a[i] - b[i]) <= 0.01 * b[i]);
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i << ": bf16 " << a[i] << ", fp32 " << b[i]);
        CHECK(std::abs(a[i] - b[i]) <= 0.05 * b[i]);
    }
    CHECK(a.back() < a.front() - 0.5);  // it learned
    // The checkpoint holds the f32 master weights, as PyTorch loads them.
    SafetensorsFile saved = load_safetensors("/tmp/fg_bf16_run/model.safetensors");
    const Tensor* w = saved.find("transformer.h.0.attn.c_attn.weight");
    REQUIRE(w != nullptr);
    CHECK(w->dtype() == DType::f32);
}

TEST_CASE("a bf16 run resumes bit for bit", "[low_precision][trainer]") {
    test::require_resume_repeats(
        [](const std::string& dir) { return addition_run(dir, "bf16", 8); }, "/tmp/fg_bf16_full",
        "/tmp/fg_bf16_split", 5);
}
