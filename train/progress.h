// train/progress.h: what the trainer prints about speed: a one-line progress bar for terminals,
// and model FLOPs utilisation (MFU) against the dense peak of a known GPU.
#pragma once

#include <cstdint>
#include <string>

#include "config.h"  // Precision

namespace fg {

// "[=========>          ]  1234/5000  loss 1.2345  12.3 ms/step  ETA 0:45" fitted to `width`
// columns (at least the text; the bar takes what is left, up to 30 characters).
std::string progress_line(std::int64_t step, std::int64_t total, double loss, double ms_per_step,
                          int width = 100);

// Dense (no sparsity) peak TFLOP/s of the matmuls a train.precision runs (fp32 on plain FP32
// cores, tf32 or bf16 on tensor cores) on a GPU known by its CUDA device name; 0 when the GPU is
// not in the table.
double peak_tflops(const std::string& gpu_name, Precision precision);

// Training FLOPs per token of a GPT (forward + backward): 6 per weight, plus `attention` *
// n_layer * n_embd * seq for the attention scores and the weighted sum. Two counts are in use:
// PaLM's (nanoGPT's estimate_mfu): attention 12 (QK^T and AV, 2 FLOPs per multiply-add, times 3
// for forward + backward), the weights without the position embedding (a lookup, no FLOPs);
// llm.c's: attention 6 (causal: half the scores), every weight.
double gpt_flops_per_token(std::int64_t weights, std::int64_t n_layer, std::int64_t n_embd,
                           std::int64_t seq, double attention);

}  // namespace fg
