// tests/test_hellaswag.cpp: HellaSwag's scoring (cli/hellaswag.h) with a model whose every answer
// is known: all weights zero but the final norm's bias and one row of the token embedding, so
// that every position's logits are the same, `s` for token 'a' and 0 for the others. A token 'a'
// then costs about 7 e^-s nats, any other about s: each ending's summed and mean loss, and so
// which ending acc and acc_norm pick, follow from its letters. Which end of a long context is
// kept needs a model whose scores read the context: one of random weights, compared with itself.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/hellaswag.h"
#include "test_helpers.h"

using namespace fg;

namespace {

// ' ' -> 0, 'a' -> 1, 'b' -> 2, any other character -> 3.
std::vector<std::int32_t> encode(const std::string& text) {
    std::vector<std::int32_t> ids;
    for (char ch : text) ids.push_back(ch == ' ' ? 0 : ch == 'a' ? 1 : ch == 'b' ? 2 : 3);
    return ids;
}

// The model above, with a vocabulary of 8 and a block of 16 tokens.
std::unique_ptr<GPT> known_model() {
    Generator gen(1);
    auto model = std::make_unique<GPT>(test::small_gpt(8, 16, 1, 2, 8), gen);
    for (auto& [name, p] : model->named_parameters()) {
        float* v = p->data<float>();
        for (std::int64_t k = 0; k < p->numel(); ++k) v[k] = 0.0f;
    }
    for (auto& [name, p] : model->named_parameters()) {
        if (name == "transformer.ln_f.bias") p->data<float>()[0] = 12.0f;
        if (name == "transformer.wte.weight") p->data<float>()[1 * 8 + 0] = 1.0f;  // row 'a'
    }
    model->train(false);
    return model;
}

std::string write_file(const std::string& name, const std::string& text) {
    const std::string path = "/tmp/fg_hellaswag_" + name + ".jsonl";
    std::ofstream(path) << text;
    return path;
}

}  // namespace

TEST_CASE("hellaswag: acc takes the lowest summed loss, acc_norm the lowest mean", "[hellaswag]") {
    // With the space in front of each ending (a non-'a' token, cost s): example 1's endings cost
    // 2s+e, 11s, 2s, 2s+3e summed (acc picks 2) and (2s+e)/3, s, s, (2s+3e)/5 a token (acc_norm
    // picks 3); example 3's first ending is cheapest both ways; example 4's costs 2s against
    // 2s+e summed (acc picks 0) and s against (2s+e)/3 a token (acc_norm picks 1).
    const std::string path = write_file("known",
        R"({"ctx": "c c", "endings": ["ab", "bbbbbbbbbb", "b", "aaab"], "label": 2})" "\n"
        R"({"ctx": "c c", "endings": ["ab", "bbbbbbbbbb", "b", "aaab"], "label": 3})" "\n"
        "\n"  // blank lines are skipped
        R"({"ctx": "c", "endings": ["aaaaaaaa", "b", "ba", "bb"], "label": 0, "ind": 7})" "\n"
        R"({"ctx": "cc", "endings": ["b", "ab"], "label": 1})" "\n");
    std::unique_ptr<GPT> model = known_model();
    const auto examples = cli::read_hellaswag(path, 0, encode);
    REQUIRE(examples.size() == 4);
    CHECK(examples[0].endings[1].size() == 11);  // " bbbbbbbbbb": the space is the first token
    CHECK(examples[0].endings[1][0] == 0);
    std::int64_t reported = 0;
    const cli::ChoiceScore s = cli::score_choices(
        *model, examples, Device::cpu, [&](std::int64_t done, std::int64_t) { reported = done; });
    CHECK(s.examples == 4);
    CHECK(s.correct == 2);       // examples 1 and 3
    CHECK(s.correct_norm == 3);  // examples 2, 3 and 4
    CHECK(s.shortened == 0);
    CHECK(reported == 4);
    // --limit: the first examples only.
    CHECK(cli::score_choices(*model, cli::read_hellaswag(path, 2, encode), Device::cpu).correct ==
          1);
}

TEST_CASE("hellaswag: a long context is shortened to fit, an ending too long is an error",
          "[hellaswag]") {
    // (Which end is kept this model cannot show: its logits ignore the context. The next case.)
    std::unique_ptr<GPT> model = known_model();
    // 30 characters of context and 3-token endings: 13 context tokens fit the block of 16.
    const std::string path = write_file("long",
        R"({"ctx": "cccccccccccccccccccccccccccccc", "endings": ["aa", "bb"], "label": 0})" "\n");
    const cli::ChoiceScore s =
        cli::score_choices(*model, cli::read_hellaswag(path, 0, encode), Device::cpu);
    CHECK(s.shortened == 1);
    CHECK(s.correct == 1);
    CHECK(s.correct_norm == 1);
    const std::string too_long = write_file("too_long",
        R"({"ctx": "c", "endings": ["aaaaaaaaaaaaaaaaaaaa", "b"], "label": 0})" "\n");
    CHECK_THROWS_WITH(
        cli::score_choices(*model, cli::read_hellaswag(too_long, 0, encode), Device::cpu),
        ContainsSubstring("an ending of example 1 is 21 tokens, but the model sees at most 16"));
}

