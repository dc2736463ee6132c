// train/data.h: where batches come from. Every dataset gives (inputs, targets) of i32 token ids,
// shape (B, T), with targets the inputs shifted by one; batches are drawn from a seeded Generator,
// so a (seed, offset) pair fixes the data order exactly (and a checkpoint can resume it).
//   Vocab:           the vocabulary: characters (sorted distinct bytes), encode / decode; or a
//                    tokenizer's ids (GPT-2's BPE, say), named and written as numbers.
//   TextData:        any text file; the last val_fraction held out for validation; random windows.
//   AdditionData:    generated problems "ab+cd=efg", e.g. "07+45=052" (operands zero-padded to
//                    `digits`, the sum to digits + 1); a fixed, seeded share of all (a, b) pairs
//                    is held out and never drawn for training; the loss counts only the answer
//                    (targets before '=' are -1, the ignore index).
//   ShardData:       token files as llm.c's and nanoGPT's data scripts write them (.bin shards,
//                    memory-mapped, never read into memory), train and validation from their own
//                    files; random windows of block_size + 1 tokens.
//   RandomTokenData: uniform random ids, no files: for benchmarks and tests without a download.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.h"  // TokenFormat
#include "core/random.h"
#include "core/tensor.h"

namespace fg {

// A vocabulary of one of two kinds:
//   characters: id i is the byte chars()[i] (TextData, AdditionData);
//   tokens:     ids [0, size) of a tokenizer named in vocab.txt (token files made by GPT-2's BPE,
//               say): here a prompt is ids written as numbers ("50256 464 3290") and decode
//               writes ids the same way; the command line turns GPT-2's ids into text and back
//               with text/gpt2_bpe.h.
class Vocab {
public:
    explicit Vocab(const std::string& chars);  // the distinct characters, in id order
    static Vocab from_text(const std::string& text);
    // `size` token ids of the tokenizer (or source) `name`: "gpt2", "llama3", "uint16", "random".
    static Vocab tokens(const std::string& name, std::int64_t size);
    // The vocabulary that chars() wrote (a run's vocab.txt): "tokens: NAME SIZE\n" or characters
    // (which never start so: from_text sorts them, and ' ' < ':' < 't').
    static Vocab parse(const std::string& saved);
    std::int64_t size() const { return size_; }
    bool is_tokens() const { return tokens_; }
    // What vocab.txt holds and what a resume compares: the characters in id order, or for tokens
    // the line "tokens: NAME SIZE\n" (e.g. "tokens: gpt2 50257\n").
    const std::string& chars() const { return chars_; }
    // Characters: throws "[data] prompt character 'Z' at position 3 is not in the vocabulary".
    // Tokens: ids separated by spaces or commas, each in [0, size).
    std::vector<std::int32_t> encode(const std::string& text, const char* what = "text") const;
    // Characters: the text. Tokens: the ids separated by spaces (what encode reads back).
    std::string decode(const std::vector<std::int32_t>& ids) const;

private:
    std::string chars_;
    std::int64_t size_ = 0;
    bool tokens_ = false;
    std::int32_t id_[256];
};

enum class Split { train, val };

struct Batch {
    Tensor inputs, targets;  // i32 (B, T)
};

class Dataset {
public:
    virtual ~Dataset() = default;
    virtual const Vocab& vocab() const = 0;
    // The sequence length a batch has (for addition: fixed by the problem's length).
    virtual std::int64_t sequence_length() const = 0;
    virtual Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const = 0;
    // One line for the log: what the data is, how many tokens, the vocabulary.
    virtual std::string describe() const = 0;
};

class TextData final : public Dataset {
public:
    // Reads `path`; throws if it is missing, empty, or too short for block_size in either split.
    TextData(const std::string& path, double val_fraction, std::int64_t block_size);
    const Vocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return block_size_; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    std::string describe() const override;
    std::int64_t tokens(Split split) const;

private:
    std::string path_;
    Vocab vocab_;
    std::vector<std::int32_t> train_, val_;
    std::int64_t block_size_;
};

class AdditionData final : public Dataset {
public:
    AdditionData(std::int64_t digits, double val_fraction, std::uint64_t seed);
    const Vocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return 3 * digits_ + 2; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    std::string describe() const override;
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
    Vocab vocab_;
};

// A file mapped read-only into memory (mmap): the pages are read from disk (or the page cache)
// when a batch touches them, so a corpus of any size costs address space, not memory.
class MappedFile {
public:
    // Throws "[data] cannot open 'path': <reason>"; an empty file maps to nothing (size 0).
    explicit MappedFile(const std::string& path);
    MappedFile(MappedFile&& other) noexcept;  // moves only (a Shard into its vector)
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();
    const unsigned char* data() const { return data_; }
    std::int64_t size() const { return size_; }

private:
    const unsigned char* data_ = nullptr;
    std::int64_t size_ = 0;
};

// How token files are laid out (TokenFormat in config.h, data.format), never guessed from a file:
//   llmc:       llm.c's shards (dev/data/data_common.py, write_datafile): a header of 256
//               little-endian int32 - [0] magic, [1] version, [2] the number of tokens - then
//               the ids. llm.c writes two kinds, and both are read: magic 20240520 version 1,
//               uint16 ids (GPT-2's tokenizer, "gpt-2"), and magic 20240801 version 7, uint32
//               ids (LLaMA-3's, "llama-3"; llm.c's own C loader reads only the first).
//   raw_uint16: nanoGPT's train.bin / val.bin (data/*/prepare.py): uint16 ids, no header.

// Token shards: the train files are `train_pattern`, the validation files `val_pattern`, each a
// file or a glob pattern (`data/fineweb10B/fineweb_train_*.bin`; the matches in sorted order).
// Checked when opened, every error naming the file: the pattern matches files (not directories,
// and no file is both train and val); the llm.c header's magic and version (one of the two
// kinds above, the same in all files); the file's size is exactly 1024 + n_tokens * token_bytes
// (llmc) or a whole number of uint16 ids (raw_uint16, which also refuses a file that starts with
// llm.c's magic); a file shorter than one window (block_size + 1 tokens) is never drawn, and
// each split needs one that is not. Token ids are
// checked against the vocabulary in each batch (the B x (T + 1) ids a batch reads): opening stays
// O(files) however large the corpus, and no id outside it ever reaches the model.
// A batch row is a window of block_size + 1 consecutive tokens of one file, every window of
// every file of the split equally likely (one draw of `gen` a row); inputs are its first
// block_size tokens, targets its last block_size.
// vocab_size: the tokenizer's; 0 takes the format's: 50257 (GPT-2) for llm.c's GPT-2 shards and
// raw_uint16, 128256 (LLaMA-3) for llm.c's LLaMA-3 shards. The vocabulary is named after the
// format: "gpt2" and "llama3" (llm.c's two kinds) or "uint16" (raw_uint16).
class ShardData final : public Dataset {
public:
    ShardData(const std::string& train_pattern, const std::string& val_pattern,
              TokenFormat format, std::int64_t vocab_size, std::int64_t block_size);
    const Vocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return block_size_; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    std::string describe() const override;
    std::int64_t tokens(Split split) const;
    std::vector<std::string> files(Split split) const;
    // llm.c's header version: 1 (GPT-2, uint16) or 7 (LLaMA-3, uint32); 0 for raw_uint16.
    int version() const { return version_; }

