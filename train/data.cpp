// train/data.cpp: see data.h.
#include "data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "kernels/philox.h"

namespace fg {

Vocab::Vocab(const std::string& chars)
    : chars_(chars), size_(static_cast<std::int64_t>(chars.size())) {
    std::fill(std::begin(id_), std::end(id_), -1);
    for (std::size_t i = 0; i < chars_.size(); ++i) {
        auto c = static_cast<unsigned char>(chars_[i]);
        FG_CHECK(id_[c] < 0, "data", "vocabulary character ", static_cast<int>(c), " appears twice");
        id_[c] = static_cast<std::int32_t>(i);
    }
}

Vocab Vocab::from_text(const std::string& text) {
    bool present[256] = {};
    for (char c : text) present[static_cast<unsigned char>(c)] = true;
    std::string chars;
    for (int c = 0; c < 256; ++c)
        if (present[c]) chars.push_back(static_cast<char>(c));
    return Vocab(chars);
}

Vocab Vocab::tokens(const std::string& name, std::int64_t size) {
    FG_CHECK(!name.empty() && name.find_first_of(" \t\n") == std::string::npos, "data",
             "a token vocabulary's name must be one word, got '", name, "'");
    FG_CHECK(size >= 1 && size <= std::numeric_limits<std::int32_t>::max(), "data",
             "a token vocabulary's size must be in [1, 2^31 - 1] (i32 ids), got ", size);
    Vocab v("");
    v.tokens_ = true;
    v.size_ = size;
    v.chars_ = "tokens: " + name + " " + std::to_string(size) + "\n";
    return v;
}

Vocab Vocab::parse(const std::string& saved) {
    const std::string prefix = "tokens: ";
    if (saved.compare(0, prefix.size(), prefix) != 0) return Vocab(saved);
    std::istringstream in(saved.substr(prefix.size()));
    std::string name, size_text, rest;
    in >> name >> size_text >> rest;
    std::int64_t size = 0;
    auto [end, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
    FG_CHECK(!name.empty() && rest.empty() && ec == std::errc() && !size_text.empty() &&
                 end == size_text.data() + size_text.size(),
             "data", "a saved vocabulary '", saved.substr(0, saved.find('\n')),
             "' is not 'tokens: NAME SIZE' (a damaged vocab.txt?)");
    Vocab v = tokens(name, size);
    FG_CHECK(v.chars() == saved, "data", "a saved vocabulary '", saved.substr(0, saved.find('\n')),
             "' is not exactly '", v.chars().substr(0, v.chars().size() - 1),
             "' and a newline (a damaged vocab.txt?)");
    return v;
}

std::vector<std::int32_t> Vocab::encode(const std::string& text, const char* what) const {
    if (tokens_) {
        std::vector<std::int32_t> ids;
        const char* separators = " ,\t\n";
        std::size_t i = text.find_first_not_of(separators);
        while (i != std::string::npos) {  // an id is text[i, j)
            const std::size_t j = std::min(text.find_first_of(separators, i), text.size());
            std::int64_t id = -1;
            auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, id);
            if (ec != std::errc() || end != text.data() + j || id < 0)
                fail("data", what, " '", text.substr(i, j - i), "' at position ", i,
                     " is not a token id: this vocabulary is ", size_, " ids of a tokenizer "
                     "fusegrad does not have (", chars_.substr(0, chars_.size() - 1),
                     "), so give ids separated by spaces, e.g. \"0 1 2\"");
            FG_CHECK(id < size_, "data", what, " token id ", id, " at position ", i,
                     " is outside [0, ", size_, ")");
            ids.push_back(static_cast<std::int32_t>(id));
            i = text.find_first_not_of(separators, j);
        }
        FG_CHECK(!ids.empty(), "data", what, " holds no token ids");
        return ids;
    }
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        std::int32_t id = id_[static_cast<unsigned char>(text[i])];
        if (id < 0) {
            std::string shown = text[i] == '\n' ? "\\n" : std::string(1, text[i]);
            fail("data", what, " character '", shown, "' at position ", i,
                 " is not in the vocabulary");
        }
        ids[i] = id;
    }
    return ids;
}

std::string Vocab::decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    for (std::int32_t id : ids) {
        FG_CHECK(id >= 0 && id < size(), "data", "token id ", id, " is outside [0, ", size(), ")");
        if (tokens_) out += (out.empty() ? "" : " ") + std::to_string(id);
        else out.push_back(chars_[id]);
    }
    return out;
}

