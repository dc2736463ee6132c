// tests/gpu/test_gpu_cuda_graph.cpp: the training step captured as a CUDA graph
// (scale/cuda_graph.h) against the same steps launched eagerly. With deterministic kernels
// (kernels.norm_reduction grid, kernels.attention fused) the two give the same bits: every loss,
// gradient norm and weight, over more steps than the factor table holds, with dropout,
// micro-batches, evaluations and checkpoints between the replays, in f32 and bf16, and through a
// stop and resume. cuDNN's attention (non-deterministic in its backward) agrees to rounding. A
// NaN stops both at the same step with the same message, and a capture that fails leaves the
// generators and the optimizer as they were. A process posing as one of several ranks (what the
// others add set by the test) stops after the step its stop request reached, halts where
// another rank's kernels found bad input, and drops its capture when another rank's failed or
// a rank is lost while they agree.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "core/cuda_backend.h"
#include "core/random.h"
#include "scale/cuda_graph.h"
#include "scale/scale_backend.h"
#include "train/trainer.h"
#include "scale/scale_wing.h"
#include "../test_helpers.h"

using namespace fg;

namespace {

// A folder of this process under /tmp (two test processes at once, a sanitizer's and a plain
// one, must not share run directories).
std::string tmp_dir(const std::string& name) {
    return "/tmp/fg_" + std::to_string(static_cast<long>(::getpid())) + "_" + name;
}

// A small GPT trained `steps` steps in `dir` (removed first), with `extra` YAML lines.
std::string graph_yaml(const std::string& dir, bool graph, const std::string& precision,
                       const std::string& attention, std::int64_t steps,
                       std::int64_t eval_interval = 25, std::int64_t checkpoint_interval = 30,
                       std::int64_t grad_accum = 2, const std::string& gelu = "exact") {
    return "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, dropout: 0.1, gelu: " +
           gelu + "}\n"
           "data: {kind: random_tokens, vocab_size: 96}\n"
           "optim: {lr: 3.0e-3, warmup_steps: 5, grad_clip: 1.0, weight_decay: 0.1}\n"
           "train: {steps: " + std::to_string(steps) + ", batch_size: 8, grad_accum: " +
           std::to_string(grad_accum) + ", eval_interval: " + std::to_string(eval_interval) +
           ", eval_iters: 2, checkpoint_interval: " + std::to_string(checkpoint_interval) +
           ", device: cuda, precision: " + precision + ", out_dir: " + dir + "}\n"
           "kernels: {norm_reduction: grid, attention: " + attention + ", cuda_graph: " +
           (graph ? "true" : "false") + "}\n";
}

struct RunResult {
    std::vector<double> losses;
    std::vector<float> weights;  // every parameter, concatenated
    std::string log;
    std::vector<std::string> metrics;  // the per-step lines of metrics.jsonl, timing removed
};

std::vector<float> all_weights(GPT& model) {
    std::vector<float> out;
    for (Tensor* p : model.parameters()) {
        std::vector<float> v = p->to_vector<float>();
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

// The GPT of graph_yaml's model (without its dropout) for the tests that build one directly.
GPTConfig small_gpt() {
    GPTConfig g;
    g.vocab_size = 96;
    g.block_size = 32;
    g.n_layer = 2;
    g.n_head = 4;
    g.n_embd = 64;
    return g;
}

// metrics.jsonl's step lines up to "ms" (what follows is timing and memory).
std::vector<std::string> step_lines(const std::string& dir) {
    std::ifstream in(dir + "/metrics.jsonl");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
        const auto ms = line.find(",\"ms\"");
        if (ms != std::string::npos) out.push_back(line.substr(0, ms));
    }
    return out;
}

// The log of a run whose steps were captured: says so, and never that it fell back.
void require_captured(const std::string& log) {
    INFO(log);
    CHECK(log.find("cuda_graph: step 2 captured; the steps after it replay it") !=
          std::string::npos);
    CHECK(log.find("could not be captured") == std::string::npos);
    CHECK(log.find("no room for the captured step") == std::string::npos);
}

RunResult train(const std::string& yaml, const std::string& dir) {
    std::filesystem::remove_all(dir);
    std::ostringstream log;
    Trainer t(parse_config(yaml, "graph.yaml"), log, std::make_unique<ScaleWing>());
    t.run();
    return {t.losses(), all_weights(t.model()), log.str(), step_lines(dir)};
}

}  // namespace

TEST_CASE("a captured step gives the eager step's bits, over 70 steps in f32 and bf16",
          "[gpu][train][cuda_graph]") {
    // bf16 with the tanh GELU: the MLP's products carry the GELU in cuBLASLt's epilogues.
    REQUIRE(cuda_is_available());
    for (const auto& [precision, gelu] : {std::pair<std::string, std::string>{"fp32", "exact"},
                                          {"bf16", "exact"}, {"bf16", "tanh"}}) {
        INFO("precision " << precision << ", gelu " << gelu);
        const std::string eager_dir = tmp_dir("graph_eager"), graph_dir = tmp_dir("graph_captured");
        RunResult eager =
            train(graph_yaml(eager_dir, false, precision, "fused", 70, 25, 30, 2, gelu), eager_dir);
        RunResult graph =
            train(graph_yaml(graph_dir, true, precision, "fused", 70, 25, 30, 2, gelu), graph_dir);
        INFO(graph.log);
        CHECK(eager.log.find("launched one kernel at a time (kernels.cuda_graph is false)") !=
              std::string::npos);
        CHECK(graph.log.find("captured as one CUDA graph") != std::string::npos);
        require_captured(graph.log);
        CHECK(eager.log.find("cuda_graph: step") == std::string::npos);
        REQUIRE(eager.losses.size() == 70);
        REQUIRE(graph.losses.size() == 70);
        CHECK(eager.losses.back() < eager.losses.front());
        CHECK(graph.losses == eager.losses);
        CHECK(graph.weights == eager.weights);
        CHECK(graph.metrics == eager.metrics);  // step, loss, lr and gradient norm of every step
        REQUIRE(graph.metrics.size() == 70);
    }
}

TEST_CASE("64 captured steps queued between two reads of the ring, and the table refilled",
          "[gpu][train][cuda_graph]") {
    // eval_interval 1000: the log prints every 200 steps, so the host reads the ring only when
    // 64 steps are queued (after steps 65 and 129) and refills the factor table for steps 66
    // and 130.
    REQUIRE(cuda_is_available());
    const std::string eager_dir = tmp_dir("graph_long_eager"), graph_dir = tmp_dir("graph_long");
    auto yaml = [](const std::string& dir, bool graph) {
        return graph_yaml(dir, graph, "fp32", "fused", 150, 1000, 1000, 1);
    };
    RunResult eager = train(yaml(eager_dir, false), eager_dir);
    RunResult graph = train(yaml(graph_dir, true), graph_dir);
    require_captured(graph.log);
    REQUIRE(graph.losses.size() == 150);
    CHECK(graph.losses == eager.losses);
    CHECK(graph.weights == eager.weights);
    CHECK(graph.metrics == eager.metrics);
}

TEST_CASE("a captured run stopped and resumed continues exactly", "[gpu][train][cuda_graph]") {
    REQUIRE(cuda_is_available());
    const std::string whole_dir = tmp_dir("graph_whole"), split_dir = tmp_dir("graph_split");
    RunResult whole = train(graph_yaml(whole_dir, true, "bf16", "fused", 45), whole_dir);
    std::filesystem::remove_all(split_dir);
    std::ostringstream log;
    {
        Trainer first(parse_config(graph_yaml(split_dir, true, "bf16", "fused", 45), "g.yaml"),
                      log, std::make_unique<ScaleWing>());
        first.run(20);
        REQUIRE(first.step() == 20);
    }
    std::unique_ptr<Trainer> rest = Trainer::resume(split_dir, {}, log, std::make_unique<ScaleWing>());
    rest->run();
    require_captured(log.str());
    INFO(log.str());
    REQUIRE(rest->step() == 45);
    CHECK(all_weights(rest->model()) == whole.weights);
    CHECK(step_lines(split_dir) == whole.metrics);
}

TEST_CASE("a captured step with cuDNN's attention agrees with the eager one to rounding",
          "[gpu][train][cuda_graph][attention]") {
    REQUIRE(cuda_is_available());
    if (!cudnn_attention_unsupported({Device::cuda, DType::bf16, 16}).empty()) {
        WARN("cuDNN's attention cannot run here: not tested");
        return;
    }
    const std::string eager_dir = tmp_dir("graph_cudnn_eager"), graph_dir = tmp_dir("graph_cudnn");
    RunResult eager = train(graph_yaml(eager_dir, false, "bf16", "cudnn", 40), eager_dir);
    RunResult graph = train(graph_yaml(graph_dir, true, "bf16", "cudnn", 40), graph_dir);
    require_captured(graph.log);
    REQUIRE(graph.losses.size() == 40);
    double worst = 0.0;
    for (std::size_t i = 0; i < 40; ++i)
        worst = std::max(worst, std::abs(graph.losses[i] - eager.losses[i]));
    CHECK(worst < 2e-3);
    CHECK(graph.losses.back() < graph.losses.front());
}

TEST_CASE("a non-finite loss stops a captured run at the eager run's step, with its message",
          "[gpu][train][cuda_graph]") {
    REQUIRE(cuda_is_available());
    // A learning rate far too high: the loss overflows within a few steps. Both runs stop with
    // the same message, at the same step, with the same weights (the device skipped the update
    // of the step that overflowed, as the eager step does not make it).
    struct Stopped {
        std::string message, log;
        std::int64_t step = -1;
        std::vector<float> weights;
    };
    auto stop = [&](bool graph) {
        const std::string dir = tmp_dir("graph_nan");
        std::filesystem::remove_all(dir);
        Config c = parse_config(graph_yaml(dir, graph, "fp32", "fused", 40), "nan.yaml");
        c.optim.lr = 1e6;
        c.optim.warmup_steps = 0;
        c.optim.grad_clip = 0.0;
        std::ostringstream log;
        Trainer t(c, log, std::make_unique<ScaleWing>());
        Stopped out;
        try {
            t.run();
            out.message = "no error";
        } catch (const std::exception& e) {
            out.message = e.what();
        }
        out.step = t.step();
        out.weights = all_weights(t.model());
        out.log = log.str();
        return out;
    };
    const Stopped eager = stop(false), graph = stop(true);
    INFO("eager: " << eager.message << "\ncaptured: " << graph.message);
    CHECK(eager.message.find("stopped before updating the weights") != std::string::npos);
    CHECK(graph.message == eager.message);
    CHECK(graph.step == eager.step);
    CHECK(graph.weights == eager.weights);
    if (graph.step >= 1) require_captured(graph.log);
}

TEST_CASE("a capture that fails leaves the generators and the optimizer as they were",
          "[gpu][train][cuda_graph]") {
    REQUIRE(cuda_is_available());
    Config c = parse_config(graph_yaml(tmp_dir("graph_fail"), true, "bf16", "fused", 10),
                            "fail.yaml");
    Generator init(1);
    GPTConfig g = small_gpt();
    g.dropout = 0.1;
    g.compute_dtype = DType::bf16;
    GPT model(g, init, Device::cuda);
    std::vector<NamedParam> params;
    for (auto& [name, p] : model.named_parameters()) params.push_back({name, p});
    AdamW opt(params, AdamWOptions{});
    // Sequences longer than the model's block: its forward throws, part way through the
    // capture.
    RandomTokenData data(96, 64);
    Generator data_gen(5);
    default_generator().set_state(7, 45);  // not a multiple of 4: restored as it was
    CapturedStep step(model, opt, c, 64);
    REQUIRE_THROWS_AS(step.enqueue(data, data_gen, 0), QueuedSteps::CaptureFailed);
    REQUIRE_THROWS_WITH(step.enqueue(data, data_gen, 0), ContainsSubstring("sequence length 64"));
    CudaBackend& cuda = cuda_backend("test");
    CHECK_FALSE(cuda.capturing());
    CHECK(data_gen.seed() == 5);
    CHECK(data_gen.offset() == 0);
    CHECK(default_generator().seed() == 7);
    CHECK(default_generator().offset() == 45);
    CHECK(opt.steps() == 0);
    CHECK(step.pending() == 0);
    // The stream still works: an eager step runs.
    RandomTokenData fitting(96, 32);
    Batch b = fitting.batch(Split::train, 8, data_gen, Device::cuda);
    Tensor loss = model.loss(model.forward(b.inputs), b.targets);
    loss.backward();
    opt.step(1e-3);
    CHECK(std::isfinite(loss.item()));
}

namespace {

// One process posing as one of several ranks (CapturedRanks), with what the others would add
// set by the test: `peer_code`, the device error code another rank's kernels recorded (copied
// into the sum at each replay, from page-locked memory), this rank's stop request, and whether
// the other ranks captured their step.
class PosingRank final : public CapturedRanks {
public:
    PosingRank() : peer_code(static_cast<int*>(scale_backend("test").pinned_malloc(sizeof(int)))) {
        *peer_code = 0;
    }
    ~PosingRank() override { scale_backend("test").pinned_free(peer_code); }
    int world_size() const override { return 1; }
    void step_begin() override {}
    void before_last_backward() override {}
    Batch draw(const Dataset& data, std::int64_t rows, Generator& gen, Device device) override {
        return data.batch(Split::train, rows, gen, device);
    }
    void exchange_done(float*, std::size_t, int* codes, std::size_t) override {
        scale_backend("test").copy_pinned_to_device(codes, peer_code, sizeof(int));
    }
    void wait(void* event) override {
        if (event)
            scale_backend("test").event_synchronize(event);
        else
            cuda_backend("test").synchronize();
    }
    bool all(bool ok) override {
        if (peers_lost) throw std::runtime_error("[ranks] rank 1 is lost");
        return ok && peers_capture;
    }
    bool stop_requested() const override { return stop; }

