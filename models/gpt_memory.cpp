// models/gpt_memory.cpp: see gpt_memory.h. Every term counts bytes for N = batch * seq_len
// tokens, C = n_embd, H = n_head, T = seq_len, V = vocab_size, L = n_layer and s = the bytes of
// one activation (4 in f32, 2 in bf16/f16).
#include "gpt_memory.h"

#include <algorithm>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace fg {

std::string TrainingMemory::describe() const {
    std::string out;
    const std::vector<std::pair<const char*, double>> terms{
        {"parameters", parameters},     {"gradients", gradients},
        {"optimizer state", optimizer_state}, {"16-bit weight copies", weight_copies},
        {"activations", activations},   {"workspace", workspace},
        {"gradient exchange", exchange}};
    for (const auto& [name, value] : terms)
        if (value > 0)
            out += (out.empty() ? "" : ", ") + std::string(name) + " " + format_bytes(value);
    return format_bytes(total()) + ": " + out;
}

namespace {

// What `count` tensors of `elements` elements of `bytes_each` bytes occupy in the allocator (each
// rounded up to its granule). In doubles: a hostile config must give a huge number, not wrap.
double tensors(double count, double elements, double bytes_each) {
    const double bytes = elements * bytes_each;
    const double rounded = bytes < 0x1p60 ? static_cast<double>(allocation_size(
                                                static_cast<std::size_t>(bytes)))
                                          : bytes;
    return count * rounded;
}

}  // namespace