namespace {

std::string read_file(const std::string& path) {
    // Only a regular file: a FIFO or a device would block the open or never end.
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    FG_CHECK(!fs::exists(st) || fs::is_regular_file(st), "data", "'", path, "' is ",
             fs::is_directory(st) ? "a directory" : "not a regular file (a FIFO, socket or device)",
             ": data.path must name a file");
    std::ifstream in(path, std::ios::binary);
    FG_CHECK(in.good(), "data", "cannot read '", path, "' (does the file exist?)");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// A uniform integer in [0, n) from one Philox draw.
std::int64_t draw_below(Generator& gen, std::int64_t n) {
    std::uint64_t counter = gen.advance(1);
    philox::Words w = philox::philox4x32_10(gen.seed(), counter);
    std::uint64_t bits = (static_cast<std::uint64_t>(w.w[0]) << 32) | w.w[1];
    return static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(n));
}

// v in decimal, zero-padded to `width` digits.
std::string zero_padded(std::int64_t v, std::int64_t width) {
    const std::string s = std::to_string(v);
    return std::string(width - s.size(), '0') + s;
}

// A batch of `b` rows, each a window of t + 1 ids that fill(window) writes: the inputs are its
// first t ids, the targets its last t, of which the first `ignored` are -1 (no loss there).
template <typename Fill>
Batch window_batch(std::int64_t b, std::int64_t t, Device device, Fill fill,
                   std::int64_t ignored = 0) {
    std::vector<std::int32_t> x(b * t), y(b * t), window(t + 1);
    for (std::int64_t r = 0; r < b; ++r) {
        fill(window.data());
        std::copy(window.begin(), window.end() - 1, x.begin() + r * t);
        std::copy(window.begin() + 1, window.end(), y.begin() + r * t);
        std::fill_n(y.begin() + r * t, ignored, -1);
    }
    Batch batch;
    batch.inputs = Tensor::from_vector(x, {b, t}, device);
    batch.targets = Tensor::from_vector(y, {b, t}, device);
    return batch;
}

}  // namespace

TextData::TextData(const std::string& path, double val_fraction, std::int64_t block_size)
    : path_(path), vocab_(""), block_size_(block_size) {
    FG_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data", "val_fraction must be in (0, 1), got ",
             val_fraction);
    std::string text = read_file(path);
    FG_CHECK(!text.empty(), "data", "'", path, "' is empty");
    vocab_ = Vocab::from_text(text);
    std::vector<std::int32_t> ids = vocab_.encode(text);
    auto n = static_cast<std::int64_t>(ids.size());
    auto n_val = static_cast<std::int64_t>(static_cast<double>(n) * val_fraction);
    std::int64_t need = block_size + 1;
    FG_CHECK(n - n_val >= need && n_val >= need, "data", "'", path, "' has ", n,
             " characters: with val_fraction ", val_fraction, " the splits get ", n - n_val,
             " and ", n_val, ", and each needs at least block_size + 1 = ", need);
    train_.assign(ids.begin(), ids.end() - n_val);
    val_.assign(ids.end() - n_val, ids.end());
}

std::int64_t TextData::tokens(Split split) const {
    return static_cast<std::int64_t>(split == Split::train ? train_.size() : val_.size());
}

std::string TextData::describe() const {
    return "text '" + path_ + "': " + std::to_string(train_.size()) + " characters for training, " +
           std::to_string(val_.size()) + " for validation, vocabulary " +
           std::to_string(vocab_.size()) + " characters";
}

Batch TextData::batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const {
    const std::vector<std::int32_t>& src = split == Split::train ? train_ : val_;
    const std::int64_t t = block_size_;
    return window_batch(batch_size, t, device, [&](std::int32_t* window) {
        const std::int64_t start = draw_below(gen, static_cast<std::int64_t>(src.size()) - t);
        std::copy(src.begin() + start, src.begin() + start + t + 1, window);
    });
}

AdditionData::AdditionData(std::int64_t digits, double val_fraction, std::uint64_t seed)
    : digits_(digits), val_fraction_(val_fraction), seed_(seed), vocab_("+0123456789=") {
    FG_CHECK(digits >= 1 && digits <= 6, "data", "addition digits must be in [1, 6], got ", digits);
    FG_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data", "val_fraction must be in (0, 1), got ",
             val_fraction);
    limit_ = 1;
    for (std::int64_t i = 0; i < digits; ++i) limit_ *= 10;
}

