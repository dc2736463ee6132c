// cli/hf_gpt2.h: GPT-2 weights in Hugging Face's layout, in and out (`fusegrad export --hf`,
// `fusegrad import --hf`): a folder with model.safetensors and config.json that transformers'
// GPT2LMHeadModel loads (from_pretrained), and that GPT-2's published checkpoints are.
//
// The layouts differ in four ways. Names: transformers' keys are fusegrad's (nanoGPT's) with or
// without the "transformer." prefix. Linear weights: transformers' GPT-2 keeps them as Conv1D,
// (in, out), fusegrad as (out, in): each is transposed. The head: tied to wte in both;
// transformers' file may hold it as lm_head.weight (the same values) or not at all. The
// vocabulary: fusegrad's runs may pad wte's rows (50257 to 50304, for the GEMMs), which the
// export leaves out; an imported model keeps the file's exact vocabulary. A fusegrad model
// without biases exports zero biases (transformers' GPT-2 always has them); one with RMSNorm has
// no GPT-2 counterpart and is refused.
#pragma once

#include <string>

namespace fg::cli {

// Writes <out_dir>/model.safetensors and config.json from the run in `run_dir` (its latest
// weights, or best.safetensors with `best`). Refuses an out_dir that already holds either file.
void export_hf_gpt2(const std::string& run_dir, bool best, const std::string& out_dir);

// Makes the run directory `run_dir` (new or empty) from the transformers GPT-2 folder `hf_dir`:
// config.yaml (the model's shape; data: GPT-2 token shards to fill in), vocab.txt and
// model.safetensors, which `sample` and `eval` read, and which a new run starts from with
// train.init_from (a run started into `run_dir` itself is refused). Returns a line for the log.
std::string import_hf_gpt2(const std::string& hf_dir, const std::string& run_dir);

}  // namespace fg::cli
