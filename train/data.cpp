// train/data.cpp: see data.h.
#include "data.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "kernels/philox.h"

namespace fg {

CharVocab::CharVocab(const std::string& chars) : chars_(chars) {
    std::fill(std::begin(id_), std::end(id_), -1);
    for (std::size_t i = 0; i < chars_.size(); ++i) {
        auto c = static_cast<unsigned char>(chars_[i]);
        FG_CHECK(id_[c] < 0, "data", "vocabulary character ", static_cast<int>(c), " appears twice");
        id_[c] = static_cast<std::int32_t>(i);
    }
}

CharVocab CharVocab::from_text(const std::string& text) {
    bool present[256] = {};
    for (char c : text) present[static_cast<unsigned char>(c)] = true;
    std::string chars;
    for (int c = 0; c < 256; ++c)
        if (present[c]) chars.push_back(static_cast<char>(c));
    return CharVocab(chars);
}

std::vector<std::int32_t> CharVocab::encode(const std::string& text, const char* what) const {
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

std::string CharVocab::decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    for (std::int32_t id : ids) {
        FG_CHECK(id >= 0 && id < size(), "data", "token id ", id, " is outside [0, ", size(), ")");
        out.push_back(chars_[id]);
    }
    return out;
}

namespace {

std::string read_file(const std::string& path) {
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

Batch make_batch(const std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& targets,
                 std::int64_t b, std::int64_t t, Device device) {
    return Batch{Tensor::from_vector(inputs, {b, t}, device),
                 Tensor::from_vector(targets, {b, t}, device)};
}

}  // namespace

TextData::TextData(const std::string& path, double val_fraction, std::int64_t block_size)
    : vocab_(""), block_size_(block_size) {
    FG_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data", "val_fraction must be in (0, 1), got ",
             val_fraction);
    std::string text = read_file(path);
    FG_CHECK(!text.empty(), "data", "'", path, "' is empty");
    vocab_ = CharVocab::from_text(text);
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

Batch TextData::batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const {
    const std::vector<std::int32_t>& src = split == Split::train ? train_ : val_;
    const std::int64_t t = block_size_;
    std::vector<std::int32_t> x(batch_size * t), y(batch_size * t);
    for (std::int64_t r = 0; r < batch_size; ++r) {
        std::int64_t start = draw_below(gen, static_cast<std::int64_t>(src.size()) - t);
        std::copy(src.begin() + start, src.begin() + start + t, x.begin() + r * t);
        std::copy(src.begin() + start + 1, src.begin() + start + t + 1, y.begin() + r * t);
    }
    return make_batch(x, y, batch_size, t, device);
}

AdditionData::AdditionData(std::int64_t digits, double val_fraction, std::uint64_t seed)
    : digits_(digits), val_fraction_(val_fraction), seed_(seed), vocab_("+0123456789=") {
    FG_CHECK(digits >= 1 && digits <= 6, "data", "addition digits must be in [1, 6], got ", digits);
    FG_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data", "val_fraction must be in (0, 1), got ",
             val_fraction);
    limit_ = 1;
    for (std::int64_t i = 0; i < digits; ++i) limit_ *= 10;
}

bool AdditionData::held_out(std::int64_t a, std::int64_t b) const {
    // A fixed pseudo-random share of all pairs, decided by the pair alone (and the seed).
    float u = philox::uniform(seed_ ^ 0x5eed5eedULL, static_cast<std::uint64_t>(a * limit_ + b));
    return u < val_fraction_;
}

std::string AdditionData::problem(std::int64_t a, std::int64_t b) const {
    std::string s = prompt(a, b);
    std::string sum = std::to_string(a + b);
    return s + std::string(digits_ + 1 - sum.size(), '0') + sum;
}

std::string AdditionData::prompt(std::int64_t a, std::int64_t b) const {
    auto pad = [&](std::int64_t v) {
        std::string s = std::to_string(v);
        return std::string(digits_ - s.size(), '0') + s;
    };
    return pad(a) + "+" + pad(b) + "=";
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
    const std::int64_t len = 3 * digits_ + 3;  // characters of one problem
    const std::int64_t t = len - 1, answer_from = 2 * digits_ + 1;  // target index of the 1st digit
    std::vector<std::int32_t> x(batch_size * t), y(batch_size * t);
    for (std::int64_t r = 0; r < batch_size; ++r) {
        auto [a, b] = draw(split, gen);
        std::vector<std::int32_t> ids = vocab_.encode(problem(a, b));
        for (std::int64_t i = 0; i < t; ++i) {
            x[r * t + i] = ids[i];
            y[r * t + i] = i >= answer_from ? ids[i + 1] : -1;  // the loss sees the answer only
        }
    }
    return make_batch(x, y, batch_size, t, device);
}

}  // namespace fg
