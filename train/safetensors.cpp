// train/safetensors.cpp: see safetensors.h. The JSON header is read and written with nlohmann::json.
#include "safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "core/error.h"

namespace fg {
namespace {

// The dtypes a file may hold, by their names in its header.
const std::pair<DType, const char*> kDTypeNames[] = {
    {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::bf16, "BF16"}, {DType::f16, "F16"},
    {DType::i32, "I32"}};

const char* st_dtype(DType t) {
    for (const auto& [dtype, name] : kDTypeNames)
        if (dtype == t) return name;
    return "I32";
}

bool parse_dtype(const std::string& s, DType* t) {
    for (const auto& [dtype, name] : kDTypeNames) {
        if (s != name) continue;
        *t = dtype;
        return true;
    }
    return false;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return &t;
    return nullptr;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    std::vector<Tensor> hosts;  // the tensors' bytes, on the host
    std::size_t offset = 0;
    for (const auto& [name, t] : tensors) {
        FG_CHECK(name != "__metadata__" && !header.contains(name), "checkpoint",
                 "tensor name '", name, "' is reserved or repeated");
        hosts.push_back(t.to(Device::cpu));
        header[name] = {{"dtype", st_dtype(t.dtype())},
                        {"shape", t.shape()},
                        {"data_offsets", {offset, offset + hosts.back().nbytes()}}};
        offset += hosts.back().nbytes();
    }
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::string json = header.dump();
    json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
    std::string bytes(8, '\0');
    const std::uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<unsigned char>(n >> (8 * i)));
    bytes += json;
    for (const Tensor& h : hosts)
        if (h.nbytes() > 0) bytes.append(static_cast<const char*>(h.raw_data()), h.nbytes());
    write_file_durably(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
    std::error_code ec;
    FG_CHECK(!std::filesystem::is_directory(path, ec), "checkpoint", "'", path,
             "' is a directory, not a safetensors file");
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    FG_CHECK(in.good(), "checkpoint", "cannot read '", path, "'");
    const auto size = static_cast<std::uint64_t>(in.tellg());
    in.seekg(0);
    FG_CHECK(size >= 8, "checkpoint", "'", path, "' is truncated: ", size, " bytes, no header");
    unsigned char len[8];
    in.read(reinterpret_cast<char*>(len), 8);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len[i]) << (8 * i);
    FG_CHECK(n <= size - 8, "checkpoint", "'", path, "' is truncated or corrupt: the header claims ",
             n, " bytes, the file has ", size - 8, " after the length");
    std::string text(n, '\0');
    in.read(text.data(), static_cast<std::streamsize>(n));
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail("checkpoint", "'", path, "' has a corrupt header: ", e.what());
    }
    FG_CHECK(header.is_object(), "checkpoint", "'", path, "' has a corrupt header: not an object");
    const std::uint64_t data_start = 8 + n, data_size = size - data_start;
    // Every entry is checked before any tensor is read or allocated, so that no header, however
    // crafted, makes a file cost more memory than its own size.
    struct Entry {
        std::string name;
        DType dtype;
        Shape shape;
        std::uint64_t begin, end;
    };
    std::vector<Entry> entries;
    SafetensorsFile file;
    for (auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            for (auto& [k, v] : entry.items())
                file.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
            continue;
        }
        DType dtype;
        FG_CHECK(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                     parse_dtype(entry["dtype"].get<std::string>(), &dtype) &&
                     entry.contains("shape") && entry["shape"].is_array() &&
                     entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                     entry["data_offsets"].size() == 2,
                 "checkpoint", "'", path, "': tensor '", name, "' has a malformed entry ", entry.dump());
        Shape shape;
        std::uint64_t begin = 0, end = 0;
        try {
            shape = entry["shape"].get<Shape>();
            begin = entry["data_offsets"][0].get<std::uint64_t>();
            end = entry["data_offsets"][1].get<std::uint64_t>();
        } catch (const nlohmann::json::exception&) {
            fail("checkpoint", "'", path, "': tensor '", name, "' has a malformed entry ",
                 entry.dump());
        }
        // The element count, checked for overflow: no shape may claim more bytes than the file.
        std::uint64_t want = dtype_size(dtype);
        for (std::int64_t d : shape) {
            FG_CHECK(d >= 0, "checkpoint", "'", path, "': tensor '", name, "' has a negative dim in ",
                     entry["shape"].dump());
            FG_CHECK(d == 0 || want <= data_size / static_cast<std::uint64_t>(d), "checkpoint", "'",
                     path, "': tensor '", name, "' of shape ", entry["shape"].dump(),
                     " needs more bytes than the file's ", data_size, " (truncated file?)");
            want *= static_cast<std::uint64_t>(d);
        }
        FG_CHECK(begin <= end && end <= data_size, "checkpoint", "'", path, "': tensor '", name,
                 "' lies at bytes [", begin, ", ", end, ") but the data is ", data_size,
                 " bytes (truncated file?)");
        FG_CHECK(end - begin == want, "checkpoint", "'", path, "': tensor '", name, "' of shape ",
                 shape_str(shape), " needs ", want, " bytes, the header gives ", end - begin);
        entries.push_back({name, dtype, shape, begin, end});
    }
    // No two tensors may share bytes: with overlaps allowed, a small file could name the same
    // bytes for many large tensors.
    std::vector<const Entry*> by_offset;
    for (const Entry& e : entries)
        if (e.end > e.begin) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < by_offset.size(); ++i)
        FG_CHECK(by_offset[i - 1]->end <= by_offset[i]->begin, "checkpoint", "'", path,
                 "': tensors '", by_offset[i - 1]->name, "' [", by_offset[i - 1]->begin, ", ",
                 by_offset[i - 1]->end, ") and '", by_offset[i]->name, "' [", by_offset[i]->begin,
                 ", ", by_offset[i]->end, ") overlap (a corrupt or crafted file)");
    for (const Entry& e : entries) {
        const std::uint64_t bytes = e.end - e.begin;
        Tensor t = Tensor::empty(e.shape, e.dtype);
        in.seekg(static_cast<std::streamoff>(data_start + e.begin));
        in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes));
        FG_CHECK(in.good() || bytes == 0, "checkpoint", "'", path, "': reading tensor '", e.name,
                 "' failed");
        file.tensors.emplace_back(e.name, t);
    }
    return file;
}

}  // namespace fg
