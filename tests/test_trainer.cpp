// tests/test_trainer.cpp: the trainer on the CPU: a resumed run continues with bitwise the same
// losses as an uninterrupted one; the run directory's files; the bad inputs (an existing run, a
// different model shape on resume, device cuda without CUDA, a missing text file); and what it
// reports and computes beside the step: loss-curve plots, the progress bar, MFU and the FLOP
// count, generation, bits per byte.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "test_helpers.h"
#include "cli/plot.h"
#include "train/progress.h"
#include "train/trainer.h"

using namespace fg;
namespace fs = std::filesystem;

namespace {

Config tiny_run(const std::string& dir, std::int64_t steps) {
    return test::tiny_addition_run(dir, steps,
                                   {"model.dropout=0.1", "train.grad_accum=2",
                                    "train.eval_interval=4", "train.eval_iters=2",
                                    "train.checkpoint_interval=3"});
}

}  // namespace

TEST_CASE("a resumed run repeats the uninterrupted losses bit for bit", "[trainer]") {
    REQUIRE(test::require_resume_repeats([](const std::string& dir) { return tiny_run(dir, 10); },
                                         "/tmp/fg_run_full", "/tmp/fg_run_split", 6) == 10);
    for (const char* f : {"config.yaml", "vocab.txt", "model.safetensors", "best.safetensors",
                          "checkpoint.json", "metrics.jsonl"})
        REQUIRE(fs::exists(fs::path("/tmp/fg_run_full") / f));
    // The picture `fusegrad train` draws at the end of a run (cli/main.cpp).
    write_loss_curves({{"", "/tmp/fg_run_full/metrics.jsonl"}}, "/tmp/fg_run_full/loss_curve.svg",
                      "one run");
    std::ifstream svg("/tmp/fg_run_full/loss_curve.svg");
    std::string text((std::istreambuf_iterator<char>(svg)), {});
    REQUIRE_THAT(text, ContainsSubstring("<svg") && ContainsSubstring("<polyline") && ContainsSubstring("validation loss"));
    // Two runs on one pair of axes: both labels in the legend, four lines.
    write_loss_curves({{"fusegrad", "/tmp/fg_run_full/metrics.jsonl"},
                       {"again", "/tmp/fg_run_full/metrics.jsonl"}},
                      "/tmp/fg_run_full/both.svg", "two runs");
    std::ifstream both_file("/tmp/fg_run_full/both.svg");
    std::string both((std::istreambuf_iterator<char>(both_file)), {});
    REQUIRE_THAT(both, ContainsSubstring("fusegrad: train loss") && ContainsSubstring("again: validation loss"));
    std::size_t lines = 0;
    for (std::size_t at = both.find("<polyline"); at != std::string::npos; at = both.find("<polyline", at + 1)) ++lines;
    REQUIRE(lines == 4);
}