    struct Shard {
        std::string path;
        MappedFile file;
        const unsigned char* ids = nullptr;  // the first id, in `file`
        std::int64_t n_tokens = 0;
    };

private:
    struct Files {
        std::string pattern;
        std::vector<Shard> shards;
        std::vector<std::int64_t> window_ends;  // running count of windows, shard by shard
        std::int64_t tokens = 0;
    };
    const Files& split(Split s) const { return s == Split::train ? train_ : val_; }
    TokenFormat format_;
    int version_ = 0, token_bytes_ = 2;
    std::int64_t block_size_;
    Files train_, val_;
    Vocab vocab_{""};
};

// Uniform random ids in [0, vocab_size) (0: GPT-2's 50257), no files: a stand-in for token
// shards when only the speed matters (benchmarks, tests). Every id is a pure function of the
// generator's (seed, offset), so batches are as reproducible as a file's; the validation split
// draws under another key, so it never repeats a training batch. The vocabulary is "random".
class RandomTokenData final : public Dataset {
public:
    RandomTokenData(std::int64_t vocab_size, std::int64_t block_size);
    const Vocab& vocab() const override { return vocab_; }
    std::int64_t sequence_length() const override { return block_size_; }
    Batch batch(Split split, std::int64_t batch_size, Generator& gen, Device device) const override;
    std::string describe() const override;

private:
    std::int64_t block_size_;
    Vocab vocab_{""};
};

}  // namespace fg