std::string AdditionData::describe() const {
    std::ostringstream out;
    out << "addition of " << digits_ << "-digit numbers (" << val_fraction_
        << " of all problems held out), vocabulary " << vocab_.size() << " characters";
    return out.str();
}

bool AdditionData::held_out(std::int64_t a, std::int64_t b) const {
    // A fixed pseudo-random share of all pairs, decided by the pair alone (and the seed).
    float u = philox::uniform(seed_ ^ 0x5eed5eedULL, static_cast<std::uint64_t>(a * limit_ + b));
    return u < val_fraction_;
}

std::string AdditionData::problem(std::int64_t a, std::int64_t b) const {
    return prompt(a, b) + zero_padded(a + b, digits_ + 1);
}

std::string AdditionData::prompt(std::int64_t a, std::int64_t b) const {
    return zero_padded(a, digits_) + "+" + zero_padded(b, digits_) + "=";
}

std::vector<std::pair<std::int64_t, std::int64_t>> AdditionData::held_out_pairs() const {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (std::int64_t a = 0; a < limit_; ++a)
        for (std::int64_t b = 0; b < limit_; ++b)
            if (held_out(a, b)) out.emplace_back(a, b);
    return out;
}

std::pair<std::int64_t, std::int64_t> AdditionData::draw(Split split, Generator& gen) const {
    for (;;) {  // rejection: a pair from the requested side of the split
        std::int64_t a = draw_below(gen, limit_), b = draw_below(gen, limit_);
        if (held_out(a, b) == (split == Split::val)) return {a, b};
    }
}

Batch AdditionData::batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const {
    // A window is one problem's 3 * digits + 3 characters. The loss sees the answer only: the
    // targets before index 2 * digits + 1 (the sum's first digit) are ignored.
    const auto write_problem = [&](std::int32_t* window) {
        const auto [a, b] = draw(split, gen);
        const std::vector<std::int32_t> ids = vocab_.encode(problem(a, b));
        std::copy(ids.begin(), ids.end(), window);
    };
    return window_batch(batch_size, sequence_length(), device, write_problem, 2 * digits_ + 1);
}

// ---- token files -------------------------------------------------------------------------------

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards are little-endian and are read in place");

MappedFile::MappedFile(const std::string& path) {
    // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    FG_CHECK(fd >= 0, "data", "cannot open '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int e = errno;
        const bool dir = S_ISDIR(st.st_mode), other = !S_ISREG(st.st_mode);
        ::close(fd);
        FG_CHECK(!dir, "data", "'", path, "' is a directory, not a file");
        FG_CHECK(!other, "data", "'", path, "' is not a regular file (a FIFO, socket or device)");
        fail("data", "cannot read '", path, "': ", std::strerror(e));
    }
    size_ = static_cast<std::int64_t>(st.st_size);
    if (size_ == 0) {  // mmap refuses a length of 0: an empty file maps to nothing
        ::close(fd);
        return;
    }
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file
    FG_CHECK(p != MAP_FAILED, "data", "cannot map '", path, "' into memory: ", std::strerror(e));
    // Batches read short windows at random places: no read-ahead of the pages around them.
    ::madvise(p, static_cast<std::size_t>(size_), MADV_RANDOM);
    data_ = static_cast<const unsigned char*>(p);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<std::size_t>(size_));
}