TEST_CASE("hellaswag: a shortened context keeps its end", "[hellaswag]") {
    // A model whose scores read the context: weights drawn with a spread large enough that
    // attention moves the endings' losses. An example whose context is shortened to fit must pick
    // the endings its context's last tokens alone pick, and (for some examples) not those its
    // first tokens pick, which shows that the check can fail.
    Generator init(7);
    GPT model(test::small_gpt(8, 16, 1, 2, 8), init);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& [name, p] : model.named_parameters())
        for (std::int64_t k = 0; k < p->numel(); ++k) p->data<float>()[k] = normal(rng);
    model.train(false);
    // The endings acc and acc_norm pick: scored once a label, the right one is the pick.
    const auto picks = [&](cli::ChoiceExample ex) {
        std::pair<int, int> picked{-1, -1};
        for (int label = 0; label < static_cast<int>(ex.endings.size()); ++label) {
            ex.label = label;
            const cli::ChoiceScore s = cli::score_choices(model, {ex}, Device::cpu);
            if (s.correct) picked.first = label;
            if (s.correct_norm) picked.second = label;
        }
        return picked;
    };
    std::uniform_int_distribution<int> token(0, 3);
    int start_differs = 0;
    for (int trial = 0; trial < 40; ++trial) {
        cli::ChoiceExample ex;  // 30 context tokens, endings of 2 or 3: 13 context tokens fit
        for (int k = 0; k < 30; ++k) ex.context.push_back(token(rng));
        for (int e = 0; e < 4; ++e) {
            ex.endings.push_back({0});  // the leading space
            for (int k = 0; k < 1 + e % 2; ++k) ex.endings.back().push_back(token(rng));
        }
        cli::ChoiceExample end = ex, start = ex;
        end.context.erase(end.context.begin(), end.context.end() - 13);
        start.context.resize(13);
        INFO("trial " << trial);
        REQUIRE(cli::score_choices(model, {ex}, Device::cpu).shortened == 1);
        CHECK(picks(ex) == picks(end));
        start_differs += picks(ex) != picks(start);
    }
    CHECK(start_differs > 0);
}

TEST_CASE("hellaswag: a line that is not an example is named", "[hellaswag]") {
    auto error_of = [](const std::string& line) {
        const std::string path = write_file("bad", R"({"ctx": "c", "endings": ["a", "b"], "label": 0})"
                                                   "\n" + line + "\n");
        try {
            cli::read_hellaswag(path, 0, encode);
        } catch (const std::exception& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    CHECK_THAT(error_of("{\"ctx\": \"c\", \"endings\": [\"a\", \"b\"]"),
               ContainsSubstring("line 2 is not JSON"));
    CHECK_THAT(error_of(R"({"endings": ["a", "b"], "label": 0})"),
               ContainsSubstring("line 2 has no \"ctx\" text"));
    CHECK_THAT(error_of(R"({"ctx": "c", "endings": ["a"], "label": 0})"),
               ContainsSubstring("line 2 has no \"endings\": a list of at least two texts"));
    CHECK_THAT(error_of(R"({"ctx": "c", "endings": ["a", "b"]})"),
               ContainsSubstring("line 2 has no \"label\" (HellaSwag's test split has none"));
    CHECK_THAT(error_of(R"({"ctx": "c", "endings": ["a", "b"], "label": 2})"),
               ContainsSubstring("line 2: label 2 is not one of the 2 endings (0 to 1)"));
    CHECK_THAT(error_of(R"({"ctx": "c", "endings": ["a", ""], "label": 0})"),
               ContainsSubstring("line 2: every ending must be a non-empty text"));
    CHECK_THAT(error_of(R"({"ctx": "", "endings": ["a", "b"], "label": 0})"),
               ContainsSubstring("line 2: \"ctx\" is empty"));
    CHECK_THROWS_WITH(cli::read_hellaswag("/tmp/fg_hellaswag_missing.jsonl", 0, encode),
                      ContainsSubstring("cannot read '/tmp/fg_hellaswag_missing.jsonl'"));
    CHECK_THROWS_WITH(cli::read_hellaswag(write_file("empty", "\n"), 0, encode),
                      ContainsSubstring("holds no example"));
}