TEST_CASE("plot: runs under one label share a colour and one legend entry", "[trainer]") {
    const std::string dir = "/tmp/fg_plot_groups";
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/a.jsonl") << "{\"step\": 1, \"val_loss\": 3.0}\n{\"step\": 2, \"val_loss\": 2.0}\n";
    std::ofstream(dir + "/b.jsonl") << "{\"step\": 1, \"val_loss\": 3.5}\n{\"step\": 2, \"val_loss\": 2.5}\n";
    std::ofstream(dir + "/c.jsonl") << "{\"step\": 1, \"loss\": 4.0, \"val_loss\": 3.2}\n";
    write_loss_curves({{"seeds", dir + "/a.jsonl"}, {"other", dir + "/c.jsonl"}, {"seeds", dir + "/b.jsonl"}},
                      dir + "/p.svg", "groups");
    std::ifstream in(dir + "/p.svg");
    const std::string svg((std::istreambuf_iterator<char>(in)), {});
    auto count = [&](const std::string& what) {
        std::size_t n = 0;
        for (std::size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
        return n;
    };
    CHECK(count("<polyline") == 6);                   // a train and a validation line a run
    CHECK(count("seeds: validation loss") == 1);       // one legend entry for the two runs
    CHECK(count("seeds: train loss") == 0);            // they have no training loss to name
    CHECK(count("other: train loss") == 1);
    CHECK(count("fill=\"#1f77b4\"") == 4 + 1);        // the first label's dots (two runs) and legend
    CHECK(count("fill=\"#d62728\"") == 1 + 2);        // the second label's dot and legend lines
}

TEST_CASE("trainer bad inputs: an error, and nothing half-written", "[trainer][errors]") {
    fs::remove_all("/tmp/fg_run_errors");
    std::ostringstream log;
    {
        Trainer t(tiny_run("/tmp/fg_run_errors", 3), log);
        t.run();
    }
    const auto before = test::files_under("/tmp/fg_run_errors");
    REQUIRE_THROWS_WITH(Trainer(tiny_run("/tmp/fg_run_errors", 3), log),
                        ContainsSubstring("already holds a run (checkpoint.json): resume it with --resume"));
    REQUIRE_THROWS_WITH(Trainer::resume("/tmp/fg_run_errors", {"model.n_embd=32"}, log),
                        ContainsSubstring("[resume] model.n_embd cannot change when resuming") &&
                            ContainsSubstring("(16 -> 32)"));
    CHECK(test::files_under("/tmp/fg_run_errors") == before);
    // The refusals below come before a run directory is made.
    for (const char* dir : {"/tmp/fg_run_text", "/tmp/fg_run_cuda", "/tmp/fg_run_small"})
        fs::remove_all(dir);
    REQUIRE_THROWS_WITH(Trainer::resume("/tmp/nonexistent_run", {}, log), ContainsSubstring("holds no checkpoint"));
    Config text = tiny_run("/tmp/fg_run_text", 3);
    text.data.kind = DataKind::text;
    text.data.path = "/nonexistent/input.txt";
    REQUIRE_THROWS_WITH(Trainer(text, log), ContainsSubstring("[data] cannot read '/nonexistent/input.txt'"));
    if (!cuda_is_available()) {
        Config cuda = tiny_run("/tmp/fg_run_cuda", 3);
        cuda.train.device = DeviceChoice::cuda;
        REQUIRE_THROWS_WITH(Trainer(cuda, log), ContainsSubstring("[train.device: cuda]"));
    }
    Config small = tiny_run("/tmp/fg_run_small", 3);
    small.model.block_size = 4;
    REQUIRE_THROWS_WITH(Trainer(small, log), ContainsSubstring("model.block_size (4) is shorter than one addition problem"));
    for (const char* dir : {"/tmp/fg_run_text", "/tmp/fg_run_cuda", "/tmp/fg_run_small"})
        CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("greedy generation is deterministic", "[trainer]") {
    fs::remove_all("/tmp/fg_run_gen");
    std::ostringstream log;
    Trainer t(tiny_run("/tmp/fg_run_gen", 2), log);
    Generator g1(1), g2(2);
    Tensor prompt = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3}, {1, 3});
    Tensor a = generate(t.model(), prompt, 5, 0.0, 0, g1);
    Tensor b = generate(t.model(), prompt, 5, 0.0, 0, g2);
    REQUIRE(a.shape() == Shape{1, 8});
    REQUIRE(a.to_vector<std::int32_t>() == b.to_vector<std::int32_t>());
    Tensor s1 = generate(t.model(), prompt, 5, 1.0, 3, g1);
    REQUIRE(s1.shape() == Shape{1, 8});
}

TEST_CASE("more trainer bad inputs", "[trainer][errors]") {
    std::ostringstream log;
    Config big_vocab = tiny_run("/tmp/fg_run_vocab", 2);
    big_vocab.model.vocab_size = 5;  // addition needs 12 characters
    REQUIRE_THROWS_WITH(Trainer(big_vocab, log),
                        ContainsSubstring("[train] model.vocab_size (5) is smaller than the data's vocabulary (12)"));
    fs::remove_all("/tmp/fg_run_opt");
    {
        Trainer t(tiny_run("/tmp/fg_run_opt", 2), log);
        t.run();
    }
    REQUIRE_THROWS_WITH(Trainer::resume("/tmp/fg_run_opt", {"optim.name=sgd"}, log),
                        ContainsSubstring("[resume] optim.name cannot change when resuming '/tmp/fg_run_opt': (\"adamw\" -> \"sgd\")"));
    fs::remove("/tmp/fg_run_opt/vocab.txt");
    REQUIRE_THROWS_WITH(load_run("/tmp/fg_run_opt", false, Device::cpu),
                        ContainsSubstring("[load] '/tmp/fg_run_opt' has no vocab.txt"));
    REQUIRE_THROWS_WITH(write_loss_curves({{"", "/nonexistent/metrics.jsonl"}}, "/tmp/x.svg", "t"),
                        ContainsSubstring("[plot] cannot read '/nonexistent/metrics.jsonl'"));
    REQUIRE_THROWS_WITH(write_loss_curves({{"", "/tmp/fg_run_opt/metrics.jsonl"}}, "/nonexistent/d/c.svg", "t"),
                        ContainsSubstring("[plot] cannot create a temporary file beside '/nonexistent/d/c.svg'"));
}

TEST_CASE("progress bar, MFU peak table and FLOP count", "[trainer]") {
    std::string half = progress_line(50, 100, 1.23456, 20.0, 100);
    CHECK(half.find("[===============>") == 0);  // 15 of 30 filled, then the arrow
    CHECK_THAT(half, ContainsSubstring("50/100") && ContainsSubstring("loss 1.2346") && ContainsSubstring("20.0 ms/step") &&
                         ContainsSubstring("ETA 0:01"));
    CHECK(half.size() <= 100);
    CHECK(progress_line(100, 100, 1.0, 10.0).find("[" + std::string(30, '=') + "]") == 0);
    CHECK_THAT(progress_line(0, 400000, 1.0, 10.0), ContainsSubstring("ETA 1:06:40"));
    CHECK(progress_line(5, 10, 1.0, 1.0, 20).find('[') == std::string::npos);  // too narrow: text only

    CHECK(peak_tflops("NVIDIA H200", Precision::tf32) == 494.7);
    CHECK(peak_tflops("NVIDIA H200", Precision::bf16) == 989.4);
    CHECK(peak_tflops("NVIDIA H100 80GB HBM3", Precision::fp32) == 66.9);
    CHECK(peak_tflops("NVIDIA H100 PCIe", Precision::tf32) == 378.0);
    CHECK(peak_tflops("NVIDIA H100 PCIe", Precision::bf16) == 756.0);
    CHECK(peak_tflops("Some Future GPU", Precision::bf16) == 0.0);

    // 6 per weight plus 12 L C T: the baby GPT (10.65M weights without wpe) at T = 256.
    CHECK(gpt_flops_per_token(1000, 2, 8, 4, 12) == 6.0 * 1000 + 12.0 * 2 * 8 * 4);
    // GPT-2 small (124,475,904 weights with the padded vocabulary, 1024 tokens): llm.c's count is
    // 803.5 MFLOP a token (6N + 6LCT); PaLM's, without the position embedding, 855.4.
    CHECK(gpt_flops_per_token(124475904, 12, 768, 1024, 6) == Approx(803.5e6).epsilon(1e-4));
    CHECK(gpt_flops_per_token(124475904 - 1024 * 768, 12, 768, 1024, 12) ==
          Approx(855.4e6).epsilon(1e-4));

    // A run logs its step figures to metrics.jsonl; MFU and memory only on a GPU.
    fs::remove_all("/tmp/fg_run_metrics");
    std::ostringstream log;
    Trainer t(tiny_run("/tmp/fg_run_metrics", 2), log);
    t.set_progress_bar(true);
    t.run();
    CHECK_THAT(log.str(), ContainsSubstring("\r[") && ContainsSubstring("2/2"));
    std::ifstream m("/tmp/fg_run_metrics/metrics.jsonl");
    std::string first;
    std::getline(m, first);
    CHECK_THAT(first, ContainsSubstring("\"tokens_per_s\"") && !ContainsSubstring("\"mfu\""));
}

TEST_CASE("generation draws only ids of the data's vocabulary, and plot text is escaped", "[trainer]") {
    GPTConfig c = test::small_gpt(20, 8, 1, 2, 16);  // 20 ids, of which the data has 5
    Generator init(4), gen(5);
    GPT model(c, init);
    Tensor prompt = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3}, {1, 3});
    for (double temperature : {0.0, 1.0, 50.0}) {
        std::vector<std::int32_t> ids =
            generate(model, prompt, 30, temperature, 0, gen, 5).to_vector<std::int32_t>();
        for (std::int32_t id : ids) REQUIRE(id < 5);
    }
    fs::remove_all("/tmp/fg_plot_escape");
    fs::create_directories("/tmp/fg_plot_escape");
    std::ofstream("/tmp/fg_plot_escape/m.jsonl") << "{\"step\": 1, \"loss\": 2.0}\n";
    write_loss_curves({{"a<b & \"c\"", "/tmp/fg_plot_escape/m.jsonl"}},
                      "/tmp/fg_plot_escape/p.svg", "<title> & more");
    std::ifstream svg("/tmp/fg_plot_escape/p.svg");
    std::string text((std::istreambuf_iterator<char>(svg)), {});
    CHECK_THAT(text, ContainsSubstring("&lt;title&gt; &amp; more") &&
                         ContainsSubstring("a&lt;b &amp; &quot;c&quot;: train loss"));
    for (const auto& e : fs::directory_iterator("/tmp/fg_plot_escape"))  // no temporary left
        CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
    // Lines no training step writes (a step of 1e308 or below 0, an infinite loss) are skipped,
    // so the axes stay finite: no nan or inf coordinate in the picture.
    std::ofstream("/tmp/fg_plot_escape/odd.jsonl")
        << "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 1e308, \"loss\": 1.0}\n"
        << "{\"step\": -5, \"loss\": 1.0}\n{\"step\": 2, \"loss\": 1e999}\n"
        << "{\"step\": 3, \"val_loss\": 1.5}\n";
    write_loss_curves({{"odd", "/tmp/fg_plot_escape/odd.jsonl"}}, "/tmp/fg_plot_escape/odd.svg",
                      "odd");
    std::ifstream odd("/tmp/fg_plot_escape/odd.svg");
    const std::string odd_text((std::istreambuf_iterator<char>(odd)), {});
    CHECK(odd_text.find("nan") == std::string::npos);
    CHECK(odd_text.find("inf") == std::string::npos);
}

