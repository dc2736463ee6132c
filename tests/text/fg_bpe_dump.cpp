// tests/text/fg_bpe_dump.cpp: prints the GPT-2 ids of a file's bytes, one line, space-separated
// (text/gpt2_bpe.h with the installed vocabulary), for tests/text/tiktoken_parity.py.
// usage: fg_bpe_dump FILE
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>

#include "text/gpt2_bpe.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fg_bpe_dump FILE\n");
        return 2;
    }
    try {
        std::ifstream in(argv[1], std::ios::binary);
        if (!in) throw std::runtime_error(std::string("cannot read ") + argv[1]);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        const fg::text::Gpt2Tokenizer bpe = fg::text::Gpt2Tokenizer::load_installed();
        std::string line;
        for (std::int32_t id : bpe.encode(text)) line += (line.empty() ? "" : " ") + std::to_string(id);
        std::printf("%s\n", line.c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
