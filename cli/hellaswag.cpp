// cli/hellaswag.cpp: see hellaswag.h.
#include "hellaswag.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace fg::cli {

std::vector<ChoiceExample> read_hellaswag(
    const std::string& path, std::int64_t limit,
    const std::function<std::vector<std::int32_t>(const std::string&)>& encode) {
    std::ifstream in(path, std::ios::binary);
    FG_CHECK(in.good(), "hellaswag", "cannot read '", path, "' (HellaSwag's validation split, "
             "hellaswag_val.jsonl, one JSON object a line)");
    std::vector<ChoiceExample> out;
    std::string line;
    for (std::int64_t number = 1; std::getline(in, line); ++number) {
        if (limit > 0 && static_cast<std::int64_t>(out.size()) >= limit) break;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = "'" + path + "' line " + std::to_string(number);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
            fail("hellaswag", where, " is not JSON: ", e.what());
        }
        FG_CHECK(j.is_object() && j.contains("ctx") && j["ctx"].is_string(), "hellaswag", where,
                 " has no \"ctx\" text");
        FG_CHECK(j.contains("endings") && j["endings"].is_array() && j["endings"].size() >= 2,
                 "hellaswag", where, " has no \"endings\": a list of at least two texts");
        FG_CHECK(j.contains("label") && j["label"].is_number_integer(), "hellaswag", where,
                 " has no \"label\" (HellaSwag's test split has none: use its validation "
                 "split)");
        const auto encoded = [&](const std::string& text) {
            try {
                return encode(text);
            } catch (const std::exception& e) {
                fail("hellaswag", where, ": ", e.what());
            }
        };
        ChoiceExample ex;
        ex.context = encoded(j["ctx"].get<std::string>());
        FG_CHECK(!ex.context.empty(), "hellaswag", where, ": \"ctx\" is empty");
        for (const nlohmann::json& ending : j["endings"]) {
            FG_CHECK(ending.is_string() && !ending.get<std::string>().empty(), "hellaswag",
                     where, ": every ending must be a non-empty text");
            ex.endings.push_back(encoded(" " + ending.get<std::string>()));
        }
        const std::int64_t label = j["label"].get<std::int64_t>();
        FG_CHECK(label >= 0 && label < static_cast<std::int64_t>(ex.endings.size()), "hellaswag",
                 where, ": label ", label, " is not one of the ", ex.endings.size(),
                 " endings (0 to ", ex.endings.size() - 1, ")");
        ex.label = static_cast<int>(label);
        out.push_back(std::move(ex));
    }
    FG_CHECK(!out.empty(), "hellaswag", "'", path, "' holds no example");
    return out;
}

ChoiceScore score_choices(GPT& model, const std::vector<ChoiceExample>& examples, Device device,
                          const std::function<void(std::int64_t, std::int64_t)>& progress) {
    NoGradGuard no_grad;
    const std::int64_t block = model.config().block_size;
    ChoiceScore score;
    for (const ChoiceExample& ex : examples) {
        const std::int64_t n = static_cast<std::int64_t>(ex.endings.size());
        std::int64_t longest = 0;
        for (const auto& e : ex.endings) longest = std::max<std::int64_t>(longest, e.size());
        FG_CHECK(longest < block, "hellaswag", "an ending of example ", score.examples + 1,
                 " is ", longest, " tokens, but the model sees at most ", block,
                 " (block_size), the context's last token included");
        // The context's end, as much of it as fits with the longest ending.
        const std::int64_t keep = std::min<std::int64_t>(ex.context.size(), block - longest);
        if (keep < static_cast<std::int64_t>(ex.context.size())) ++score.shortened;
        const std::int64_t length = keep + longest;
        // Row i: the context, ending i, then padding (the model is causal: what follows a
        // position does not change its logits). Targets: ending i's tokens, each at the position
        // that predicts it (the first from the context's last token); -1 elsewhere.
        std::vector<std::int32_t> ids(static_cast<std::size_t>(n * length), 0);
        for (std::int64_t i = 0; i < n; ++i) {
            auto row = ids.begin() + i * length;
            std::copy(ex.context.end() - keep, ex.context.end(), row);
            std::copy(ex.endings[i].begin(), ex.endings[i].end(), row + keep);
        }
        const Tensor logits =
            model.forward(Tensor::from_vector(ids, {n, length}, device));
        std::vector<double> sum(n), mean(n);
        for (std::int64_t i = 0; i < n; ++i) {  // each ending's loss over its own row's logits
            std::vector<std::int32_t> targets(static_cast<std::size_t>(length), -1);
            const auto& ending = ex.endings[i];
            for (std::size_t k = 0; k < ending.size(); ++k) targets[keep - 1 + k] = ending[k];
            mean[i] = cross_entropy(logits.slice(i, i + 1),
                                    Tensor::from_vector(targets, {1, length}, device), -1)
                          .item();
            sum[i] = mean[i] * static_cast<double>(ending.size());
        }
        // The first of equal losses, as an argmin takes it.
        const auto pick = [](const std::vector<double>& v) {
            return static_cast<int>(std::min_element(v.begin(), v.end()) - v.begin());
        };
        ++score.examples;
        score.correct += pick(sum) == ex.label;
        score.correct_norm += pick(mean) == ex.label;
        if (progress) progress(score.examples, static_cast<std::int64_t>(examples.size()));
    }
    return score;
}

}  // namespace fg::cli
