// tests/test_gpt2_bpe.cpp: GPT-2's tokenizer (text/gpt2_bpe.h) with the vocabulary the set-up
// installs: known ids, any bytes back unchanged (invalid UTF-8 too), the streaming decoder, and
// the errors for a missing or different vocabulary file. Parity with tiktoken, id for id, is
// tests/text/tiktoken_parity.py.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "text/gpt2_bpe.h"

using fg::text::Gpt2Decoder;
using fg::text::Gpt2Tokenizer;

namespace {

const Gpt2Tokenizer& tokenizer() {
    static const Gpt2Tokenizer t = Gpt2Tokenizer::load_installed();
    return t;
}

}  // namespace

TEST_CASE("GPT-2's tokenizer gives GPT-2's ids", "[tokenizer]") {
    const Gpt2Tokenizer& t = tokenizer();
    CHECK(t.encode("Hello world") == std::vector<std::int32_t>{15496, 995});
    CHECK(t.encode("").empty());
    CHECK(t.decode({15496, 995}) == "Hello world");
    CHECK(t.token_bytes(Gpt2Tokenizer::kEndOfText) == "<|endoftext|>");
    // Ordinary text: the special token's text is encoded as text, not as 50256.
    for (std::int32_t id : t.encode("<|endoftext|>")) CHECK(id != Gpt2Tokenizer::kEndOfText);
    REQUIRE_THROWS_WITH(t.decode({50257}), ContainsSubstring("token id 50257 is not one of GPT-2's"));
}

TEST_CASE("any bytes encode and decode back to themselves", "[tokenizer]") {
    const Gpt2Tokenizer& t = tokenizer();
    std::ifstream torture(FG_SOURCE_DIR "/tests/text/torture.txt", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(torture)), {});
    REQUIRE(text.size() > 900);
    CHECK(t.decode(t.encode(text)) == text);
    // Invalid UTF-8: lone continuation bytes, a truncated character, overlong and surrogate forms.
    const std::string invalid = "ok \x80\x81 a\xE2\x82 b\xC0\xAF c\xED\xA0\x80 d\xFF\xFE e \xF0\x9F";
    CHECK(t.decode(t.encode(invalid)) == invalid);
    std::mt19937 gen(7);
    for (int i = 0; i < 200; ++i) {
        std::string bytes(static_cast<std::size_t>(gen() % 300), '\0');
        for (char& c : bytes) c = static_cast<char>(gen() & 0xFF);
        INFO("random bytes " << i);
        REQUIRE(t.decode(t.encode(bytes)) == bytes);
    }
}

TEST_CASE("the streaming decoder holds back an incomplete character", "[tokenizer]") {
    const Gpt2Tokenizer& t = tokenizer();
    const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE6\xBC\xA2\xE5\xAD\x97 end";
    Gpt2Decoder decoder(t);
    std::string streamed;
    for (std::int32_t id : t.encode(text)) {
        const std::string part = decoder.push(id);
        // Every part ends on a character boundary: its last lead byte's character is whole.
        for (std::size_t back = 1; back <= 3 && back <= part.size(); ++back) {
            const unsigned char c = static_cast<unsigned char>(part[part.size() - back]);
            if ((c & 0xC0) == 0x80) continue;
            const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            CHECK(need <= back);
            break;
        }
        streamed += part;
    }
    streamed += decoder.finish();
    CHECK(streamed == text);
}

TEST_CASE("a missing or different vocabulary file is named, with how to get the right one",
          "[tokenizer][errors]") {
    REQUIRE_THROWS_WITH(Gpt2Tokenizer::load("/no/such/gpt2.tiktoken"),
                        ContainsSubstring("cannot read '/no/such/gpt2.tiktoken'") &&
                            ContainsSubstring("306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930") &&
                            ContainsSubstring("scripts/install_deps.sh --tokenizer"));
    const std::string other = "/tmp/fg_test_other.tiktoken";
    std::ofstream(other) << "SGVsbG8= 0\n";
    REQUIRE_THROWS_WITH(Gpt2Tokenizer::load(other),
                        ContainsSubstring("is not GPT-2's gpt2.tiktoken (11 bytes; the file has 835554"));
    std::filesystem::remove(other);
}