TrainingMemory estimate_training_memory(const GPTConfig& g, std::int64_t batch,
                                        std::int64_t seq_len, int optimizer_floats_per_param,
                                        bool cudnn_attention) {
    FG_CHECK(batch > 0 && seq_len > 0 && seq_len <= g.block_size, "memory",
             "batch (", batch, ") and sequence length (", seq_len,
             ") must be positive, the length at most block_size (", g.block_size, ")");
    const double C = static_cast<double>(g.n_embd), H = static_cast<double>(g.n_head);
    const double V = static_cast<double>(g.vocab_size), L = static_cast<double>(g.n_layer);
    const double B = static_cast<double>(batch), T = static_cast<double>(seq_len), N = B * T;
    const double s = static_cast<double>(dtype_size(g.compute_dtype));
    const bool half = g.compute_dtype != DType::f32;
    const double f32 = 4.0, i32 = 4.0;

    // The parameter tensors, as (count, elements). A block: c_attn (3C, C), attn.c_proj (C, C),
    // mlp.c_fc (4C, C), mlp.c_proj (C, 4C) and their biases (3C, C, 4C, C); two norms, each a
    // weight (C) and, with biases, a bias (C). Then wte (V, C), wpe (block_size, C) and ln_f.
    // The head is wte itself.
    const double norm_tensors = g.bias ? 2 : 1;
    auto linear_weights = [&](double bytes_each) {
        return L * (tensors(1, 3 * C * C, bytes_each) + tensors(1, C * C, bytes_each) +
                    tensors(2, 4 * C * C, bytes_each)) +
               (g.bias ? L * (tensors(1, 3 * C, bytes_each) + tensors(2, C, bytes_each) +
                              tensors(1, 4 * C, bytes_each))
                       : 0.0);
    };
    auto all_params = [&](double bytes_each) {
        return linear_weights(bytes_each) +
               tensors((2 * L + 1) * norm_tensors, C, bytes_each) + tensors(1, V * C, bytes_each) +
               tensors(1, static_cast<double>(g.block_size) * C, bytes_each);
    };

    TrainingMemory m;
    m.parameters = all_params(f32);
    m.optimizer_state = optimizer_floats_per_param * all_params(f32);
    // Linear multiplies by a copy of its weight in x's dtype: in 16-bit each block's weight
    // copies and the tied head's copy of wte are kept for the backward (the bias copies only
    // while linear runs, counted here all the same: a few KiB). cuBLASLt's 32 MiB workspace is
    // outside the caching allocator, as cuBLAS's is, and not counted.
    if (half) m.weight_copies = linear_weights(s) + tensors(1, V * C, s);

    // Saved by one block, (B, T, .) tensors of activations: ln_1's input (C, the residual sum it
    // adds), c_attn's input (C), the q, k, v the attention keeps (3C: c_attn's output as it is for
    // cuDNN, a permuted copy for the fused kernels), attn.c_proj's input (C, which cuDNN's
    // attention also keeps as its output), the residual sum ln_2 keeps (C), c_fc's input (C),
    // GELU's input (4C) and mlp.c_proj's input (4C); in f32 each norm's rstd (and LayerNorm's mean)
    // and the attention's log-sum-exp per head.
    const double channels = tensors(1, N * C, s), wide = tensors(1, 4 * N * C, s);
    const double norm_stats = tensors(g.rmsnorm ? 1 : 2, N, f32);
    const double block_to_attention =  // what the backward still holds at the attention
        2 * channels + tensors(1, 3 * N * C, s) + norm_stats + tensors(1, N * H, f32);
    const double block_after_attention = 3 * channels + 2 * wide + norm_stats;
    const double block = block_to_attention + block_after_attention;
    // After the blocks: ln_f's input and output, the logits the loss keeps and its per-row
    // log-sum-exp; the i32 inputs and targets.
    const double logits = tensors(1, N * V, s);
    const double head =
        2 * channels + norm_stats + logits + tensors(1, N, f32) + tensors(2, N, i32);
    const double saved = L * block + head;

    // The f32 gradients, which zero_grad frees: the backward makes them layer by layer, from
    // the head down. Those of wte (the head) and ln_f come first, then the last block's MLP
    // (c_fc, mlp.c_proj), then its ln_2 and attn.c_proj.
    const double norm_grads = tensors(norm_tensors, C, f32);
    const double head_grads = tensors(1, V * C, f32) + norm_grads;
    const double mlp_grads = tensors(2, 4 * C * C, f32) +
                             (g.bias ? tensors(1, 4 * C, f32) + tensors(1, C, f32) : 0.0);
    const double attn_proj_grads = tensors(1, C * C, f32) + (g.bias ? tensors(1, C, f32) : 0.0);

    // The step's peak is the largest of these moments, each (activations still saved, gradients
    // made so far, buffers of the op running):
    // - the head's backward: everything saved (the logits' gradient overwrites the logits); the
    //   head input's gradient; ln_f's gradient and wte's: in f32 the matmul makes wte's gradient
    //   itself, in 16-bit it makes the gradient of wte's 16-bit copy, which becomes wte's f32
    //   gradient only once the logits are freed (a moment of its own);
    // - the last MLP's: the head's saved tensors are gone; the output's gradient (C) and the
    //   gradients of mlp.c_proj's input and of GELU's input (4C each), while mlp.c_proj's saved
    //   input (4C) has been freed;
    // - the last attention's: the MLP's and ln_2's saved tensors are gone too; the residual
    //   stream's and the output's gradients (C each), dqkv (3C) and per head the scores S (f32),
    //   the probabilities Pd and in 16-bit dPd (f32), each (B H, T, T). cuDNN's attention has no
    //   (T, T) buffer; its workspace is taken to be what FlashAttention's backward needs: an
    //   fp32 accumulator of dQ (C) and one fp32 value per row and head;
    // - the optimizer's step: every gradient, no activation.
    const double scores = B * H * T * T;
    const double attention_scratch =
        cudnn_attention ? tensors(1, N * C, f32) + tensors(1, N * H, f32)
                        : tensors(1, scores, f32) + tensors(1, scores, s) +
                              (half ? tensors(1, scores, f32) : 0.0);
    struct Moment {
        double activations, gradients, workspace;
        double total() const { return activations + gradients + workspace; }
    };
    const Moment moments[] = {
        {saved, half ? norm_grads : head_grads, channels + (half ? tensors(1, V * C, s) : 0.0)},
        {saved - logits, head_grads, channels},
        {saved - head, head_grads + mlp_grads, channels + wide},
        // (cuDNN's attention keeps its output, attn.c_proj's input, until its own backward)
        {saved - head - block_after_attention + (cudnn_attention ? channels : 0.0),
         head_grads + mlp_grads + norm_grads + attn_proj_grads,
         2 * channels + tensors(1, 3 * N * C, s) + attention_scratch},
        {0.0, all_params(f32), 0.0},
    };
    const Moment* peak = std::max_element(std::begin(moments), std::end(moments),
                                          [](auto& a, auto& b) { return a.total() < b.total(); });
    m.activations = peak->activations;
    m.gradients = peak->gradients;
    m.workspace = peak->workspace;
    return m;
}

}  // namespace fg
