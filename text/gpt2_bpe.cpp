// text/gpt2_bpe.cpp: see gpt2_bpe.h.
#include "gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"

#define XXH_INLINE_ALL  // header-only xxHash
#include <xxhash.h>

namespace fg::text {
namespace {

// The one file this tokenizer reads: what install_deps.sh checks with sha256sum, and the same
// file's size and XXH3-64 (xxHash, already a dependency), which are checked here.
constexpr const char* kFileName = "gpt2.tiktoken";
constexpr const char* kSha256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930";
constexpr std::size_t kFileBytes = 835554;
constexpr std::uint64_t kFileXxh3 = 0x3cb2fbe95939bd2dULL;
constexpr const char* kHowToGet =
    "scripts/install_deps.sh --tokenizer installs it (from the openai-whisper 20250625 source "
    "distribution on PyPI, whisper/assets/gpt2.tiktoken), or put that file there yourself";

// GPT-2's pre-split pattern, as tiktoken writes it.
constexpr const char* kPattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Standard base64 (the tokens of a .tiktoken file); an invalid text is an error naming the line.
std::string base64_decode(std::string_view in, std::size_t line) {
    auto value = [&](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        fail("tokenizer", kFileName, " line ", line, ": '", std::string(in), "' is not base64");
    };
    std::string out;
    unsigned bits = 0;
    int count = 0;
    for (char c : in) {
        if (c == '=') break;
        bits = (bits << 6) | static_cast<unsigned>(value(c));
        if ((count += 6) >= 8) {
            count -= 8;
            out.push_back(static_cast<char>((bits >> count) & 0xFF));
        }
    }
    return out;
}

// How many bytes of `s` from the start are valid UTF-8 (as Rust's from_utf8 counts them: no
// overlong forms, no surrogates, nothing past U+10FFFF).
std::size_t valid_utf8_prefix(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        std::size_t len = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
        if (c < 0x80) len = 1;
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (i + len > s.size()) return i;
        for (std::size_t k = 1; k < len; ++k) {
            const unsigned char b = static_cast<unsigned char>(s[i + k]);
            if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
        }
        i += len;
    }
    return i;
}

// The length of the longest prefix of `s` that does not end inside a UTF-8 character: a lead byte
// in the last three bytes whose character is not complete yet is held back.
std::size_t complete_utf8_prefix(const std::string& s) {
    const std::size_t n = s.size();
    for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
        const unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

}  // namespace

struct Gpt2Tokenizer::Pattern {
    pcre2_code* code = nullptr;
    ~Pattern() { pcre2_code_free(code); }
};

Gpt2Tokenizer::Gpt2Tokenizer() = default;
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::vector<std::string> Gpt2Tokenizer::search_paths() {
    std::vector<std::string> dirs;
    if (const char* d = std::getenv("FUSEGRAD_DATA"); d && *d) dirs.push_back(d);
    if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x)
        dirs.push_back(std::string(x) + "/fusegrad");
    else if (const char* h = std::getenv("HOME"); h && *h)
        dirs.push_back(std::string(h) + "/.local/share/fusegrad");
    dirs.push_back("/usr/local/share/fusegrad");
    dirs.push_back("/usr/share/fusegrad");
    for (std::string& d : dirs) d += std::string("/") + kFileName;
    return dirs;
}

Gpt2Tokenizer Gpt2Tokenizer::load_installed() {
    std::string tried;
    for (const std::string& path : search_paths()) {
        std::error_code ec;
        if (std::filesystem::exists(path, ec)) return load(path);
        tried += (tried.empty() ? "" : ", ") + path;
    }
    fail("tokenizer", "GPT-2's vocabulary ", kFileName, " (sha256 ", kSha256, ") is not in ",
         tried, ": ", kHowToGet);
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    FG_CHECK(in.good(), "tokenizer", "cannot read '", path, "' (GPT-2's vocabulary ", kFileName,
             ", sha256 ", kSha256, "): ", kHowToGet);
    const std::string file((std::istreambuf_iterator<char>(in)), {});
    FG_CHECK(file.size() == kFileBytes && XXH3_64bits(file.data(), file.size()) == kFileXxh3,
             "tokenizer", "'", path, "' is not GPT-2's ", kFileName, " (", file.size(),
             " bytes; the file has ", kFileBytes, ", sha256 ", kSha256, "): ", kHowToGet);
    Gpt2Tokenizer t;
    t.bytes_.resize(kVocabSize);
    std::istringstream lines(file);
    std::string line;
    std::size_t number = 0;
    while (std::getline(lines, line)) {
        ++number;
        const std::size_t space = line.find(' ');
        const long rank = space == std::string::npos ? -1 : std::atol(line.c_str() + space + 1);
        FG_CHECK(rank >= 0 && rank < kEndOfText, "tokenizer", path, " line ", number,
                 ": expected 'BASE64 RANK' with a rank below ", kEndOfText);
        std::string token = base64_decode(std::string_view(line).substr(0, space), number);
        t.bytes_[static_cast<std::size_t>(rank)] = token;
        t.ranks_.emplace(std::move(token), static_cast<std::int32_t>(rank));
    }
    t.bytes_[kEndOfText] = "<|endoftext|>";
    int error = 0;
    PCRE2_SIZE offset = 0;
    t.pattern_ = std::make_unique<Pattern>();
    t.pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                                     &offset, nullptr);
    FG_CHECK(t.pattern_->code != nullptr, "tokenizer", "PCRE2 cannot compile GPT-2's pattern (",
             error, " at ", offset, ")");
    pcre2_jit_compile(t.pattern_->code, PCRE2_JIT_COMPLETE);  // an interpreter otherwise
    return t;
}