    int* peer_code;
    bool stop = false;
    bool peers_capture = true;  // false: another rank's capture failed (all() says false)
    bool peers_lost = false;     // true: the agreement finds a rank gone (all() throws)
};

}  // namespace

// A small GPT, its AdamW and data, one eager step taken (as the trainer takes it before the
// capture: handles and plans made outside it), and a captured step for the posing rank.
struct RankRig {
    RankRig()
        : config(parse_config(graph_yaml(tmp_dir("graph_rank"), true, "fp32", "fused", 10, 25,
                                         30, 1),
                              "rank.yaml")),
          init(1), model(small_gpt(), init, Device::cuda), opt(named(model), AdamWOptions{}),
          data(96, 32), data_gen(5) {
        Batch b = data.batch(Split::train, 8, data_gen, Device::cuda);
        model.loss(model.forward(b.inputs), b.targets).backward();
        opt.step(1e-3);
        opt.zero_grad();
        step = std::make_unique<CapturedStep>(model, opt, config, 32, &rank);
    }
    static std::vector<NamedParam> named(GPT& model) {
        std::vector<NamedParam> params;
        for (auto& [name, p] : model.named_parameters()) params.push_back({name, p});
        return params;
    }
    void enqueue(std::int64_t done) { step->enqueue(data, data_gen, done); }

