// tests/test_safetensors.cpp: safetensors files: a round trip of every dtype with metadata, the
// atomic write, the GPT's state dict under nanoGPT's names, and truncated or corrupt files
// rejected with a message that says what is wrong.
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/gpt.h"
#include "test_helpers.h"
#include "train/safetensors.h"

using namespace fg;

namespace {

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("safetensors round trip, every dtype, metadata, atomic write", "[checkpoint]") {
    const std::string path = "/tmp/fg_test_roundtrip.safetensors";
    Tensor a = test::random_f32({3, 5});
    Tensor b = test::random_f32({7}).to(DType::bf16);
    Tensor c = Tensor::from_vector(std::vector<std::int32_t>{1, -2, 3}, {3});
    Tensor d = test::random_f64({2, 2}, false);
    Tensor e = test::random_f32({4}).to(DType::f16);
    Tensor empty = Tensor::zeros({0, 3});
    save_safetensors(path, {{"a", a}, {"b", b}, {"c", c}, {"d", d}, {"e", e}, {"empty", empty}},
                     {{"step", "42"}});
    // No temporary file is left beside it (write_file_durably's are path.XXXXXX.tmp).
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
        REQUIRE_FALSE(e.path().filename().string().rfind(std::filesystem::path(path).filename().string() + ".", 0) == 0);
    std::string bytes = read_all(path);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    REQUIRE((8 + n) % 8 == 0);  // data aligned
    SafetensorsFile f = load_safetensors(path);
    REQUIRE(f.tensors.size() == 6);
    REQUIRE(f.metadata.at("step") == "42");
    REQUIRE(f.find("a")->to_vector<float>() == a.to_vector<float>());
    REQUIRE(f.find("b")->dtype() == DType::bf16);
    REQUIRE(f.find("b")->to_vector<float>() == b.to_vector<float>());
    REQUIRE(f.find("c")->to_vector<std::int32_t>() == c.to_vector<std::int32_t>());
    REQUIRE(f.find("d")->to_vector<double>() == d.to_vector<double>());
    REQUIRE(f.find("e")->to_vector<float>() == e.to_vector<float>());
    REQUIRE(f.find("empty")->shape() == Shape{0, 3});
    REQUIRE(f.find("missing") == nullptr);
}

TEST_CASE("a GPT state dict saves under nanoGPT's names and shapes", "[checkpoint][gpt]") {
    GPTConfig c = test::small_gpt(13, 8, 2, 2, 16);
    Generator gen(1);
    GPT model(c, gen);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (auto& [name, p] : model.state_dict()) tensors.emplace_back(name, *p);
    const std::string path = "/tmp/fg_test_gpt.safetensors";
    save_safetensors(path, tensors);
    SafetensorsFile f = load_safetensors(path);
    REQUIRE(f.tensors.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
        INFO(name);
        REQUIRE(f.find(name) != nullptr);
        REQUIRE(f.find(name)->shape() == t.shape());
        REQUIRE(f.find(name)->to_vector<float>() == t.to_vector<float>());
    }
    REQUIRE(f.find("transformer.h.1.attn.c_attn.weight")->shape() == Shape{48, 16});
    REQUIRE(f.find("lm_head.weight")->to_vector<float>() ==
            f.find("transformer.wte.weight")->to_vector<float>());
}

TEST_CASE("truncated and corrupt safetensors files are refused", "[checkpoint][errors]") {
    const std::string path = "/tmp/fg_test_bad.safetensors";
    save_safetensors(path, {{"w", test::random_f32({64, 64})}});
    std::string good = read_all(path);
    write_all(path, good.substr(0, good.size() - 100));
    REQUIRE_THROWS_WITH(load_safetensors(path), ContainsSubstring("[checkpoint]") && ContainsSubstring("tensor 'w'") &&
                                                    ContainsSubstring("truncated file?"));
    write_all(path, good.substr(0, 5));
    REQUIRE_THROWS_WITH(load_safetensors(path), ContainsSubstring("is truncated: 5 bytes, no header"));
    std::string corrupt = good;
    corrupt[8] = '#';  // the header's opening brace
    write_all(path, corrupt);
    REQUIRE_THROWS_WITH(load_safetensors(path), ContainsSubstring("has a corrupt header"));
    std::string huge = good;
    huge[7] = '\x7f';  // header length far beyond the file
    write_all(path, huge);
    REQUIRE_THROWS_WITH(load_safetensors(path), ContainsSubstring("the header claims"));
    REQUIRE_THROWS_WITH(load_safetensors("/nonexistent/m.safetensors"), ContainsSubstring("cannot read"));
}

TEST_CASE("safetensors writes and headers that cannot be right", "[checkpoint][errors]") {
    Tensor t = test::random_f32({4});
    REQUIRE_THROWS_WITH(save_safetensors("/nonexistent/dir/m.safetensors", {{"w", t}}),
                        ContainsSubstring("[checkpoint] cannot create a temporary file beside '/nonexistent/dir/m.safetensors'"));
    REQUIRE_THROWS_WITH(save_safetensors("/tmp/fg_test_names.safetensors", {{"w", t}, {"w", t}}),
                        ContainsSubstring("tensor name 'w' is reserved or repeated"));
    REQUIRE_THROWS_WITH(save_safetensors("/tmp/fg_test_names.safetensors", {{"__metadata__", t}}),
                        ContainsSubstring("tensor name '__metadata__' is reserved or repeated"));
    auto with_header = [](const std::string& json) {
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
        bytes += json + std::string(16, '\0');
        write_all("/tmp/fg_test_header.safetensors", bytes);
        return "/tmp/fg_test_header.safetensors";
    };
    REQUIRE_THROWS_WITH(load_safetensors(with_header(R"({"w": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 16]}})")),
                        ContainsSubstring("tensor 'w' has a malformed entry"));
    REQUIRE_THROWS_WITH(load_safetensors(with_header(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})")),
                        ContainsSubstring("tensor 'w' of shape (3) needs 12 bytes, the header gives 16"));
    REQUIRE_THROWS_WITH(load_safetensors(with_header(R"([1, 2])")), ContainsSubstring("has a corrupt header: not an object"));
    REQUIRE_THROWS_WITH(
        load_safetensors(with_header(R"({"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}})")),
        ContainsSubstring("tensor 'w' has a malformed entry"));
    REQUIRE_THROWS_WITH(load_safetensors("/tmp"),
                        ContainsSubstring("[checkpoint] '/tmp' is a directory, not a safetensors file"));
    // Tensors that share bytes: refused before anything is allocated (a crafted header could
    // otherwise name the same few bytes for any number of tensors).
    REQUIRE_THROWS_WITH(
        load_safetensors(with_header(
            R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})")),
        ContainsSubstring("tensors 'a' [0, 16) and 'b' [8, 16) overlap"));
    // Back to back, and empty tensors anywhere, are fine.
    const SafetensorsFile ok = load_safetensors(with_header(
        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},)"
        R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})"));
    CHECK(ok.tensors.size() == 3);
}