namespace {

// llm.c's two shard headers (dev/data/data_common.py, HEADERS_INFO): (magic, version).
constexpr std::int32_t kLlmcMagic = 20240520, kLlmcVersion = 1;                 // GPT-2, uint16
constexpr std::int32_t kLlmcLlama3Magic = 20240801, kLlmcLlama3Version = 7;     // LLaMA-3, uint32
constexpr std::int64_t kLlmcHeaderBytes = 256 * 4;
constexpr std::int64_t kGpt2Vocab = 50257, kLlama3Vocab = 128256;

// 9.9B, 100.0M, 12.3k, 999: a token count for the log.
std::string count_text(std::int64_t n) {
    char buf[32];
    if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
    else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
    else if (n >= 10000) std::snprintf(buf, sizeof buf, "%.1fk", static_cast<double>(n) / 1e3);
    else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
    return buf;
}

// The files `pattern` names (`key`: the config key it came from, for the messages): the file
// itself, or a glob's matches in sorted order. Directories are refused, not searched: which of
// their files are for training is for the pattern to say.
std::vector<std::string> shard_paths(const std::string& pattern, const char* key) {
    namespace fs = std::filesystem;
    const bool train = std::strcmp(key, "data.path") == 0;
    FG_CHECK(!pattern.empty(), "data", key, " is empty: give the ",
             train ? "training" : "validation", " shards as a file or a glob pattern such as "
             "data/fineweb10B/fineweb_", train ? "train" : "val", "_*.bin");
    std::error_code ec;
    auto refuse_directory = [&](const std::string& path) {
        if (!fs::is_directory(path, ec)) return;
        std::string dir = path;
        while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
        fail("data", "'", path, "' (", key, " '", pattern, "') is a directory: ", key,
             " takes shard files, as a file or a glob pattern, e.g. ", dir,
             "/*train*.bin for data.path and ", dir, "/*val*.bin for data.val_path");
    };
    if (pattern.find_first_of("*?[") == std::string::npos) {
        refuse_directory(pattern);
        FG_CHECK(fs::exists(pattern, ec), "data", "cannot read '", pattern, "' (", key,
                 "): no such file");
        return {pattern};
    }
    glob_t found{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &found);
    std::vector<std::string> paths;
    if (rc == 0)
        for (std::size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i]);
    ::globfree(&found);
    FG_CHECK(rc != GLOB_NOMATCH, "data", "no file matches ", key, " '", pattern, "'");
    FG_CHECK(rc == 0, "data", "cannot search for ", key, " '", pattern, "' (glob error ", rc, ")");
    for (const std::string& path : paths) refuse_directory(path);
    return paths;
}

std::uint32_t load_id(const unsigned char* ids, std::int64_t i, int token_bytes) {
    if (token_bytes == 2) {
        std::uint16_t v;
        std::memcpy(&v, ids + 2 * i, 2);
        return v;
    }
    std::uint32_t v;
    std::memcpy(&v, ids + 4 * i, 4);
    return v;
}

}  // namespace

