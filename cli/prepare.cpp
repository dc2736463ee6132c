// cli/prepare.cpp: see prepare.h.
#include "prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/gpt2_bpe.h"
#include "train/checkpoint.h"

namespace fg::cli {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    FG_CHECK(in.good(), "prepare", "cannot read '", path.string(), "'");
    return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The documents of the inputs, in order.
std::vector<std::string> read_documents(const PrepareOptions& o) {
    std::vector<std::string> docs;
    auto add_file = [&](const fs::path& path) {
        std::error_code ec;
        FG_CHECK(fs::is_regular_file(path, ec), "prepare", "'", path.string(),
                 "' is not a regular file");
        if (path.extension() != ".jsonl") {
            docs.push_back(read_all(path));
            return;
        }
        std::ifstream in(path, std::ios::binary);
        std::string line;
        for (std::size_t number = 1; std::getline(in, line); ++number) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
            FG_CHECK(!j.is_discarded() && j.is_object() && j.contains(o.jsonl_field) &&
                         j[o.jsonl_field].is_string(),
                     "prepare", path.string(), " line ", number, ": expected a JSON object with a ",
                     "string field '", o.jsonl_field, "' (--jsonl-field names another)");
            docs.push_back(j[o.jsonl_field].get<std::string>());
        }
    };
    for (const std::string& input : o.inputs) {
        std::error_code ec;
        if (fs::is_directory(input, ec)) {
            std::vector<fs::path> files;
            for (const auto& entry : fs::directory_iterator(input))
                if (entry.is_regular_file()) files.push_back(entry.path());
            std::sort(files.begin(), files.end());
            FG_CHECK(!files.empty(), "prepare", "the folder '", input, "' holds no files");
            for (const fs::path& f : files) add_file(f);
        } else {
            FG_CHECK(fs::exists(input, ec), "prepare", "'", input, "' does not exist");
            add_file(input);
        }
    }
    std::size_t bytes = 0;
    for (const std::string& d : docs) bytes += d.size();
    FG_CHECK(bytes > 0, "prepare", "the input holds no text");
    return docs;
}

// A shard's bytes: llm.c's 256-int32 header (magic, version, token count) then uint16 ids, or
// the ids alone (raw_uint16).
std::string shard_bytes(const std::vector<std::uint16_t>& ids, std::size_t begin, std::size_t end,
                        bool llmc) {
    std::string out;
    if (llmc) {
        std::int32_t header[256] = {20240520, 1, static_cast<std::int32_t>(end - begin)};
        out.append(reinterpret_cast<const char*>(header), sizeof header);
    }
    out.append(reinterpret_cast<const char*>(ids.data() + begin), (end - begin) * 2);
    return out;
}

}  // namespace

void check_llmc_shard_tokens(std::size_t tokens, const std::string& path) {
    FG_CHECK(tokens <= 2147483647u, "prepare", "'", path, "' would hold ", tokens,
             " tokens, more than llm.c's header can count (2^31 - 1): lower --val-share or "
             "--shard-tokens");
}

std::int64_t prepare(const PrepareOptions& o) {
    FG_CHECK(o.format == "llmc" || o.format == "raw_uint16", "prepare",
             "--format is llmc or raw_uint16, got '", o.format, "'");
    FG_CHECK(o.val_share > 0 && o.val_share < 1, "prepare", "--val-share must be in (0, 1)");
    const text::Gpt2Tokenizer bpe = text::Gpt2Tokenizer::load_installed();
    const std::vector<std::string> docs = read_documents(o);
    // o.threads threads (every core for 0) encode documents, the next one free taking the next.
    std::vector<std::vector<std::int32_t>> encoded(docs.size());
    std::atomic<std::size_t> next{0}, done{0};
    const int threads = std::max(1, o.threads > 0 ? o.threads
                                                  : static_cast<int>(std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            for (std::size_t i; (i = next++) < docs.size(); ++done) encoded[i] = bpe.encode(docs[i]);
        });
    while (o.progress && done < docs.size()) {
        std::fprintf(stderr, "\rprepare: %zu / %zu documents", done.load(), docs.size());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (std::thread& t : pool) t.join();
    if (o.progress) std::fprintf(stderr, "\rprepare: %zu / %zu documents\n", docs.size(), docs.size());
    std::vector<std::uint16_t> ids;
    for (const std::vector<std::int32_t>& doc : encoded) {
        ids.push_back(static_cast<std::uint16_t>(text::Gpt2Tokenizer::kEndOfText));
        for (std::int32_t id : doc) ids.push_back(static_cast<std::uint16_t>(id));
    }
    const std::size_t n = ids.size();
    const auto n_val = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(o.val_share * n)));
    FG_CHECK(n_val < n, "prepare", "the input is too short to split (", n, " tokens)");
    // What would be written, refused as a whole if any of it is there already.
    const bool llmc = o.format == "llmc";
    struct Shard {
        std::string path;
        std::size_t begin, end;
    };
    std::vector<Shard> shards;
    const fs::path dir(o.out_dir);
    auto name = [&](const char* split, std::size_t index) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "_%06zu", index);
        return (dir / (o.name + "_" + split + (llmc ? std::string(buf) : std::string()) + ".bin")).string();
    };
    shards.push_back({name("val", 0), n - n_val, n});
    const std::size_t per = llmc ? static_cast<std::size_t>(std::max<std::int64_t>(1, o.shard_tokens))
                                 : n;
    for (std::size_t begin = 0, index = 1; begin < n - n_val; begin += per, ++index)
        shards.push_back({name("train", index), begin, std::min(n - n_val, begin + per)});
    for (const Shard& s : shards)
        if (llmc) check_llmc_shard_tokens(s.end - s.begin, s.path);
    std::string taken;
    for (const Shard& s : shards) {
        std::error_code ec;
        if (fs::exists(fs::symlink_status(s.path, ec))) taken += (taken.empty() ? "" : ", ") + s.path;
    }
    FG_CHECK(taken.empty(), "prepare", "refusing to overwrite ", taken,
             ": choose another --out or --name, or remove them yourself");
    fs::create_directories(dir);
    for (const Shard& s : shards) {
        write_file_durably(s.path, shard_bytes(ids, s.begin, s.end, llmc), "prepare");
        std::printf("wrote %s: %zu tokens\n", s.path.c_str(), s.end - s.begin);
    }
    std::printf("prepare: %zu documents, %zu tokens (%zu for validation); train with data.kind "
                "shards, data.format %s, data.path %s, data.val_path %s\n",
                docs.size(), n, n_val, o.format.c_str(),
                llmc ? (dir / (o.name + "_train_*.bin")).string().c_str() : name("train", 1).c_str(),
                shards.front().path.c_str());
    return static_cast<std::int64_t>(n);
}

}  // namespace fg::cli
