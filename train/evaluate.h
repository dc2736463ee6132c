// train/evaluate.h: a trained model's evaluation and generation, and a run read back from its
// directory (the commands sample and eval, and the trainer's evaluations).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config.h"
#include "data.h"
#include "models/gpt.h"

namespace fg {

struct EvalResult {
    double train_loss = 0.0, val_loss = 0.0;
    double accuracy = -1.0;  // exact match on held-out addition problems; -1 for text
    // The validation loss in bits per byte of text (-1 unless token_bytes was given): the loss's
    // nats over ln 2, times the tokens, over the bytes those tokens stand for, on the same batches.
    double val_bits_per_byte = -1.0;
};

// Mean train and validation loss over eval_iters batches (the same batches every time), and for
// addition the exact-match accuracy on (up to 2000) held-out problems by greedy decoding.
// Several ranks share the work: rank r takes batches and problems r, r + N, ..., and `sum` adds
// the ranks' totals (every rank then returns the same result).
struct EvalShare {
    int rank = 0, world_size = 1;
    std::function<void(double*, std::size_t)> sum;  // over the ranks, in place
};
// `token_bytes` (optional): how many bytes of text a token id stands for, for bits per byte.
EvalResult evaluate_model(GPT& model, const Dataset& data, const Config& config, Device device,
                          const EvalShare& share = {},
                          const std::function<std::int64_t(std::int32_t)>& token_bytes = nullptr);
// A trained model read back from a run directory (config.yaml, vocab.txt and model.safetensors,
// or best.safetensors with `best`), on `device`, in eval mode.
struct LoadedModel {
    Config config;
    Vocab vocab{""};
    std::unique_ptr<GPT> model;
};
LoadedModel load_run(const std::string& run_dir, bool best, Device device);
// Loads `path` (a safetensors file with the model's state_dict names) into `model` on `device`;
// a missing tensor or a different shape is an error naming it.
void load_weights(GPT& model, const std::string& path, Device device);
// Copies a checkpoint's tensor `source` into `target`, keeping target's requires_grad, on
// `device`; a shape that differs is an error naming `name` and `file`.
void load_tensor(Tensor& target, const Tensor& source, const std::string& name,
                 const std::string& file, Device device);
// Greedy (temperature 0) or sampled continuation of `prompts` (i32 (N, P)) by `steps` tokens;
// returns (N, P + steps). Contexts longer than block_size keep their last block_size tokens.
// Only ids below `vocab` are drawn (0: all of the model's): a model.vocab_size larger than the
// data's vocabulary has ids that mean nothing.
Tensor generate(GPT& model, const Tensor& prompts, std::int64_t steps, double temperature,
                std::int64_t top_k, Generator& gen, std::int64_t vocab = 0);


}  // namespace fg
