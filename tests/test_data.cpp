// tests/test_data.cpp: the datasets: the character vocabulary, text splits and windows, the
// addition task's format, held-out problems that never reach training, answer-only targets, and
// the bad inputs (missing, empty, too short files; prompts outside the vocabulary).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "core/error.h"
#include "test_helpers.h"
#include "train/data.h"

using namespace fg;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
    std::string path = "/tmp/fg_test_" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

}  // namespace

TEST_CASE("the character vocabulary encodes and decodes", "[data]") {
    Vocab v = Vocab::from_text("hello world\n");
    REQUIRE(v.chars() == std::string("\n dehlorw"));
    std::vector<std::int32_t> ids = v.encode("hold");
    REQUIRE(v.decode(ids) == "hold");
    REQUIRE_THROWS_WITH(v.encode("hoZd", "prompt"),
                        ContainsSubstring("[data] prompt character 'Z' at position 2 is not in the vocabulary"));
    REQUIRE_THROWS_WITH(v.decode({99}), ContainsSubstring("token id 99 is outside [0, 9)"));
}

TEST_CASE("text data: splits, shifted targets, seeded windows", "[data]") {
    std::string text;
    for (int i = 0; i < 500; ++i) text += "abcdefghij"[i % 10];
    std::string path = write_temp("text.txt", text);
    TextData data(path, 0.1, 8);
    REQUIRE(data.vocab().size() == 10);
    REQUIRE(data.tokens(Split::train) == 450);
    REQUIRE(data.tokens(Split::val) == 50);
    Generator g1(3), g2(3);
    Batch a = data.batch(Split::train, 4, g1, Device::cpu), b = data.batch(Split::train, 4, g2, Device::cpu);
    REQUIRE(a.inputs.shape() == Shape{4, 8});
    REQUIRE(a.inputs.to_vector<std::int32_t>() == b.inputs.to_vector<std::int32_t>());
    std::vector<std::int32_t> x = a.inputs.to_vector<std::int32_t>(), y = a.targets.to_vector<std::int32_t>();
    for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 8; ++i) REQUIRE(y[r * 8 + i] == (x[r * 8 + i] + 1) % 10);  // next char
}

TEST_CASE("text data: missing, empty and too-short files", "[data][errors]") {
    REQUIRE_THROWS_WITH(TextData("/nonexistent/input.txt", 0.1, 8),
                        ContainsSubstring("[data] cannot read '/nonexistent/input.txt'"));
    REQUIRE_THROWS_WITH(TextData(write_temp("empty.txt", ""), 0.1, 8), ContainsSubstring("is empty"));
    // A FIFO (or a device) would block the read forever: refused at once, by name.
    const std::string fifo = "/tmp/fg_test_data.fifo";
    ::unlink(fifo.c_str());
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    REQUIRE_THROWS_WITH(TextData(fifo, 0.1, 8),
                        ContainsSubstring("'" + fifo + "' is not a regular file (a FIFO, socket or device)"));
    REQUIRE_THROWS_WITH(TextData("/tmp", 0.1, 8), ContainsSubstring("'/tmp' is a directory"));
    REQUIRE_THROWS_WITH(TextData(write_temp("short.txt", std::string(50, 'a')), 0.1, 8),
                        ContainsSubstring("has 50 characters") && ContainsSubstring("needs at least block_size + 1 = 9"));
}

TEST_CASE("addition problems, prompts and the held-out split", "[data]") {
    AdditionData data(2, 0.1, 1);
    REQUIRE(data.problem(7, 45) == "07+45=052");
    REQUIRE(data.problem(99, 99) == "99+99=198");
    REQUIRE(data.prompt(3, 4) == "03+04=");
    auto held = data.held_out_pairs();
    REQUIRE(held.size() > 800);
    REQUIRE(held.size() < 1200);  // about 10% of 10,000
    std::set<std::pair<std::int64_t, std::int64_t>> held_set(held.begin(), held.end());
    Generator gen(5);
    Batch b = data.batch(Split::train, 512, gen, Device::cpu);
    REQUIRE(b.inputs.shape() == Shape{512, 8});
    std::vector<std::int32_t> x = b.inputs.to_vector<std::int32_t>(), y = b.targets.to_vector<std::int32_t>();
    for (int r = 0; r < 512; ++r) {
        std::vector<std::int32_t> row(x.begin() + r * 8, x.begin() + r * 8 + 8);
        std::string s = data.vocab().decode(row);
        std::int64_t a = std::stoll(s.substr(0, 2)), c = std::stoll(s.substr(3, 2));
        REQUIRE(held_set.count({a, c}) == 0);  // never a held-out problem in training
        for (int i = 0; i < 8; ++i) {
            if (i < 5) REQUIRE(y[r * 8 + i] == -1);  // the prompt carries no loss
            else REQUIRE(y[r * 8 + i] == data.vocab().encode(data.problem(a, c))[i + 1]);
        }
    }
    Batch v = data.batch(Split::val, 64, gen, Device::cpu);
    std::vector<std::int32_t> vx = v.inputs.to_vector<std::int32_t>();
    for (int r = 0; r < 64; ++r) {
        std::string s = data.vocab().decode(std::vector<std::int32_t>(vx.begin() + r * 8, vx.begin() + r * 8 + 8));
        REQUIRE(held_set.count({std::stoll(s.substr(0, 2)), std::stoll(s.substr(3, 2))}) == 1);
    }
    REQUIRE_THROWS_WITH(AdditionData(0, 0.1, 1), ContainsSubstring("addition digits must be in [1, 6], got 0"));
}

TEST_CASE("data arguments are checked", "[data][errors]") {
    REQUIRE_THROWS_WITH(Vocab("abca"), ContainsSubstring("[data] vocabulary character 97 appears twice"));
    std::string path = write_temp("ok.txt", std::string(500, 'a'));
    REQUIRE_THROWS_WITH(TextData(path, 0.0, 8), ContainsSubstring("[data] val_fraction must be in (0, 1), got 0"));
    REQUIRE_THROWS_WITH(AdditionData(2, 1.0, 1), ContainsSubstring("[data] val_fraction must be in (0, 1), got 1"));
}
