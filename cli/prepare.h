// cli/prepare.h: `fusegrad prepare`, text files to GPT-2 token shards that `data.kind: shards`
// trains on as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fg::cli {

struct PrepareOptions {
    std::vector<std::string> inputs;  // text files, folders of them, or .jsonl files
    std::string out_dir;              // where the shards go (made if missing)
    std::string name = "data";        // shards are NAME_train_NNNNNN.bin, NAME_val_NNNNNN.bin
    std::string format = "llmc";      // llmc (llm.c's header, uint16) or raw_uint16 (nanoGPT's)
    std::string jsonl_field = "text";
    double val_share = 0.1;
    std::int64_t shard_tokens = 100'000'000;
    int threads = 0;  // 0: every core
    bool progress = false;
};

// Reads every document (a file, each file of a folder in name order, each line of a .jsonl),
// encodes each with GPT-2's tokenizer on `threads` threads (every core by default), <|endoftext|>
// before each, and writes the last val_share of the tokens as one validation shard
// (NAME_val_000000.bin) and the rest as training shards of at most shard_tokens each (raw_uint16:
// NAME_train.bin and NAME_val.bin, one file each). Refuses empty input, and shards that would
// overwrite files already there (naming them). Prints what it wrote; returns the number of tokens.
std::int64_t prepare(const PrepareOptions& options);

// Refuses an llm.c shard of more tokens than its header's int32 counts (2^31 - 1), naming `path`:
// prepare checks every shard with it before it writes any.
void check_llmc_shard_tokens(std::size_t tokens, const std::string& path);

}  // namespace fg::cli
