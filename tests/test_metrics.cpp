// tests/test_metrics.cpp: metrics.jsonl as the trainer writes it: every line parses as JSON, with
// the step and evaluation keys in their order and types, values rounded as documented (the
// losses to 6 decimals) and equal to what the run measured; and a resume drops the lines of steps
// after its checkpoint, a line cut short by a kill among them.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_helpers.h"

using namespace fg;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// Every line of a metrics file, parsed (a line that is not JSON fails the test, naming it).
std::vector<Json> read_lines(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::vector<Json> out;
    std::string line;
    while (std::getline(in, line)) {
        INFO("line " << out.size() + 1 << ": " << line);
        REQUIRE_NOTHROW(out.push_back(Json::parse(line)));
    }
    return out;
}

std::vector<std::string> keys_of(const Json& j) {
    std::vector<std::string> keys;
    for (const auto& item : j.items()) keys.push_back(item.key());
    return keys;
}

// True when v has at most `decimals` decimal places (as the rounding before writing leaves it).
bool has_decimals(double v, int decimals) {
    const double scaled = v * std::pow(10.0, decimals);
    return std::fabs(scaled - std::round(scaled)) < 1e-6 * std::max(1.0, std::fabs(scaled));
}

}  // namespace

TEST_CASE("metrics.jsonl: one JSON object a line, keys in order, numbers rounded", "[metrics]") {
    const std::string dir = "/tmp/fg_metrics_json";
    fs::remove_all(dir);
    std::ostringstream log;
    Trainer t(test::tiny_addition_run(dir, 4, {"train.eval_interval=2"}), log);
    t.run();
    const std::vector<Json> lines = read_lines(dir + "/metrics.jsonl");
    // Steps 1, 2, eval 2, 3, 4, eval 4.
    REQUIRE(lines.size() == 6);
    const std::vector<std::string> step_keys{"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s"};
    const std::vector<std::string> eval_keys{"step", "train_loss", "val_loss", "accuracy"};
    std::int64_t steps = 0, evals = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
        const Json& j = lines[i];
        INFO("line " << i + 1 << ": " << j.dump());
        REQUIRE(j.is_object());
        REQUIRE(j["step"].is_number_integer());
        if (j.contains("loss")) {  // a step (no mfu or peak_mem_mib on the CPU)
            ++steps;
            CHECK(keys_of(j) == step_keys);
            CHECK(j["step"].get<std::int64_t>() == steps);
            for (const char* k : {"loss", "lr", "grad_norm", "ms"}) CHECK(j[k].is_number_float());
            CHECK(j["tokens_per_s"].is_number_integer());
            CHECK(j["tokens_per_s"].get<std::int64_t>() > 0);
            const double loss = j["loss"].get<double>();
            CHECK(std::fabs(loss - t.losses()[static_cast<std::size_t>(steps - 1)]) <= 5e-7 + 1e-12);
            CHECK(has_decimals(loss, 6));
            CHECK(has_decimals(j["grad_norm"].get<double>(), 5));
            CHECK(has_decimals(j["ms"].get<double>(), 2));
            CHECK(j["lr"].get<double>() > 0);
        } else {
            ++evals;
            CHECK(keys_of(j) == eval_keys);
            CHECK(j["step"].get<std::int64_t>() == 2 * evals);
            for (const char* k : {"train_loss", "val_loss", "accuracy"}) CHECK(j[k].is_number_float());
            CHECK(has_decimals(j["val_loss"].get<double>(), 6));
            CHECK(has_decimals(j["accuracy"].get<double>(), 4));
        }
    }
    CHECK(steps == 4);
    CHECK(evals == 2);
    // Short lines: rounded numbers print in few digits.
    std::ifstream in(dir + "/metrics.jsonl");
    std::string first;
    std::getline(in, first);
    CHECK(first.size() < 120);
}

TEST_CASE("a resume drops metrics.jsonl's lines after its checkpoint, a cut-short one too",
          "[metrics]") {
    const std::string dir = "/tmp/fg_metrics_trim";
    fs::remove_all(dir);
    std::ostringstream log;
    {
        Trainer t(test::tiny_addition_run(dir, 4), log);  // checkpoint_interval 2
        t.run(2);
    }
    REQUIRE(read_lines(dir + "/metrics.jsonl").size() == 2);
    // What a run killed after its checkpoint leaves: step 3's line, and step 4's cut short.
    std::ofstream(dir + "/metrics.jsonl", std::ios::app)
        << Json{{"step", 3}, {"loss", 1.5}}.dump() << "\n{\"step\":4,\"lo";
    auto resumed = Trainer::resume(dir, {}, log);
    REQUIRE(resumed->step() == 2);
    std::vector<Json> lines = read_lines(dir + "/metrics.jsonl");
    REQUIRE(lines.size() == 2);
    CHECK(lines[1]["step"].get<std::int64_t>() == 2);
    resumed->run();
    lines = read_lines(dir + "/metrics.jsonl");
    std::vector<std::int64_t> steps;
    for (const Json& j : lines)
        if (j.contains("loss")) steps.push_back(j["step"].get<std::int64_t>());
    CHECK(steps == std::vector<std::int64_t>{1, 2, 3, 4});
    CHECK(lines[2]["loss"].get<double>() != 1.5);  // step 3 as trained again, not the old line
}