TEST_CASE("bits per byte are the validation loss in bits over the bytes its tokens stand for",
          "[trainer]") {
    const std::string dir = "/tmp/fg_trainer_bpb";
    std::filesystem::remove_all(dir);
    std::ostringstream log;
    const Config c = test::tiny_addition_run(dir, 2);
    Trainer t(c, log);
    std::unique_ptr<Dataset> data = make_dataset(c);
    const EvalResult plain = evaluate_model(t.model(), *data, c, Device::cpu);
    CHECK(plain.val_bits_per_byte == -1.0);
    const EvalResult one = evaluate_model(t.model(), *data, c, Device::cpu, {},
                                          [](std::int32_t) { return std::int64_t{1}; });
    CHECK(one.val_loss == plain.val_loss);  // the same batches
    CHECK(one.val_bits_per_byte == Approx(one.val_loss / std::log(2.0)).epsilon(1e-12));
    // Tokens of 1 to 4 bytes (by id): bits per byte is the bits a token over their mean size,
    // counted here over the same validation batches (the evaluation's generator, seed + 3, draws
    // the training batches first) and their scored targets (addition's prompts are ignored: -1).
    const auto bytes_of = [](std::int32_t id) { return std::int64_t{1} + id % 4; };
    const EvalResult mixed = evaluate_model(t.model(), *data, c, Device::cpu, {}, bytes_of);
    Generator gen(static_cast<std::uint64_t>(c.train.seed) + 3);
    double tokens = 0.0, bytes = 0.0;
    for (Split split : {Split::train, Split::val})
        for (std::int64_t i = 0; i < c.train.eval_iters; ++i) {
            const Batch b = data->batch(split, c.train.batch_size, gen, Device::cpu);
            if (split == Split::train) continue;
            for (std::int32_t id : b.targets.to_vector<std::int32_t>())
                if (id >= 0) tokens += 1.0, bytes += static_cast<double>(bytes_of(id));
        }
    REQUIRE(tokens > 0.0);
    CHECK(bytes > tokens);  // some tokens stand for more than a byte
    CHECK(mixed.val_loss == plain.val_loss);
    CHECK(mixed.val_bits_per_byte ==
          Approx(mixed.val_loss / std::log(2.0) * tokens / bytes).epsilon(1e-12));
}
