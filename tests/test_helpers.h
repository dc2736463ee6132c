// tests/test_helpers.h: what the op tests share.
//   random_f64 / random_f32:  fresh normal inputs from a per-test generator (never zeros)
//   check_gradients:          float64 central finite differences against autograd
//   max_abs_diff / rel_error: comparisons of results as double vectors
//   small_gpt:                a GPTConfig of a given size (the rest left at its defaults)
//   files_under:              every file under a folder with its bytes (a before / after check)
//   tiny_addition_run:        a Config that trains a tiny GPT on one-digit addition on the CPU
//   require_resume_repeats:   a run stopped and resumed repeats the uninterrupted losses exactly
//   measured_step_peak:       the allocator's peak over building a GPT and two AdamW steps
//   check_loss_in_place:      the logits' gradient reuses the logits' memory when only the loss
//                             holds them, with the same gradients as when they are held
// Every test binary turns on poisoning of new tensors (NaN bytes), so an element an op forgot to
// write shows up as NaN, and starts each test case from the generators' initial states
// (test_setup.cpp).
#pragma once

#include "catch.h"
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "models/gpt.h"
#include "train/config.h"
#include "train/optim.h"
#include "train/trainer.h"
#include "scale/scale_wing.h"

namespace fg::test {

// Every file under dir (recursively) with its bytes: what a refused command must leave as it was.
inline std::map<std::string, std::string> files_under(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        if (!e.is_regular_file()) continue;
        std::ifstream in(e.path(), std::ios::binary);
        files[e.path().string()] = std::string((std::istreambuf_iterator<char>(in)), {});
    }
    return files;
}

inline GPTConfig small_gpt(std::int64_t vocab, std::int64_t block, std::int64_t n_layer,
                           std::int64_t n_head, std::int64_t n_embd) {
    GPTConfig c;
    c.vocab_size = vocab;
    c.block_size = block;
    c.n_layer = n_layer;
    c.n_head = n_head;
    c.n_embd = n_embd;
    return c;
}

// A tiny GPT (1 layer, 16 channels) on one-digit addition, on the CPU, training in run directory
// `dir` for `steps` steps (well under a second); `overrides` ("train.grad_accum=2", ...) change it.
inline Config tiny_addition_run(const std::string& dir, std::int64_t steps,
                                std::vector<std::string> overrides = {}) {
    const std::string yaml =
        "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8}\n"
        "data: {kind: addition, digits: 1}\n"
        "optim: {lr: 1.0e-2, warmup_steps: 2}\n"
        "train: {batch_size: 8, eval_interval: 100, eval_iters: 1, checkpoint_interval: 2,"
        " device: cpu}\n";
    overrides.push_back("train.steps=" + std::to_string(steps));
    overrides.push_back("train.out_dir=" + dir);
    return parse_config(yaml, "tiny.yaml", overrides);
}

// Trains make(full_dir) uninterrupted and make(split_dir) stopped after step `stop`, then resumed
// from its checkpoint; requires the resumed run's losses to be the uninterrupted run's, bit for
// bit. Both run directories are left for the caller to inspect; returns the uninterrupted run's
// number of steps.
inline std::size_t require_resume_repeats(const std::function<Config(const std::string&)>& make,
                                          const std::string& full_dir, const std::string& split_dir,
                                          std::int64_t stop) {
    std::filesystem::remove_all(full_dir);
    std::filesystem::remove_all(split_dir);
    std::ostringstream log;
    Trainer full(make(full_dir), log, std::make_unique<ScaleWing>());
    full.run();
    {
        Trainer first(make(split_dir), log, std::make_unique<ScaleWing>());
        first.run(stop);
    }
    auto second = Trainer::resume(split_dir, {}, log, std::make_unique<ScaleWing>());
    REQUIRE(second->step() == stop);
    second->run();
    std::vector<double> tail(full.losses().begin() + stop, full.losses().end());
    REQUIRE(second->losses() == tail);  // exact equality: same bits
    return full.losses().size();
}

// Builds `config` on `device`, trains it two steps (forward, loss, backward, clipping, AdamW) on
// random (batch, seq_len) batches, and returns the allocator's peak bytes over all of it beyond
// what was in use before: what estimate_training_memory predicts.
inline double measured_step_peak(const GPTConfig& config, std::int64_t batch, std::int64_t seq_len,
                                 Device device) {
    std::size_t before = memory_stats(device).bytes_in_use;
    reset_peak_memory(device);
    {
        Generator gen(7);
        GPT model(config, gen, device);
        std::vector<NamedParam> params;
        for (auto& [name, p] : model.named_parameters()) params.push_back({name, p});
        AdamW opt(params, AdamWOptions{});
        for (int step = 0; step < 2; ++step) {
            opt.zero_grad();
            Tensor ids = randint({batch, seq_len}, static_cast<std::int32_t>(config.vocab_size),
                                 device, &gen);
            Tensor targets = randint({batch, seq_len}, static_cast<std::int32_t>(config.vocab_size),
                                     device, &gen);
            // As the trainer does: the logits are gone (only the loss holds them) by the backward.
            Tensor loss = model.loss(model.forward(ids), targets);
            loss.backward();
            clip_grad_norm(model.parameters(), 1.0);
            opt.step(1e-3);
        }
    }
    return static_cast<double>(memory_stats(device).peak_bytes_in_use - before);
}

inline constexpr std::uint64_t kTestSeed = 12345;
inline Generator& test_generator() {
    static Generator gen(kTestSeed);
    return gen;
}