    Config config;
    Generator init;
    GPT model;
    AdamW opt;
    RandomTokenData data;
    Generator data_gen;
    PosingRank rank;
    std::unique_ptr<CapturedStep> step;
};

TEST_CASE("a captured rank step stops after the step its stop request reached",
          "[gpu][train][cuda_graph]") {
    REQUIRE(cuda_is_available());
    RankRig rig;
    rig.enqueue(1);  // step 2: captured, replayed
    QueuedSteps::Collected got = rig.step->collect();
    REQUIRE(got.losses.size() == 1);
    CHECK(got.halted_at == 0);
    CHECK(got.stopped_at == 0);
    CHECK(rig.opt.steps() == 2);
    // Requested before step 3: step 3 updates and is the last; step 4 changes nothing, and the
    // data generator goes back to where step 3 left it.
    const std::vector<float> w2 = all_weights(rig.model);
    rig.rank.stop = true;
    rig.enqueue(2);
    const Generator after3 = rig.data_gen;
    const std::vector<float> w3 = all_weights(rig.model);  // waits for step 3
    rig.enqueue(3);
    got = rig.step->collect();
    CHECK(got.stopped_at == 3);
    CHECK(got.losses.size() == 1);  // step 3's; step 4's replay is not reported
    CHECK(rig.opt.steps() == 3);
    CHECK(got.data_at_stop.offset() == after3.offset());
    CHECK(rig.data_gen.offset() != after3.offset());
    CHECK(w3 != w2);
    CHECK(all_weights(rig.model) == w3);
}

TEST_CASE("a captured rank step halts where another rank's kernels found bad input",
          "[gpu][train][cuda_graph]") {
    REQUIRE(cuda_is_available());
    RankRig rig;
    rig.enqueue(1);
    rig.step->collect();
    const std::vector<float> w2 = all_weights(rig.model);
    *rig.rank.peer_code = 1;  // the other rank's embedding found an id out of range in step 3
    rig.enqueue(2);
    rig.enqueue(3);
    const QueuedSteps::Collected got = rig.step->collect();
    CHECK(got.halted_at == 3);
    CHECK(rig.opt.steps() == 2);
    CHECK(all_weights(rig.model) == w2);  // neither step 3 nor step 4 updated
}

TEST_CASE("a captured rank step that another rank could not capture is undone",
          "[gpu][train][cuda_graph]") {
    // This rank's capture succeeded, another's did not: every rank steps eagerly, or none, so
    // this one drops its graph and leaves the step as it found it (the data generator, the
    // weights, the optimizer), twice in a row; once the others can, the same step is captured.
    REQUIRE(cuda_is_available());
    RankRig rig;  // one eager step taken
    rig.rank.peers_capture = false;
    const Generator data_before = rig.data_gen;
    default_generator().set_state(7, 45);  // the dropout generator: restored as it was
    const std::vector<float> w1 = all_weights(rig.model);
    REQUIRE_THROWS_AS(rig.enqueue(1), QueuedSteps::CaptureFailed);
    REQUIRE_THROWS_WITH(rig.enqueue(1),
                        ContainsSubstring("another rank could not capture its step"));
    CHECK_FALSE(cuda_backend("test").capturing());
    CHECK_FALSE(rig.step->captured());
    CHECK(rig.data_gen.offset() == data_before.offset());
    CHECK(default_generator().seed() == 7);
    CHECK(default_generator().offset() == 45);
    CHECK(rig.step->pending() == 0);
    CHECK(rig.opt.steps() == 1);
    CHECK(all_weights(rig.model) == w1);
    rig.rank.peers_capture = true;
    rig.enqueue(1);
    CHECK(rig.step->captured());
    const QueuedSteps::Collected got = rig.step->collect();
    CHECK(got.first_step == 2);
    CHECK(got.losses.size() == 1);
    CHECK(got.halted_at == 0);
    CHECK(rig.opt.steps() == 2);
    CHECK(all_weights(rig.model) != w1);
}

TEST_CASE("a rank lost while the ranks agree on the capture leaves no capture behind",
          "[gpu][train][cuda_graph]") {
    // The run's error (not CaptureFailed: there is nothing to fall back to) goes on, with the
    // capture undone: no graph, the stream out of capture, the dropout generator as it was.
    REQUIRE(cuda_is_available());
    RankRig rig;
    rig.rank.peers_lost = true;
    default_generator().set_state(7, 45);
    std::string error;
    bool capture_failed = false;
    try {
        rig.enqueue(1);
    } catch (const QueuedSteps::CaptureFailed&) {
        capture_failed = true;
    } catch (const std::exception& e) {
        error = e.what();
    }
    CHECK_FALSE(capture_failed);
    CHECK_THAT(error, ContainsSubstring("rank 1 is lost"));
    CHECK_FALSE(cuda_backend("test").capturing());
    CHECK_FALSE(rig.step->captured());
    CHECK(rig.step->pending() == 0);
    CHECK(default_generator().seed() == 7);
    CHECK(default_generator().offset() == 45);
}