ShardData::ShardData(const std::string& train_pattern, const std::string& val_pattern,
                     TokenFormat format, std::int64_t vocab_size, std::int64_t block_size)
    : format_(format), block_size_(block_size) {
    FG_CHECK(block_size >= 1, "data", "block_size must be >= 1, got ", block_size);
    FG_CHECK(vocab_size >= 0, "data", "data.vocab_size must be >= 0, got ", vocab_size);
    std::string first_path;  // the file that set version_
    auto open = [&](const std::string& path) {
        Shard sh{path, MappedFile(path)};
        const std::int64_t size = sh.file.size();
        int version = 0;
        if (format == TokenFormat::llmc) {
            FG_CHECK(size >= kLlmcHeaderBytes, "data", "'", path, "' is ", size,
                     " bytes, shorter than the 1024-byte header of llm.c's shards (data.format: "
                     "llmc); nanoGPT's train.bin / val.bin have no header: data.format: "
                     "raw_uint16 reads them");
            std::int32_t header[3];
            std::memcpy(header, sh.file.data(), sizeof header);
            const bool gpt2 = header[0] == kLlmcMagic, llama3 = header[0] == kLlmcLlama3Magic;
            FG_CHECK(gpt2 || llama3, "data", "'", path, "' does not start with one of llm.c's "
                     "magic numbers, ", kLlmcMagic, " (GPT-2, uint16 ids) or ", kLlmcLlama3Magic,
                     " (LLaMA-3, uint32 ids): its first int32 is ", header[0], "; not an llm.c "
                     "shard (data.format: llmc); nanoGPT's train.bin / val.bin (uint16 ids, no "
                     "header) need data.format: raw_uint16");
            const std::int32_t expected_version = gpt2 ? kLlmcVersion : kLlmcLlama3Version;
            FG_CHECK(header[1] == expected_version, "data", "'", path, "' has llm.c's ",
                     gpt2 ? "GPT-2" : "LLaMA-3", " magic number ", header[0],
                     " but header version ", header[1], "; llm.c writes version ",
                     expected_version, " with it (", gpt2 ? "uint16" : "uint32",
                     " ids), and fusegrad reads no other");
            FG_CHECK(header[2] >= 0, "data", "'", path, "': its header's token count is ",
                     header[2], " (negative: a damaged header)");
            version = header[1];
            const int bytes = gpt2 ? 2 : 4;
            const std::int64_t n = header[2], expected = kLlmcHeaderBytes + n * bytes;
            if (size != expected) {
                std::ostringstream why;
                if (size < expected)
                    why << expected - size << " bytes missing: truncated, or a header claiming "
                        << "more tokens than the file holds";
                else
                    why << size - expected << " bytes more than the header says";
                fail("data", "'", path, "': its header (", gpt2 ? "GPT-2" : "LLaMA-3",
                     ", version ", version, ") says ", n, " tokens of ", bytes,
                     " bytes, so the file should be 1024 + ", n, " x ", bytes, " = ", expected,
                     " bytes, but it is ", size, " bytes (", why.str(), ")");
            }
            sh.ids = sh.file.data() + kLlmcHeaderBytes;
            sh.n_tokens = n;
        } else {
            FG_CHECK(size % 2 == 0, "data", "'", path, "' is ", size, " bytes, not a whole "
                     "number of 2-byte ids (data.format: raw_uint16, uint16 ids with no header)");
            std::int32_t first = 0;
            if (size >= 4) std::memcpy(&first, sh.file.data(), 4);
            FG_CHECK(first != kLlmcMagic && first != kLlmcLlama3Magic, "data", "'", path,
                     "' starts with llm.c's magic number ", first, ": it is an llm.c shard, "
                     "which data.format: llmc reads (raw_uint16 would take its 1024-byte header "
                     "for tokens)");
            sh.ids = sh.file.data();
            sh.n_tokens = size / 2;
        }
        if (first_path.empty()) {
            version_ = version;
            token_bytes_ = version == kLlmcLlama3Version ? 4 : 2;
            first_path = path;
        }
        FG_CHECK(version == version_, "data", "'", path, "' is an llm.c shard of version ",
                 version, " but '", first_path, "' is of version ", version_, ": the shards of a "
                 "run must hold the same kind of ids (version 1: GPT-2, uint16; version 7: "
                 "LLaMA-3, uint32)");
        return sh;
    };
    auto load = [&](Files& files, const std::string& pattern, const char* key) {
        files.pattern = pattern;
        for (const std::string& path : shard_paths(pattern, key)) {
            files.shards.push_back(open(path));
            const std::int64_t n = files.shards.back().n_tokens;
            files.tokens += n;
            // A file shorter than one window (a short last shard, say) gives none.
            files.window_ends.push_back((files.window_ends.empty() ? 0 : files.window_ends.back()) +
                                        std::max<std::int64_t>(0, n - block_size));
        }
        const Shard& first = files.shards.front();
        FG_CHECK(files.window_ends.back() > 0, "data", "'", first.path, "' holds ", first.n_tokens,
                 " tokens, fewer than one window of block_size + 1 = ", block_size + 1,
                 " (inputs and the targets shifted by one)",
                 files.shards.size() > 1 ? ", and so do the other files of " + std::string(key)
                                         : std::string());
    };
    load(train_, train_pattern, "data.path");
    load(val_, val_pattern, "data.val_path");
    // A file in both splits would make the validation loss measure memorisation.
    std::set<std::string> train_files;
    for (const Shard& sh : train_.shards)
        train_files.insert(std::filesystem::weakly_canonical(sh.path).string());
    for (const Shard& sh : val_.shards)
        FG_CHECK(!train_files.count(std::filesystem::weakly_canonical(sh.path).string()), "data",
                 "'", sh.path, "' is both a training shard (data.path '", train_pattern,
                 "') and a validation shard (data.val_path '", val_pattern,
                 "'): give each split its own files");
    const bool llama3 = version_ == kLlmcLlama3Version;
    const char* name = version_ == kLlmcVersion ? "gpt2" : llama3 ? "llama3" : "uint16";
    const std::int64_t size = vocab_size ? vocab_size : llama3 ? kLlama3Vocab : kGpt2Vocab;
    vocab_ = Vocab::tokens(name, size);
}

std::int64_t ShardData::tokens(Split s) const { return split(s).tokens; }