// Both generators back to their initial states, unsharded (a trainer of several ranks shards
// the default one): test_setup.cpp calls it as each test case starts.
inline void reset_generators() {
    test_generator().set_state(kTestSeed, 0);
    test_generator().set_shard(0, 1);
    manual_seed(0);
    default_generator().set_shard(0, 1);
}

// logits = h W^T (rows x vocab, from a small inner dim), loss = cross_entropy(logits, targets),
// backward: once with the logits dropped before the backward (the gradient then overwrites
// them) and once with them still held (a separate gradient). Same gradients, bit for bit; the
// first peaks below the second by about one logits buffer.
inline void check_loss_in_place(Device device, DType dtype) {
    const std::int64_t rows = 512, vocab = 4096, inner = 8;
    Tensor h0 = randn({rows, inner}, Device::cpu, &test_generator()).to(dtype).to(device);
    Tensor w0 = randn({vocab, inner}, Device::cpu, &test_generator()).to(dtype).to(device);
    Tensor targets = randint({rows}, static_cast<std::int32_t>(vocab), device, &test_generator());
    std::vector<double> grads[2];
    std::size_t peaks[2];
    for (int held = 0; held < 2; ++held) {
        Tensor h = h0.detach().set_requires_grad(true), w = w0.detach().set_requires_grad(true);
        Tensor logits = matmul(h, w, false, true);
        Tensor loss = cross_entropy(logits, targets);
        if (!held) logits = Tensor();
        const std::size_t before = memory_stats(device).bytes_in_use;
        reset_peak_memory(device);
        loss.backward();
        peaks[held] = memory_stats(device).peak_bytes_in_use - before;
        grads[held] = h.grad().to_vector<double>();
        std::vector<double> gw = w.grad().to_vector<double>();
        grads[held].insert(grads[held].end(), gw.begin(), gw.end());
    }
    REQUIRE(grads[0] == grads[1]);
    const std::size_t logits_bytes = static_cast<std::size_t>(rows * vocab) * dtype_size(dtype);
    INFO("backward peak: logits dropped " << peaks[0] << " B, held " << peaks[1] << " B");
    REQUIRE(peaks[1] >= peaks[0] + logits_bytes);
}

inline Tensor random_f32(const Shape& shape, Device device = Device::cpu, float stddev = 1.0f) {
    return randn(shape, Device::cpu, &test_generator(), 0.0f, stddev).to(device);
}

inline Tensor random_f64(const Shape& shape, bool requires_grad = true, float stddev = 1.0f) {
    Tensor t = randn(shape, Device::cpu, &test_generator(), 0.0f, stddev).to(DType::f64);
    if (requires_grad) t.set_requires_grad(true);
    return t;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
        if (!std::isnan(a[i])) m = std::max(m, std::fabs(a[i] - b[i]));
    }
    return m;
}

// ||a - b|| / ||b||, infinite when a holds a NaN that b does not (a poisoned, unwritten element).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) && !std::isnan(b[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    if (den == 0.0) return std::sqrt(num);
    return std::sqrt(num / den);
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Compares each parameter's .grad with central differences (loss(x + h) - loss(x - h)) / 2h of
// `loss` (evaluated without recording), at up to max_checks elements spread over each tensor:
// |analytic - numeric| <= atol + rtol |numeric|. Parameters must be f64 CPU tensors whose
// gradient the caller has already computed.
inline void check_parameter_gradients(const std::function<double()>& loss,
                                      const std::vector<std::pair<std::string, Tensor*>>& params,
                                      double h, double atol, double rtol, std::int64_t max_checks) {
    for (const auto& [name, x] : params) {
        INFO("parameter " << name << " of shape " << shape_str(x->shape()));
        REQUIRE(x->grad().defined());
        std::vector<double> analytic = x->grad().to_vector<double>();
        double* data = x->data<double>();
        std::int64_t n = x->numel();
        std::int64_t step = std::max<std::int64_t>(1, n / max_checks);
        for (std::int64_t i = 0; i < n; i += step) {
            double saved = data[i];
            data[i] = saved + h;
            double plus = loss();
            data[i] = saved - h;
            double minus = loss();
            data[i] = saved;
            double numeric = (plus - minus) / (2 * h);
            INFO("element " << i << ": analytic " << analytic[i] << ", numeric " << numeric);
            REQUIRE(std::fabs(analytic[i] - numeric) <= atol + rtol * std::fabs(numeric));
        }
    }
}

// Compares autograd's gradient of L = sum(f(inputs) * w), w random, with central differences
// (L(x + h) - L(x - h)) / 2h for every element of every input that requires grad (up to
// max_checks elements each, spread over the tensor). Inputs must be f64 CPU tensors.
inline void check_gradients(const OpFn& f, const std::vector<Tensor>& inputs, double h = 1e-6,
                            double tol = 1e-6, std::int64_t max_checks = 60) {
    Tensor out = f(inputs);
    Tensor w = random_f64(out.shape(), false);
    Tensor loss = sum(mul(out, w));
    for (const Tensor& t : inputs)
        if (t.requires_grad()) const_cast<Tensor&>(t).zero_grad();
    loss.backward();
    auto loss_at = [&]() {
        NoGradGuard no_grad;
        return sum(mul(f(inputs), w)).item();
    };
    std::vector<Tensor> held(inputs);  // handles to the same storage, for the pointers below
    std::vector<std::pair<std::string, Tensor*>> params;
    for (std::size_t k = 0; k < held.size(); ++k)
        if (held[k].requires_grad()) params.emplace_back("input " + std::to_string(k), &held[k]);
    check_parameter_gradients(loss_at, params, h, tol, tol, max_checks);
}

}  // namespace fg::test
