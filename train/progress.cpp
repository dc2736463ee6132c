// train/progress.cpp: see progress.h.
#include "progress.h"

#include <algorithm>
#include <cstdio>

namespace fg {

std::string progress_line(std::int64_t step, std::int64_t total, double loss, double ms_per_step,
                          int width) {
    const double eta_s = std::max<double>(0.0, static_cast<double>(total - step)) * ms_per_step / 1000.0;
    const long eta = static_cast<long>(eta_s + 0.5);
    char clock[48], text[160];  // the ETA as m:ss, or h:mm:ss from an hour on
    if (eta >= 3600)
        std::snprintf(clock, sizeof clock, "%ld:%02ld:%02ld", eta / 3600, eta / 60 % 60, eta % 60);
    else
        std::snprintf(clock, sizeof clock, "%ld:%02ld", eta / 60, eta % 60);
    std::snprintf(text, sizeof text, "  %lld/%lld  loss %.4f  %.1f ms/step  ETA %s",
                  static_cast<long long>(step), static_cast<long long>(total), loss, ms_per_step,
                  clock);
    const std::string tail(text);
    const int bar = std::min(30, width - static_cast<int>(tail.size()) - 2);
    if (bar < 5) return tail.substr(2);
    const double done = total > 0 ? std::clamp(static_cast<double>(step) / total, 0.0, 1.0) : 1.0;
    const int filled = static_cast<int>(done * bar);
    std::string line = "[" + std::string(filled, '=');
    if (filled < bar) line += ">" + std::string(bar - filled - 1, ' ');
    return line + "]" + tail;
}

double peak_tflops(const std::string& gpu_name, Precision precision) {
    // NVIDIA's datasheet figures, dense. Order matters: the more specific name first.
    struct Peak {
        const char* name;
        double fp32, tf32, bf16;
    };
    static const Peak table[] = {
        {"H100 PCIe", 51.2, 378.0, 756.0}, {"H100 NVL", 60.0, 417.5, 835.0},
        {"H100", 66.9, 494.7, 989.4}, {"H200", 66.9, 494.7, 989.4},  // also GH200
        {"A100", 19.5, 156.0, 312.0},
    };
    for (const Peak& p : table)
        if (gpu_name.find(p.name) != std::string::npos)
            return precision == Precision::bf16   ? p.bf16
                   : precision == Precision::tf32 ? p.tf32
                                                  : p.fp32;
    return 0.0;
}

double gpt_flops_per_token(std::int64_t weights, std::int64_t n_layer, std::int64_t n_embd,
                           std::int64_t seq, double attention) {
    return 6.0 * static_cast<double>(weights) + attention * static_cast<double>(n_layer) *
                                                    static_cast<double>(n_embd * seq);
}

}  // namespace fg