// One piece's ids: the whole piece when it is a token, else its bytes merged pair by pair, the
// adjacent pair of lowest rank first (each rank cached beside its pair, two recomputed a merge).
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
    if (auto whole = ranks_.find(std::string(piece)); whole != ranks_.end()) {
        out.push_back(whole->second);
        return;
    }
    std::vector<std::size_t> start(piece.size() + 1);  // token i is piece[start[i], start[i+1])
    for (std::size_t i = 0; i <= piece.size(); ++i) start[i] = i;
    auto pair_rank = [&](std::size_t i) -> std::int32_t {  // of tokens i and i + 1
        if (i + 2 >= start.size()) return INT_MAX;
        auto it = ranks_.find(std::string(piece.substr(start[i], start[i + 2] - start[i])));
        return it == ranks_.end() ? INT_MAX : it->second;
    };
    std::vector<std::int32_t> rank(piece.size());
    for (std::size_t i = 0; i < rank.size(); ++i) rank[i] = pair_rank(i);
    while (rank.size() > 1) {
        std::size_t best = 0;
        for (std::size_t i = 1; i + 1 < rank.size(); ++i)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT_MAX) break;
        start.erase(start.begin() + static_cast<std::ptrdiff_t>(best) + 1);
        rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best) + 1);
        rank[best] = pair_rank(best);
        if (best > 0) rank[best - 1] = pair_rank(best - 1);
    }
    for (std::size_t i = 0; i + 1 < start.size(); ++i)
        out.push_back(ranks_.at(std::string(piece.substr(start[i], start[i + 1] - start[i]))));
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
    // Text that is not valid UTF-8 is encoded as tiktoken encodes bytes: the valid prefix as
    // text; then its last piece's tokens (with the whitespace-only tokens before them) are taken
    // back, and their bytes and every byte after the prefix are merged as one piece.
    const std::size_t valid = valid_utf8_prefix(text);
    std::size_t last_piece = 0;  // tokens of the last piece encoded
    std::vector<std::int32_t> ids = encode_text(text.substr(0, valid), &last_piece);
    if (valid == text.size()) return ids;
    auto all_space = [&](std::int32_t id) {
        const std::string& b = bytes_[static_cast<std::size_t>(id)];
        return std::all_of(b.begin(), b.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t'; });
    };
    if (last_piece > 0 && all_space(ids[ids.size() - last_piece]))
        while (last_piece < ids.size() && all_space(ids[ids.size() - last_piece - 1])) ++last_piece;
    std::string tail;
    for (std::size_t i = ids.size() - last_piece; i < ids.size(); ++i)
        tail += bytes_[static_cast<std::size_t>(ids[i])];
    tail += text.substr(valid);
    ids.resize(ids.size() - last_piece);
    encode_piece(tail, ids);
    return ids;
}

std::vector<std::int32_t> Gpt2Tokenizer::encode_text(std::string_view text,
                                                     std::size_t* last_piece) const {
    std::vector<std::int32_t> ids;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t at = 0;
    while (at < text.size()) {
        const int rc = pcre2_match(pattern_->code, subject, text.size(), at, 0, match, nullptr);
        std::size_t begin = text.size(), end = text.size();
        if (rc >= 0) {
            const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
            begin = span[0];
            end = span[1];
        }
        const std::size_t before = ids.size();
        if (begin > at) encode_piece(text.substr(at, begin - at), ids);  // bytes no class takes
        if (end > begin) {
            const std::size_t piece_start = ids.size();
            encode_piece(text.substr(begin, end - begin), ids);
            *last_piece = ids.size() - piece_start;
        } else {
            *last_piece = ids.size() - before;
        }
        at = end > at ? end : at + 1;
    }
    pcre2_match_data_free(match);
    return ids;
}

const std::string& Gpt2Tokenizer::token_bytes(std::int32_t id) const {
    FG_CHECK(id >= 0 && id < kVocabSize, "tokenizer", "token id ", id, " is not one of GPT-2's (0 to ",
             kVocabSize - 1, ")");
    return bytes_[static_cast<std::size_t>(id)];
}

std::string Gpt2Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    for (std::int32_t id : ids) out += token_bytes(id);
    return out;
}

std::string Gpt2Decoder::push(std::int32_t id) {
    pending_ += tokenizer_.token_bytes(id);
    const std::size_t ready = complete_utf8_prefix(pending_);
    std::string out = pending_.substr(0, ready);
    pending_.erase(0, ready);
    return out;
}

std::string Gpt2Decoder::finish() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace fg::text