std::vector<std::string> ShardData::files(Split s) const {
    std::vector<std::string> out;
    for (const Shard& sh : split(s).shards) out.push_back(sh.path);
    return out;
}

std::string ShardData::describe() const {
    std::ostringstream out;
    if (format_ == TokenFormat::llmc)
        out << "llm.c shards ("
            << (version_ == kLlmcVersion ? "GPT-2: magic 20240520, version 1, uint16 ids"
                                          : "LLaMA-3: magic 20240801, version 7, uint32 ids")
            << ")";
    else
        out << "raw uint16 token files (nanoGPT's)";
    for (Split s : {Split::train, Split::val}) {
        const Files& f = split(s);
        out << (s == Split::train ? ": training " : "; validation ") << f.shards.size()
            << (f.shards.size() == 1 ? " file" : " files") << " ('" << f.pattern << "'), "
            << count_text(f.tokens) << " tokens";
        const auto short_files = std::count_if(f.shards.begin(), f.shards.end(),
                                               [&](const Shard& sh) { return sh.n_tokens <= block_size_; });
        if (short_files) out << " (" << short_files << " shorter than one window, so never drawn)";
    }
    out << "; vocabulary " << vocab_.chars().substr(8, vocab_.chars().size() - 9)
        << " (ids checked in each batch)";
    return out.str();
}

Batch ShardData::batch(Split s, std::int64_t batch_size, Generator& gen, Device device) const {
    const Files& f = split(s);
    const std::int64_t t = block_size_, vocab = vocab_.size();
    return window_batch(batch_size, t, device, [&](std::int32_t* window) {
        // Every window of the split equally likely: one draw picks the file and the start.
        const std::int64_t w = draw_below(gen, f.window_ends.back());
        const auto k = static_cast<std::size_t>(
            std::upper_bound(f.window_ends.begin(), f.window_ends.end(), w) -
            f.window_ends.begin());
        const std::int64_t start = w - (k ? f.window_ends[k - 1] : 0);
        const Shard& sh = f.shards[k];
        for (std::int64_t j = 0; j <= t; ++j) {
            const std::uint32_t id = load_id(sh.ids, start + j, token_bytes_);
            if (id >= static_cast<std::uint64_t>(vocab))
                fail("data", "'", sh.path, "' holds token id ", id, " (token ", start + j,
                     " of the file), outside the vocabulary [0, ", vocab, ") (",
                     vocab_.chars().substr(0, vocab_.chars().size() - 1),
                     "; data.vocab_size sets the size, 0: the format's)");
            window[j] = static_cast<std::int32_t>(id);
        }
    });
}

RandomTokenData::RandomTokenData(std::int64_t vocab_size, std::int64_t block_size)
    : block_size_(block_size) {
    FG_CHECK(block_size >= 1, "data", "block_size must be >= 1, got ", block_size);
    FG_CHECK(vocab_size >= 0, "data", "data.vocab_size must be >= 0, got ", vocab_size);
    vocab_ = Vocab::tokens("random", vocab_size ? vocab_size : kGpt2Vocab);
}

std::string RandomTokenData::describe() const {
    return "random tokens (uniform ids, no files; the validation split under its own key), "
           "vocabulary " + std::to_string(vocab_.size()) + " ids";
}

Batch RandomTokenData::batch(Split s, std::int64_t batch_size, Generator& gen,
                             Device device) const {
    const std::int64_t t = block_size_, row = t + 1, n = batch_size * row;
    const auto vocab = static_cast<std::uint64_t>(vocab_.size());
    // Four ids a Philox call; the validation split under another key.
    const std::uint64_t key = gen.seed() ^ (s == Split::val ? 0x9e3779b97f4a7c15ULL : 0ULL);
    const std::uint64_t first = gen.advance(static_cast<std::uint64_t>((n + 3) / 4));
    philox::Words words{};
    std::int64_t k = 0;  // the ids drawn so far, row after row
    return window_batch(batch_size, t, device, [&](std::int32_t* window) {
        for (std::int64_t j = 0; j < row; ++j, ++k) {
            if (k % 4 == 0)
                words = philox::philox4x32_10(key, first + static_cast<std::uint64_t>(k / 4));
            // A 32-bit word scaled to [0, vocab): no division, a bias below vocab / 2^32.
            window[j] = static_cast<std::int32_t>((words.w[k % 4] * vocab) >> 32);
        }
    });
}

}  // namespace fg
