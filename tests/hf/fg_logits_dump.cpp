// tests/hf/fg_logits_dump.cpp: the logits of a run's model for given token ids, for the test
// against transformers (tests/hf/hf_gpt2_check.py). Writes OUT (safetensors) with "logits", f32
// (B, T, V): V the run's vocabulary (a padded model's extra columns left out).
// usage: fg_logits_dump RUN_DIR OUT T ID... (B = the number of ids / T)
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "train/evaluate.h"
#include "train/safetensors.h"

int main(int argc, char** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: fg_logits_dump RUN_DIR OUT T ID...\n");
        return 2;
    }
    try {
        using namespace fg;
        LoadedModel run = load_run(argv[1], false, Device::cpu);
        const std::int64_t t = std::atoll(argv[3]);
        std::vector<std::int32_t> ids;
        for (int i = 4; i < argc; ++i) ids.push_back(std::atoi(argv[i]));
        const std::int64_t b = static_cast<std::int64_t>(ids.size()) / t;
        NoGradGuard no_grad;
        const Tensor logits = run.model->forward(Tensor::from_vector(ids, {b, t}));
        const std::int64_t padded = logits.shape()[2], v = run.vocab.size();
        const std::vector<float> all = logits.to_vector<float>();
        std::vector<float> kept;
        for (std::int64_t row = 0; row < b * t; ++row)
            kept.insert(kept.end(), all.begin() + row * padded, all.begin() + row * padded + v);
        save_safetensors(argv[2], {{"logits", Tensor::from_vector(kept, {b, t, v})}});
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fg_logits_dump: %s\n", e.what());
        return 1;
    }
}
