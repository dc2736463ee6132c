// train/data.h: where batches come from. Both datasets give (inputs, targets) of i32 token ids,
// shape (B, T), with targets the inputs shifted by one; batches are drawn from a seeded Generator,
// so a (seed, offset) pair fixes the data order exactly (and a checkpoint can resume it).
//   CharVocab:    a character-level vocabulary (sorted distinct bytes), encode / decode.
//   TextData:     any text file; the last val_fraction held out for validation; random windows.
//   AdditionData: generated problems "ab+cd=0efg" (operands zero-padded to `digits`, the sum to
//                 digits + 1); a fixed, seeded share of all (a, b) pairs is held out and never
//                 drawn for training; the loss counts only the answer (targets before '=' are -1,
//                 the ignore index).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace fg {

class CharVocab {
public:
    explicit CharVocab(const std::string& chars);  // the distinct characters, in id order
    static CharVocab from_text(const std::string& text);
    std::int64_t size() const { return static_cast<std::int64_t>(chars_.size()); }
    const std::string& chars() const { return chars_; }
    // Throws "[data] prompt character 'Z' at position 3 is not in the vocabulary" when one is.
    std::vector<std::int32_t> encode(const std::string& text, const char* what = "text") const;
    std::string decode(const std::vector<std::int32_t>& ids) const;

private:
    std::string chars_;
    std::int32_t id_[256];
};

enum class Split { train, val };

struct Batch {
    Tensor inputs, targets;  // i32 (B, T)
};

class Dataset {
public:
    virtual ~Dataset() = default;
    virtual const CharVocab& vocab() const = 0;
    // The sequence length a batch has (for addition: fixed by the problem's length).
    virtual std::int64_t sequence_length() const = 0;
    virtual Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const = 0;
};

class TextData final : public Dataset {
public:
    // Reads `path`; throws if it is missing, empty, or too short for block_size in either split.
    TextData(const std::string& path, double val_fraction, std::int64_t block_size);
    const CharVocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return block_size_; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    std::int64_t tokens(Split split) const;

private:
    CharVocab vocab_;
    std::vector<std::int32_t> train_, val_;
    std::int64_t block_size_;
};

class AdditionData final : public Dataset {
public:
    AdditionData(std::int64_t digits, double val_fraction, std::uint64_t seed);
    const CharVocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return 3 * digits_ + 2; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    // The text of problem (a, b), e.g. "07+45=052", and its prompt (up to and including '=').
    std::string problem(std::int64_t a, std::int64_t b) const;
    std::string prompt(std::int64_t a, std::int64_t b) const;
    bool held_out(std::int64_t a, std::int64_t b) const;
    // All held-out (a, b) pairs, in order (for exact-match evaluation).
    std::vector<std::pair<std::int64_t, std::int64_t>> held_out_pairs() const;
    std::int64_t digits() const { return digits_; }

private:
    std::pair<std::int64_t, std::int64_t> draw(Split split, Generator& gen) const;
    std::int64_t digits_, limit_;
    double val_fraction_;
    std::uint64_t seed_;
    CharVocab vocab_;
};

}  // namespace fg
