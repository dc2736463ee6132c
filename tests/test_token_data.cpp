// tests/test_token_data.cpp: token data (issue 28, item 5): llm.c's .bin shards (GPT-2: magic
// 20240520 version 1, uint16 ids; LLaMA-3: magic 20240801 version 7, uint32 ids) and nanoGPT's raw
// uint16 files, written here into a temporary folder; random_tokens; the token vocabulary
// (vocab.txt, prompts as ids). Batches: shapes, targets the inputs shifted by one, windows inside
// one file of the right split, every window drawn, reproducible for a seed. Every bad input's
// message. Three-step training runs on random tokens and on shards that resume exactly, evaluate
// and sample; the shipped configs/gpt2_124m.yaml.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "cli/prepare.h"
#include "core/error.h"
#include "models/gpt_memory.h"
#include "test_helpers.h"
#include "train/data.h"
#include "train/trainer.h"

using namespace fg;
namespace fs = std::filesystem;

namespace {

constexpr std::int32_t kGpt2Magic = 20240520, kLlama3Magic = 20240801;
constexpr std::int64_t kCountOfIds = std::numeric_limits<std::int64_t>::min();

// A fresh, empty folder for one test.
std::string temp_dir(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / ("fg_token_data_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir.string();
}

// An llm.c shard: the 256-int32 header (magic, version, count) then the ids as `bytes`-byte
// little-endian integers. The header's count is `count` (kCountOfIds: ids.size()); `cut` bytes
// are dropped from the end.
std::string write_llmc(const std::string& path, const std::vector<std::uint32_t>& ids,
                       std::int32_t magic = kGpt2Magic, std::int32_t version = 1, int bytes = 2,
                       std::int64_t count = kCountOfIds, std::size_t cut = 0) {
    std::vector<std::int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<std::int32_t>(
        count == kCountOfIds ? static_cast<std::int64_t>(ids.size()) : count);
    std::string data(reinterpret_cast<const char*>(header.data()), 1024);
    for (std::uint32_t id : ids) {
        char b[4];
        std::memcpy(b, &id, 4);  // little-endian host (data.cpp asserts it)
        data.append(b, static_cast<std::size_t>(bytes));
    }
    data.resize(data.size() - cut);
    std::ofstream(path, std::ios::binary) << data;
    return path;
}

std::string write_llama3(const std::string& path, const std::vector<std::uint32_t>& ids) {
    return write_llmc(path, ids, kLlama3Magic, 7, 4);
}

// nanoGPT's train.bin / val.bin: uint16 ids, no header.
std::string write_raw(const std::string& path, const std::vector<std::uint32_t>& ids) {
    std::string data;
    for (std::uint32_t id : ids) {
        auto v = static_cast<std::uint16_t>(id);
        data.append(reinterpret_cast<const char*>(&v), 2);
    }
    std::ofstream(path, std::ios::binary) << data;
    return path;
}

// n consecutive ids from `first`: a window's targets are then its inputs + 1, and an id says
// which file it came from (first / 1000).
std::vector<std::uint32_t> run_of(std::uint32_t first, std::size_t n) {
    std::vector<std::uint32_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = first + static_cast<std::uint32_t>(i);
    return ids;
}

std::vector<std::int32_t> ids_of(const Tensor& t) {
    return t.to_vector<std::int32_t>();
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message ShardData throws for these files (train, val), or "" when none.
std::string shard_error(const std::string& train, const std::string& val,
                        TokenFormat format = TokenFormat::llmc, std::int64_t vocab = 0,
                        std::int64_t block = 8) {
    try {
        ShardData data(train, val, format, vocab, block);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// A tiny GPT (1 layer, 16 channels) on token data on the CPU, `steps` steps in `dir`.
Config tiny_token_run(const std::string& dir, std::int64_t steps,
                      std::vector<std::string> overrides) {
    const std::string yaml =
        "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8}\n"
        "data: {kind: random_tokens, vocab_size: 64}\n"
        "optim: {lr: 1.0e-2, warmup_steps: 1}\n"
        "train: {batch_size: 4, eval_interval: 2, eval_iters: 2, checkpoint_interval: 2,"
        " device: cpu}\n";
    overrides.push_back("train.steps=" + std::to_string(steps));
    overrides.push_back("train.out_dir=" + dir);
    return parse_config(yaml, "tiny_tokens.yaml", overrides);
}

}  // namespace

TEST_CASE("prepare refuses an llm.c shard its header cannot count", "[token_data][errors]") {
    // (2^31 tokens of input are too many to send here: the check prepare runs on every shard.)
    CHECK_NOTHROW(cli::check_llmc_shard_tokens(2147483647u, "/tmp/x_val_000000.bin"));
    CHECK_THROWS_WITH(cli::check_llmc_shard_tokens(2147483648u, "/tmp/x_val_000000.bin"),
                      ContainsSubstring("[prepare] '/tmp/x_val_000000.bin' would hold 2147483648 "
                                        "tokens, more than llm.c's header can count (2^31 - 1)"));
}

TEST_CASE("a shard shorter than one window is never drawn, a split of only such is refused",
          "[token_data]") {
    // fusegrad prepare (or llm.c's scripts) can end a split with a short last shard.
    const std::string dir = temp_dir("short_last");
    write_llmc(dir + "/s_train_000001.bin", run_of(1000, 20));
    write_llmc(dir + "/s_train_000002.bin", run_of(2000, 5));  // 5 < block_size + 1 = 9
    write_llmc(dir + "/s_train_000003.bin", run_of(3000, 12));
    write_llmc(dir + "/s_val_000000.bin", run_of(40000, 12));
    const std::int64_t t = 8;
    ShardData data(dir + "/s_train_*.bin", dir + "/s_val_*.bin", TokenFormat::llmc, 0, t);
    CHECK(data.tokens(Split::train) == 37);
    CHECK_THAT(data.describe(),
               ContainsSubstring("training 3 files") &&
                   ContainsSubstring("(1 shorter than one window, so never drawn)"));
    // Every window of the two long files (12 + 4) is drawn, none from the short one.
    Generator gen(3);
    std::set<std::int32_t> starts;
    for (int b = 0; b < 40; ++b) {
        const Batch batch = data.batch(Split::train, 16, gen, Device::cpu);
        const std::vector<std::int32_t> x = ids_of(batch.inputs);
        for (std::int64_t r = 0; r < 16; ++r) starts.insert(x[r * t]);
    }
    std::set<std::int32_t> expected;
    for (std::int32_t i = 0; i < 12; ++i) expected.insert(1000 + i);
    for (std::int32_t i = 0; i < 4; ++i) expected.insert(3000 + i);
    CHECK(starts == expected);
    // A split whose every file is short has no window.
    write_llmc(dir + "/t_train_000001.bin", run_of(1000, 6));
    write_llmc(dir + "/t_train_000002.bin", run_of(2000, 7));
    CHECK_THAT(shard_error(dir + "/t_train_*.bin", dir + "/s_val_*.bin"),
               ContainsSubstring("'" + dir + "/t_train_000001.bin' holds 6 tokens, fewer than one "
                                 "window of block_size + 1 = 9 (inputs and the targets shifted by "
                                 "one), and so do the other files of data.path"));
}

TEST_CASE("llm.c GPT-2 shards: windows of one file, shifted targets, seeded", "[token_data]") {
    const std::string dir = temp_dir("gpt2");
    // Three training files of different lengths (written out of order: the glob sorts them),
    // one validation file; file k holds k * 1000, k * 1000 + 1, ...
    write_llmc(dir + "/tiny_train_000002.bin", run_of(2000, 30));
    write_llmc(dir + "/tiny_train_000001.bin", run_of(1000, 20));
    write_llmc(dir + "/tiny_train_000003.bin", run_of(3000, 9));  // exactly one window
    write_llmc(dir + "/tiny_val_000000.bin", run_of(40000, 12));
    const std::int64_t t = 8;
    ShardData data(dir + "/tiny_train_*.bin", dir + "/tiny_val_*.bin", TokenFormat::llmc, 0, t);
    CHECK(data.version() == 1);
    CHECK(data.sequence_length() == t);
    CHECK(data.tokens(Split::train) == 59);
    CHECK(data.tokens(Split::val) == 12);
    CHECK(data.files(Split::train) == std::vector<std::string>{dir + "/tiny_train_000001.bin",
                                                               dir + "/tiny_train_000002.bin",
                                                               dir + "/tiny_train_000003.bin"});
    CHECK(data.vocab().is_tokens());
    CHECK(data.vocab().size() == 50257);
    CHECK(data.vocab().chars() == "tokens: gpt2 50257\n");
    CHECK_THAT(data.describe(),
               ContainsSubstring("llm.c shards (GPT-2: magic 20240520, version 1, uint16") &&
                   ContainsSubstring("training 3 files") && ContainsSubstring("validation 1 file") &&
                   ContainsSubstring("vocabulary gpt2 50257"));

    // Every window of every training file is drawn (12 + 22 + 1 = 35 windows; 50 x 16 rows), and
    // nothing else: a row lies inside one file, targets are the inputs shifted by one.
    Generator gen(7);
    std::set<std::int32_t> starts;
    for (int b = 0; b < 50; ++b) {
        Batch batch = data.batch(Split::train, 16, gen, Device::cpu);
        REQUIRE(batch.inputs.shape() == Shape{16, t});
        REQUIRE(batch.targets.shape() == Shape{16, t});
        REQUIRE(batch.inputs.dtype() == DType::i32);
        const std::vector<std::int32_t> x = ids_of(batch.inputs), y = ids_of(batch.targets);
        for (std::int64_t r = 0; r < 16; ++r) {
            const std::int32_t first = x[r * t], file = first / 1000;
            REQUIRE((file >= 1 && file <= 3));
            const std::int32_t length = file == 1 ? 20 : file == 2 ? 30 : 9;
            REQUIRE(first - file * 1000 + t + 1 <= length);  // the window ends inside its file
            for (std::int64_t i = 0; i < t; ++i) {
                REQUIRE(x[r * t + i] == first + i);
                REQUIRE(y[r * t + i] == first + i + 1);
            }
            starts.insert(first);
        }
    }
    CHECK(starts.size() == 35);
    CHECK(starts.count(1000));
    CHECK(starts.count(1011));  // the last window of file 1: ids 1011 .. 1019
    CHECK(starts.count(2021));
    CHECK(starts.count(3000));

    // The validation split reads only its own file.
    for (std::int32_t id : ids_of(data.batch(Split::val, 32, gen, Device::cpu).inputs))
        REQUIRE((id >= 40000 && id < 40012));

    // The same generator state draws the same batch; another seed another one.
    Generator a(11), b(11), c(12);
    const Batch ba = data.batch(Split::train, 8, a, Device::cpu);
    CHECK(ids_of(ba.inputs) == ids_of(data.batch(Split::train, 8, b, Device::cpu).inputs));
    CHECK(ids_of(ba.inputs) !=
          ids_of(data.batch(Split::train, 8, b, Device::cpu).inputs));  // moved on
    CHECK(ids_of(ba.inputs) != ids_of(data.batch(Split::train, 8, c, Device::cpu).inputs));
    CHECK(a.offset() == 8);  // one draw a row

    // A single file, named as it is (no pattern).
    ShardData one(dir + "/tiny_train_000002.bin", dir + "/tiny_val_000000.bin", TokenFormat::llmc,
                  0, t);
    CHECK(one.files(Split::train).size() == 1);
    CHECK(one.tokens(Split::train) == 30);
}

TEST_CASE("llm.c LLaMA-3 shards and nanoGPT's raw uint16 files", "[token_data]") {
    const std::string dir = temp_dir("formats");
    // LLaMA-3: uint32 ids past 65535.
    write_llama3(dir + "/l_train_000001.bin", run_of(100000, 40));
    write_llama3(dir + "/l_val_000000.bin", run_of(120000, 10));
    ShardData llama(dir + "/l_train_*.bin", dir + "/l_val_*.bin", TokenFormat::llmc, 0, 8);
    CHECK(llama.version() == 7);
    CHECK(llama.vocab().chars() == "tokens: llama3 128256\n");
    CHECK_THAT(llama.describe(), ContainsSubstring("LLaMA-3: magic 20240801, version 7, uint32 ids"));
    Generator gen(3);
    Batch b = llama.batch(Split::train, 4, gen, Device::cpu);
    const std::vector<std::int32_t> x = ids_of(b.inputs), y = ids_of(b.targets);
    for (std::size_t i = 0; i < x.size(); ++i) {
        REQUIRE((x[i] >= 100000 && x[i] < 100040));
        REQUIRE(y[i] == x[i] + 1);
    }
    for (std::int32_t id : ids_of(llama.batch(Split::val, 4, gen, Device::cpu).targets))
        REQUIRE((id > 120000 && id < 120010));

    // nanoGPT: train.bin and val.bin, uint16 ids, no header.
    write_raw(dir + "/train.bin", run_of(500, 100));
    write_raw(dir + "/val.bin", run_of(900, 20));
    ShardData raw(dir + "/train.bin", dir + "/val.bin", TokenFormat::raw_uint16, 0, 8);
    CHECK(raw.version() == 0);
    CHECK(raw.tokens(Split::train) == 100);
    CHECK(raw.vocab().chars() == "tokens: uint16 50257\n");
    CHECK_THAT(raw.describe(), ContainsSubstring("raw uint16 token files (nanoGPT's)"));
    Batch r = raw.batch(Split::train, 4, gen, Device::cpu);
    const std::vector<std::int32_t> rx = ids_of(r.inputs), ry = ids_of(r.targets);
    for (std::size_t i = 0; i < rx.size(); ++i) {
        REQUIRE((rx[i] >= 500 && rx[i] < 600));
        REQUIRE(ry[i] == rx[i] + 1);
    }
    // data.vocab_size sets the vocabulary (nanoGPT's shakespeare_char: 65 characters as ids).
    write_raw(dir + "/chars.bin", std::vector<std::uint32_t>(50, 64));
    write_raw(dir + "/chars_val.bin", std::vector<std::uint32_t>(50, 3));
    ShardData chars(dir + "/chars.bin", dir + "/chars_val.bin", TokenFormat::raw_uint16, 65, 8);
    CHECK(chars.vocab().chars() == "tokens: uint16 65\n");
    CHECK(ids_of(chars.batch(Split::train, 2, gen, Device::cpu).inputs) ==
          std::vector<std::int32_t>(16, 64));
}

TEST_CASE("token shards: every bad input names the file and what is wrong",
          "[token_data][errors]") {
    const std::string dir = temp_dir("errors");
    const std::string good = write_llmc(dir + "/good.bin", run_of(0, 50));
    const std::string val = write_llmc(dir + "/val.bin", run_of(0, 50));
    REQUIRE(shard_error(good, val).empty());

    // The header.
    const std::string magic = write_llmc(dir + "/magic.bin", run_of(0, 50), 12345);
    CHECK_THAT(shard_error(magic, val),
               ContainsSubstring("[data] '" + magic +
                        "' does not start with one of llm.c's magic numbers, "
                        "20240520 (GPT-2, uint16 ids) or 20240801 (LLaMA-3, uint32 ids): its first "
                        "int32 is 12345; not an llm.c shard (data.format: llmc); nanoGPT's") &&
                   ContainsSubstring("need data.format: raw_uint16"));
    const std::string nanogpt = write_raw(dir + "/nanogpt.bin", run_of(0, 600));
    CHECK_THAT(shard_error(nanogpt, val),
               ContainsSubstring("does not start with one of llm.c's magic numbers"));
    const std::string tiny = dir + "/tiny.bin";
    std::ofstream(tiny, std::ios::binary) << std::string(100, 'x');
    CHECK_THAT(shard_error(tiny, val),
               ContainsSubstring("'" + tiny +
                        "' is 100 bytes, shorter than the 1024-byte header of llm.c's "
                        "shards (data.format: llmc)"));
    const std::string v2 = write_llmc(dir + "/v2.bin", run_of(0, 50), kGpt2Magic, 2);
    CHECK_THAT(
        shard_error(v2, val),
        ContainsSubstring("'" + v2 +
                 "' has llm.c's GPT-2 magic number 20240520 but header version 2; "
                 "llm.c writes version 1 with it (uint16 ids), and fusegrad reads no other"));
    const std::string l1 = write_llmc(dir + "/l1.bin", run_of(0, 50), kLlama3Magic, 1, 4);
    CHECK_THAT(shard_error(l1, val),
               ContainsSubstring("has llm.c's LLaMA-3 magic number 20240801 but header "
                        "version 1; llm.c writes version 7 with it (uint32 ids)"));
    const std::string negative =
        write_llmc(dir + "/negative.bin", run_of(0, 50), kGpt2Magic, 1, 2, -5);
    CHECK_THAT(shard_error(negative, val),
               ContainsSubstring("'" + negative + "': its header's token count is -5 (negative"));

    // The file's size against the header.
    const std::string truncated =
        write_llmc(dir + "/truncated.bin", run_of(0, 100), kGpt2Magic, 1, 2, kCountOfIds, 20);
    CHECK_THAT(shard_error(truncated, val),
               ContainsSubstring("'" + truncated +
                        "': its header (GPT-2, version 1) says 100 tokens of 2 "
                        "bytes, so the file should be 1024 + 100 x 2 = 1224 bytes, but it is 1204 "
                        "bytes (20 bytes missing: truncated, or a header claiming more tokens than "
                        "the file holds)"));
    const std::string claims =
        write_llmc(dir + "/claims.bin", run_of(0, 50), kGpt2Magic, 1, 2, 1000);
    CHECK_THAT(shard_error(claims, val),
               ContainsSubstring("says 1000 tokens of 2 bytes, so the file should be 1024 + 1000 x 2 = 3024 "
                        "bytes, but it is 1124 bytes (1900 bytes missing"));
    const std::string extra = write_llmc(dir + "/extra.bin", run_of(0, 50), kGpt2Magic, 1, 2, 40);
    CHECK_THAT(shard_error(extra, val), ContainsSubstring("(20 bytes more than the header says)"));
    const std::string wide = write_llmc(dir + "/wide.bin", run_of(0, 50), kLlama3Magic, 7, 2);
    CHECK_THAT(shard_error(wide, val),
               ContainsSubstring("says 50 tokens of 4 bytes, so the file should be 1024 + "
                        "50 x 4 = 1224 bytes, but it is 1124 bytes"));

    // Too short for one window of block_size + 1.
    const std::string short_shard = write_llmc(dir + "/short.bin", run_of(0, 8));
    CHECK_THAT(shard_error(good, short_shard),
               ContainsSubstring("'" + short_shard +
                        "' holds 8 tokens, fewer than one window of "
                        "block_size + 1 = 9"));
    CHECK(shard_error(good, short_shard, TokenFormat::llmc, 0, 7).empty());
    const std::string empty_header = write_llmc(dir + "/empty.bin", {});
    CHECK_THAT(shard_error(empty_header, val), ContainsSubstring("holds 0 tokens, fewer than one window"));

    // The patterns.
    CHECK_THAT(shard_error(dir + "/nothing_*.bin", val),
               ContainsSubstring("[data] no file matches data.path '" + dir + "/nothing_*.bin'"));
    CHECK_THAT(
        shard_error(good, dir + "/no_val.bin"),
        ContainsSubstring("[data] cannot read '" + dir + "/no_val.bin' (data.val_path): no such file"));
    CHECK_THAT(shard_error(dir, val), ContainsSubstring("'" + dir + "' (data.path '" + dir +
                                               "') is a directory: data.path takes "
                                               "shard files, as a file or a glob pattern, e.g. " +
                                               dir + "/*train*.bin for data.path and " + dir +
                                               "/*val*.bin for data.val_path"));
    fs::create_directories(dir + "/sub_dir");
    CHECK_THAT(shard_error(dir + "/sub*", val),
               ContainsSubstring("'" + dir + "/sub_dir' (data.path '" + dir + "/sub*') is a directory"));
    CHECK_THAT(shard_error("", val), ContainsSubstring("[data] data.path is empty"));
    fs::create_directories(dir + "/both");  // the validation file matches the training pattern
    write_llmc(dir + "/both/fineweb_train_000001.bin", run_of(0, 50));
    const std::string both = write_llmc(dir + "/both/fineweb_val_000000.bin", run_of(0, 50));
    CHECK_THAT(shard_error(dir + "/both/*.bin", both),
               ContainsSubstring("'" + both + "' is both a training shard (data.path '" + dir +
                        "/both/*.bin') and a validation shard (data.val_path '" + both +
                        "'): give each split its own files"));

    // All shards of one kind.
    const std::string llama = write_llama3(dir + "/llama.bin", run_of(0, 50));
    CHECK_THAT(shard_error(good, llama),
               ContainsSubstring("'" + llama + "' is an llm.c shard of version 7 but '" + good +
                        "' is of version 1: the shards of a run must hold the same kind of ids"));

    // nanoGPT's layout.
    const std::string odd = dir + "/odd.bin";
    std::ofstream(odd, std::ios::binary) << std::string(101, '\0');
    CHECK_THAT(shard_error(odd, val, TokenFormat::raw_uint16),
               ContainsSubstring("'" + odd +
                        "' is 101 bytes, not a whole number of 2-byte ids "
                        "(data.format: raw_uint16"));
    CHECK_THAT(shard_error(good, val, TokenFormat::raw_uint16),
               ContainsSubstring("'" + good +
                        "' starts with llm.c's magic number 20240520: it is an llm.c "
                        "shard, which data.format: llmc reads"));
    CHECK_THAT(shard_error(write_raw(dir + "/raw_short.bin", run_of(0, 5)), nanogpt,
                           TokenFormat::raw_uint16),
               ContainsSubstring("holds 5 tokens, fewer than one window"));

    // Ids outside the vocabulary: found by the batch that reads them, with the file and place.
    std::vector<std::uint32_t> ids = run_of(0, 9);
    ids[5] = 50300;
    const std::string bad = write_llmc(dir + "/bad_id.bin", ids);  // one window: it is drawn
    ShardData bad_data(bad, val, TokenFormat::llmc, 0, 8);
    Generator gen(1);
    CHECK(shard_error(bad, val).empty());  // opening does not read the ids
    REQUIRE_THROWS_WITH(bad_data.batch(Split::train, 1, gen, Device::cpu),
                        ContainsSubstring("[data] '" + bad +
                                 "' holds token id 50300 (token 5 of the file), "
                                 "outside the vocabulary [0, 50257) (tokens: gpt2 50257; "
                                 "data.vocab_size sets the size, 0: the format's)"));
    ShardData small_vocab(good, val, TokenFormat::llmc, 40, 8);  // ids 0 .. 49 against 40
    bool threw = false;
    for (int i = 0; i < 20 && !threw; ++i) {
        try {
            small_vocab.batch(Split::train, 8, gen, Device::cpu);
        } catch (const Error& e) {
            threw = true;
            CHECK_THAT(std::string(e.what()),
                       ContainsSubstring("outside the vocabulary [0, 40) (tokens: gpt2 40"));
        }
    }
    CHECK(threw);

    // The config: shards need both patterns; the format is one of two.
    auto config_error = [](const std::vector<std::string>& overrides) {
        try {
            parse_config("data: {kind: shards}\n", "x.yaml", overrides);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK_THAT(config_error({}),
               ContainsSubstring("data.path: data.kind is shards, so data.path must name the "
                        "training shards") &&
                   ContainsSubstring("data.val_path: data.kind is shards, so data.val_path "
                            "must name the validation shards"));
    CHECK_THAT(config_error({"data.path=a.bin", "data.val_path=b.bin", "data.format=npy"}),
               ContainsSubstring("data.format: must be one of llmc, raw_uint16, got \"npy\""));
    CHECK_THAT(config_error({"data.path=a.bin", "data.val_path=b.bin", "data.vocab_size=-1"}),
               ContainsSubstring("data.vocab_size: must be >= 0"));
    CHECK(config_error({"data.path=a.bin", "data.val_path=b.bin"}).empty());
    CHECK_THAT(config_error({"data.kind=tokens"}),
               ContainsSubstring("must be one of addition, text, shards, random_tokens"));
}

TEST_CASE("a FIFO as a token shard is refused at once, not waited on", "[token_data][errors]") {
    const std::string fifo = "/tmp/fg_test_shard.fifo";
    ::unlink(fifo.c_str());
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    REQUIRE_THROWS_WITH(ShardData(fifo, fifo, TokenFormat::raw_uint16, 0, 8),
                        ContainsSubstring("'" + fifo + "' is not a regular file (a FIFO, socket or device)"));
}

TEST_CASE("random tokens: uniform ids from the seed, no files", "[token_data]") {
    RandomTokenData data(100, 16);
    CHECK(data.sequence_length() == 16);
    CHECK(data.vocab().chars() == "tokens: random 100\n");
    CHECK(RandomTokenData(0, 4).vocab().size() == 50257);  // 0: GPT-2's
    Generator a(5), b(5), c(6);
    const Batch ba = data.batch(Split::train, 64, a, Device::cpu);
    const Batch bb = data.batch(Split::train, 64, b, Device::cpu);
    REQUIRE(ba.inputs.shape() == Shape{64, 16});
    CHECK(ids_of(ba.inputs) == ids_of(bb.inputs));
    CHECK(ids_of(ba.targets) == ids_of(bb.targets));
    CHECK(ids_of(ba.inputs) != ids_of(data.batch(Split::train, 64, c, Device::cpu).inputs));
    CHECK(ids_of(ba.inputs) !=
          ids_of(data.batch(Split::train, 64, a, Device::cpu).inputs));  // moved on
    Generator v(5);
    CHECK(ids_of(ba.inputs) != ids_of(data.batch(Split::val, 64, v, Device::cpu).inputs));
    // Shifted by one, in range, about uniform (64 x 17 ids: the mean of [0, 100) is 49.5).
    const std::vector<std::int32_t> x = ids_of(ba.inputs), y = ids_of(ba.targets);
    double sum = 0.0;
    std::set<std::int32_t> seen;
    for (std::int64_t r = 0; r < 64; ++r)
        for (std::int64_t i = 0; i < 16; ++i) {
            const std::int32_t id = x[r * 16 + i];
            REQUIRE((id >= 0 && id < 100));
            if (i > 0) REQUIRE(id == y[r * 16 + i - 1]);
            sum += id;
            seen.insert(id);
        }
    CHECK(std::abs(sum / (64 * 16) - 49.5) < 3.0);
    CHECK(seen.size() == 100);
}

TEST_CASE("the token vocabulary: vocab.txt, prompts as ids, decode", "[token_data]") {
    const Vocab v = Vocab::tokens("gpt2", 50257);
    CHECK(v.is_tokens());
    CHECK(v.size() == 50257);
    CHECK(v.chars() == "tokens: gpt2 50257\n");
    CHECK(v.encode("50256 464, 3290\n") == std::vector<std::int32_t>{50256, 464, 3290});
    CHECK(v.decode({50256, 464, 3290}) == "50256 464 3290");
    CHECK(v.encode(v.decode({1, 2, 3})) == std::vector<std::int32_t>{1, 2, 3});
    CHECK_THROWS_WITH(v.encode("Hello world", "prompt"),
                      ContainsSubstring("[data] prompt 'Hello' at position 0 is not a token id: this "
                               "vocabulary is 50257 ids of a tokenizer fusegrad does not have "
                               "(tokens: gpt2 50257), so give ids separated by spaces"));
    CHECK_THROWS_WITH(v.encode("1 50257", "prompt"),
                      ContainsSubstring("[data] prompt token id 50257 at position 2 is outside [0, 50257)"));
    CHECK_THROWS_WITH(v.encode("12x", "prompt"), ContainsSubstring("'12x' at position 0 is not a token id"));
    CHECK_THROWS_WITH(v.encode("  ", "prompt"), ContainsSubstring("[data] prompt holds no token ids"));
    CHECK_THROWS_WITH(v.decode({50257}), ContainsSubstring("token id 50257 is outside [0, 50257)"));
    // vocab.txt reads back into the same vocabulary, of either kind.
    CHECK(Vocab::parse(v.chars()).chars() == v.chars());
    CHECK(Vocab::parse(v.chars()).is_tokens());
    CHECK(Vocab::parse("+0123456789=").size() == 12);
    CHECK_FALSE(Vocab::parse("+0123456789=").is_tokens());
    CHECK_THROWS_WITH(Vocab::parse("tokens: gpt2\n"), ContainsSubstring("is not 'tokens: NAME SIZE'"));
    CHECK_THROWS_WITH(Vocab::parse("tokens: gpt2 50257 extra\n"),
                      ContainsSubstring("is not 'tokens: NAME SIZE'"));
    CHECK_THROWS_WITH(Vocab::parse("tokens: gpt2 50257"),
                      ContainsSubstring("is not exactly 'tokens: gpt2 50257' and a newline"));
    CHECK_THROWS_WITH(Vocab::tokens("gpt2", 0), ContainsSubstring("must be in [1, 2^31 - 1]"));
}

TEST_CASE("training on random tokens: three steps, resume, eval, sample", "[token_data][trainer]") {
    auto make = [](const std::string& dir) { return tiny_token_run(dir, 3, {}); };
    REQUIRE(test::require_resume_repeats(make, "/tmp/fg_tokens_full", "/tmp/fg_tokens_split", 2) ==
            3);
    CHECK(read_text("/tmp/fg_tokens_full/vocab.txt") == "tokens: random 64\n");
    // eval and sample as the CLI does them: the run read back, its data made again.
    LoadedModel run = load_run("/tmp/fg_tokens_full", false, Device::cpu);
    CHECK(run.vocab.chars() == "tokens: random 64\n");
    std::unique_ptr<Dataset> data = make_dataset(run.config);
    CHECK(data->vocab().chars() == run.vocab.chars());
    EvalResult e = evaluate_model(*run.model, *data, run.config, Device::cpu);
    CHECK(std::isfinite(e.val_loss));
    CHECK(std::abs(e.val_loss - std::log(64.0)) < 1.0);  // random ids: about ln 64
    CHECK(e.accuracy < 0);
    std::vector<std::int32_t> prompt = run.vocab.encode("1 2 3", "prompt");
    Generator gen(0);
    Tensor out = generate(*run.model, Tensor::from_vector(prompt, {1, 3}, Device::cpu), 5, 1.0, 0,
                          gen, run.vocab.size());
    const std::string text = run.vocab.decode(out.to_vector<std::int32_t>());
    CHECK(text.rfind("1 2 3 ", 0) == 0);
    CHECK(run.vocab.encode(text).size() == 8);

    // A model smaller than the data's vocabulary is refused; so is a resume whose vocabulary
    // changed.
    std::ostringstream log;
    CHECK_THROWS_WITH(
        Trainer(tiny_token_run("/tmp/fg_tokens_small", 3, {"model.vocab_size=32"}), log),
        ContainsSubstring("model.vocab_size (32) is smaller than the data's vocabulary (64)"));
    std::ofstream("/tmp/fg_tokens_split/vocab.txt", std::ios::binary) << "tokens: random 65\n";
    CHECK_THROWS_WITH(Trainer::resume("/tmp/fg_tokens_split", {}, log),
                      ContainsSubstring("is not the one in '/tmp/fg_tokens_split/vocab.txt'"));
}

TEST_CASE("training on llm.c shards: three steps, resume, eval", "[token_data][trainer]") {
    const std::string dir = temp_dir("train");
    Generator ids_gen(9);
    for (int k = 0; k < 3; ++k) {
        std::vector<std::uint32_t> ids;
        for (std::int32_t id : ids_of(randint({200}, 50, Device::cpu, &ids_gen)))
            ids.push_back(static_cast<std::uint32_t>(id));
        write_llmc(
            dir + (k == 0 ? "/s_val_000000.bin" : "/s_train_00000" + std::to_string(k) + ".bin"),
            ids);
    }
    auto make = [&](const std::string& run_dir) {
        return tiny_token_run(
            run_dir, 3,
            {"data.kind=shards", "data.path=" + dir + "/s_train_*.bin",
             "data.val_path=" + dir + "/s_val_*.bin", "data.vocab_size=50", "model.vocab_size=64"});
    };
    REQUIRE(test::require_resume_repeats(make, "/tmp/fg_shards_full", "/tmp/fg_shards_split", 1) ==
            3);
    CHECK(read_text("/tmp/fg_shards_full/vocab.txt") == "tokens: gpt2 50\n");
    LoadedModel run = load_run("/tmp/fg_shards_full", true, Device::cpu);
    std::unique_ptr<Dataset> data = make_dataset(run.config);
    CHECK_THAT(data->describe(), ContainsSubstring("training 2 files"));
    EvalResult e = evaluate_model(*run.model, *data, run.config, Device::cpu);
    CHECK(std::isfinite(e.train_loss));
    CHECK(std::isfinite(e.val_loss));
    // The trainer logs what the data is.
    std::ostringstream log;
    fs::remove_all("/tmp/fg_shards_log");
    Trainer t(make("/tmp/fg_shards_log"), log);
    CHECK_THAT(log.str(), ContainsSubstring("data: llm.c shards (GPT-2") && ContainsSubstring("vocabulary gpt2 50"));
}

TEST_CASE("configs/gpt2_124m.yaml: GPT-2 small, trainable without a download",
          "[token_data][config]") {
    const std::string path = std::string(FG_SOURCE_DIR) + "/configs/gpt2_124m.yaml";
    const Config c = load_config(path);
    CHECK(c.model.n_layer == 12);
    CHECK(c.model.n_head == 12);
    CHECK(c.model.n_embd == 768);
    CHECK(c.model.block_size == 1024);
    CHECK(c.model.vocab_size == 50304);
    CHECK(c.model.bias);
    CHECK(c.model.dropout == 0.0);
    CHECK(c.model.norm == NormLayer::layernorm);
    CHECK(c.data.kind == DataKind::shards);
    CHECK(c.data.format == TokenFormat::llmc);
    CHECK(c.data.path == "data/fineweb10B/fineweb_train_*.bin");
    CHECK(c.data.val_path == "data/fineweb10B/fineweb_val_*.bin");
    CHECK(c.train.batch_size * c.train.grad_accum * c.model.block_size == 524288);
    CHECK(c.train.precision == Precision::bf16);
    CHECK(c.optim.lr == 6e-4);
    CHECK(c.optim.min_lr == 6e-5);
    CHECK(c.optim.warmup_steps == 700);
    CHECK(c.optim.beta2 == 0.95);
    CHECK(c.optim.weight_decay == 0.1);
    // With random tokens: no files, GPT-2's vocabulary, 1024-token sequences.
    const Config bench = load_config(path, {"data.kind=random_tokens", "train.grad_accum=1"});
    std::unique_ptr<Dataset> data = make_dataset(bench);
    CHECK(data->sequence_length() == 1024);
    CHECK(data->vocab().size() == 50257);
    const GPTConfig g = gpt_config(bench, data->vocab().size());
    CHECK(g.vocab_size == 50304);
    // The config's shape has GPT-2 small's 124M parameters (wte tied to the head; 124.5M with
    // the padded vocabulary): embeddings, 12 C^2 + 13 C a block (four weights, their biases and
    // two LayerNorms), ln_f. The memory estimate of one micro-batch of 16 x 1024 in bf16 (about
    // 10 GiB) fits an 80 GB GPU.
    const double C = static_cast<double>(g.n_embd);
    const double params = static_cast<double>(g.vocab_size + g.block_size) * C +
                          static_cast<double>(g.n_layer) * (12 * C * C + 13 * C) + 2 * C;
    CHECK(params > 124.4e6);
    CHECK(params < 124.6e6);
    const TrainingMemory need =
        estimate_training_memory(g, bench.train.batch_size, data->sequence_length(), 2);
    INFO(need.describe());
    CHECK(need.total() < 70e9);
}
