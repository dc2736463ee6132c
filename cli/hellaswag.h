// cli/hellaswag.h: multiple-choice evaluation in HellaSwag's format (`fusegrad eval --hellaswag`).
// Each example is a context and several endings, one of them right. The model scores every
// ending by its tokens' cross-entropy after the context (the ending is encoded with a space in
// front, as it follows the context's last word); the ending with the lowest sum is the answer
// counted by `acc`, the one with the lowest mean (the sum divided by the ending's token count) the
// answer counted by `acc_norm`, which does not favour short endings. This is how llm.c scores
// HellaSwag. The file is the user's (HellaSwag's published validation split, one JSON object a
// line with "ctx", "endings" and "label"); nothing is fetched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/gpt.h"

namespace fg::cli {

struct ChoiceExample {
    std::vector<std::int32_t> context;
    std::vector<std::vector<std::int32_t>> endings;  // each with its leading space
    int label = 0;                                   // the right ending
};

// The first `limit` examples of the JSONL file at `path` (limit <= 0: all), encoded by `encode`.
// A line that is not such an object (no label, fewer than two endings, an empty one, a label out
// of range, ...) is an error naming the file, the line and what is wrong.
std::vector<ChoiceExample> read_hellaswag(
    const std::string& path, std::int64_t limit,
    const std::function<std::vector<std::int32_t>(const std::string&)>& encode);

struct ChoiceScore {
    std::int64_t examples = 0;
    std::int64_t correct = 0;       // acc: lowest summed loss
    std::int64_t correct_norm = 0;  // acc_norm: lowest mean loss
    std::int64_t shortened = 0;     // examples whose context lost its start to fit block_size
};

// Scores `examples` with `model` (in eval mode) on `device`. A context and ending longer than
// the model's block_size keep the end of the context; an ending of block_size tokens or more (no
// room for the context's last token) is an error.
// `progress(done, total)` is called after each example, when given.
ChoiceScore score_choices(GPT& model, const std::vector<ChoiceExample>& examples, Device device,
                          const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace fg::cli
