// bench/bench_common.h: what every GPU benchmark shares: CUDA-event timing on fusegrad's stream,
// the median of many repetitions, an L2 flush before each one (a write of twice the L2 size, so
// every repetition starts cold as in training), and the copy bandwidth to compare against.
// Before each repetition's start event the GPU spins for 200 us (kernels::busy_wait) while the
// host queues the repetition's launches: what is timed is the GPU's work, not the host's cost
// of launching it (bench/norm_torch.py does the same for PyTorch).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/runtime.h"

namespace fg::bench {

class Timer {
public:
    Timer() {
        FG_CUDA_CHECK(cudaEventCreate(&start_));
        FG_CUDA_CHECK(cudaEventCreate(&stop_));
        flush_bytes_ = 2 * static_cast<std::size_t>(kernels::device_info().l2_bytes);
        FG_CUDA_CHECK(cudaMalloc(&flush_, flush_bytes_));
    }
    ~Timer() {
        cudaEventDestroy(start_);
        cudaEventDestroy(stop_);
        cudaFree(flush_);
    }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;

    // Median milliseconds of `reps` runs of fn, after `warmup` untimed runs. `setup`, when given,
    // runs before each repetition, outside the timed region (e.g. building a graph to backprop).
    double median_ms(const std::function<void()>& fn, int reps = 30, int warmup = 3,
                     const std::function<void()>& setup = nullptr) {
        cudaStream_t s = kernels::stream();
        for (int i = 0; i < warmup; ++i) {
            if (setup) setup();
            fn();
        }
        std::vector<float> times;
        for (int i = 0; i < reps; ++i) {
            if (setup) setup();
            FG_CUDA_CHECK(cudaMemsetAsync(flush_, i & 0xff, flush_bytes_, s));
            kernels::busy_wait(kHostLeadUs);  // the launches below are queued before it ends
            FG_CUDA_CHECK(cudaEventRecord(start_, s));
            fn();
            FG_CUDA_CHECK(cudaEventRecord(stop_, s));
            FG_CUDA_CHECK(cudaEventSynchronize(stop_));
            float ms = 0.0f;
            FG_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
            times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
    }

private:
    static constexpr double kHostLeadUs = 200.0;
    cudaEvent_t start_, stop_;
    void* flush_ = nullptr;
    std::size_t flush_bytes_ = 0;
};

// Device-to-device copy of `bytes`, counted as bytes read + bytes written, in GB/s.
inline double copy_bandwidth_gbs(Timer& timer, std::size_t bytes) {
    void *a = nullptr, *b = nullptr;
    FG_CUDA_CHECK(cudaMalloc(&a, bytes));
    FG_CUDA_CHECK(cudaMalloc(&b, bytes));
    FG_CUDA_CHECK(cudaMemset(a, 1, bytes));
    double ms = timer.median_ms([&] {
        FG_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, kernels::stream()));
    });
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes / (ms * 1e6);
}

// Rows of a result table, printed last and written as JSON.
struct Row {
    std::string group, name, shape;
    double ms = 0.0;
    double value = 0.0;   // GB/s, TFLOP/s or microseconds
    std::string unit;
    double ratio = 0.0;   // against the row's baseline (copy bandwidth, cuBLAS, ...), 0 if none
    std::string ratio_of;
};

inline void print_table(const std::vector<Row>& rows) {
    std::printf("\n%-12s %-34s %-22s %10s %12s %10s\n", "group", "name", "shape", "ms", "value",
                "ratio");
    for (const Row& r : rows) {
        char ratio[48] = "";
        if (r.ratio > 0) std::snprintf(ratio, sizeof ratio, "%.0f%% %s", 100 * r.ratio, r.ratio_of.c_str());
        std::printf("%-12s %-34s %-22s %10.4f %8.1f %-4s %s\n", r.group.c_str(), r.name.c_str(),
                    r.shape.c_str(), r.ms, r.value, r.unit.c_str(), ratio);
    }
}

inline void write_json(const std::string& path, const std::string& device, double copy_gbs,
                       const std::vector<Row>& rows) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
        std::fprintf(stderr, "warning: cannot write %s\n", path.c_str());
        return;
    }
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"copy_gbs\": %.1f,\n  \"rows\": [\n",
                 device.c_str(), copy_gbs);
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "    {\"group\": \"%s\", \"name\": \"%s\", \"shape\": \"%s\", \"ms\": %.5f, "
                     "\"value\": %.3f, \"unit\": \"%s\", \"ratio\": %.4f, \"ratio_of\": \"%s\"}%s\n",
                     r.group.c_str(), r.name.c_str(), r.shape.c_str(), r.ms, r.value,
                     r.unit.c_str(), r.ratio, r.ratio_of.c_str(), i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
}

}  // namespace fg::bench
