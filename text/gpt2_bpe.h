// text/gpt2_bpe.h: GPT-2's byte-level BPE tokenizer (50257 ids, <|endoftext|> = 50256), in C++.
//   encode: the text is split into pieces by GPT-2's pattern (contractions, runs of letters, of
//   digits, of other symbols, each with an optional leading space; whitespace runs, leaving the
//   last space to the next piece), with Unicode's letter and number classes (PCRE2, UTF + UCP);
//   each piece's bytes start as single-byte tokens and the adjacent pair of lowest merge rank is
//   merged until no pair is in the vocabulary. Bytes that are not valid UTF-8 are encoded as
//   tiktoken encodes
//   them (its _encode_bytes): the valid prefix as text, then the bytes of its last piece and all
//   the rest merged as one piece. Any bytes encode and decode back to themselves.
//   decode: the tokens' bytes, concatenated; Gpt2Decoder does it token by token, holding back an
//   incomplete UTF-8 character at the end until its last byte comes.
// The vocabulary is tiktoken's gpt2.tiktoken file (a base64 token and its rank a line), read from
// the path given or found where scripts/install_deps.sh installs it; it is never downloaded here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fg::text {

class Gpt2Tokenizer {
public:
    static constexpr std::int32_t kEndOfText = 50256;
    static constexpr std::int32_t kVocabSize = 50257;

    // Reads gpt2.tiktoken at `path`; a missing file, or one whose size or checksum is not the
    // known file's, is an error naming it, the expected SHA-256 and how to get it.
    static Gpt2Tokenizer load(const std::string& path);
    // The same from where the set-up installs it: $FUSEGRAD_DATA, else
    // $XDG_DATA_HOME/fusegrad (~/.local/share/fusegrad), then /usr/local/share/fusegrad and
    // /usr/share/fusegrad; not found is an error listing the places.
    static Gpt2Tokenizer load_installed();
    static std::vector<std::string> search_paths();

    // Ordinary text to ids (no special tokens: "<|endoftext|>" in the text is encoded as text).
    std::vector<std::int32_t> encode(std::string_view text) const;
    // The bytes of `ids` (each below kVocabSize, else an error naming it).
    std::string decode(const std::vector<std::int32_t>& ids) const;
    const std::string& token_bytes(std::int32_t id) const;

    Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
    Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
    ~Gpt2Tokenizer();

private:
    Gpt2Tokenizer();
    void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
    // Valid UTF-8 through the pattern; `last_piece` gets the number of the last piece's tokens.
    std::vector<std::int32_t> encode_text(std::string_view text, std::size_t* last_piece) const;

    std::unordered_map<std::string, std::int32_t> ranks_;  // token bytes -> id (= merge rank)
    std::vector<std::string> bytes_;                        // id -> token bytes
    struct Pattern;
    std::unique_ptr<Pattern> pattern_;                      // the compiled pre-split pattern
};

// Decodes a stream of ids into text a token at a time: push() returns the bytes that complete
// UTF-8 characters so far (an incomplete one at the end is held back), finish() the rest.
class Gpt2Decoder {
public:
    explicit Gpt2Decoder(const Gpt2Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
    std::string push(std::int32_t id);
    std::string finish();

private:
    const Gpt2Tokenizer& tokenizer_;
    std::string pending_;
};

}  // namespace fg::text