TEST_CASE("a crafted header cannot make a small file cost much memory", "[checkpoint][errors]") {
    // 1 MiB of data named 1000 times over: were the overlaps read, 1000 MiB would be allocated.
    // Two measures: the tensor allocator's high-water mark (reset here), and the process's peak
    // resident size, which also sees memory taken outside the allocator (ctest runs each case in
    // a process of its own, so that peak is this case's; in a run of many cases an earlier peak
    // could hide this one's, which the allocator's mark cannot).
    std::string json = "{";
    for (int i = 0; i < 1000; ++i)
        json += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
                "\": {\"dtype\": \"F32\", \"shape\": [262144], \"data_offsets\": [0, 1048576]}";
    json += "}";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    bytes += json + std::string(1 << 20, '\0');
    write_all("/tmp/fg_test_overlap.safetensors", bytes);
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    const std::size_t in_use = memory_stats(Device::cpu).bytes_in_use;
    reset_peak_memory(Device::cpu);
    REQUIRE_THROWS_WITH(load_safetensors("/tmp/fg_test_overlap.safetensors"), ContainsSubstring("overlap"));
    ::getrusage(RUSAGE_SELF, &after);
    CHECK(memory_stats(Device::cpu).peak_bytes_in_use - in_use < (std::size_t{64} << 20));
    CHECK(after.ru_maxrss - before.ru_maxrss < 64 * 1024);  // KiB: under 64 MiB more at peak
}
