// bench/kernel_trace.cpp: libfg_kernel_trace.so, a CUPTI injection library that records the GPU
// start and end of every kernel a process runs, as it runs them: kernels inside CUDA graphs
// included, nothing serialised or replayed. Nsight Compute (bench/kernel_times.py) times each
// kernel alone, at whatever clock the card holds between kernels; a training step that keeps the
// card busy may run at a lower clock (its power limit), and this library sees that. Any CUDA
// process can be traced this way, fusegrad's trainer and a PyTorch script alike, so the two are
// timed by one tool.
//
// usage: FG_KERNEL_TRACE_OUT=FILE CUDA_INJECTION64_PATH=/path/to/libfg_kernel_trace.so PROGRAM ...
// FILE gets one line a kernel, "start_ns end_ns mangled_name", in the order CUPTI hands them over
// (not sorted); bench/kernel_trace_report.py sums them over whole training steps.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>

namespace {

FILE* trace_file = nullptr;

void report(const char* what, CUptiResult result) {
    if (result == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    cuptiGetResultString(result, &text);
    std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text ? text : "?");
}

// CUPTI asks for a buffer to fill with activity records, and hands it back when full or flushed.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 16u << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || !trace_file) continue;
        // The record layout of the CUPTI this library was built with (the CUDA 13 headers).
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        std::fprintf(trace_file, "%llu %llu %s\n", static_cast<unsigned long long>(kernel->start),
                     static_cast<unsigned long long>(kernel->end), kernel->name);
    }
    std::free(buffer);
}

void finish() {
    report("cuptiActivityFlushAll", cuptiActivityFlushAll(1));
    if (trace_file) std::fclose(trace_file);
    trace_file = nullptr;
}

}  // namespace

// Called by the CUDA driver when it creates the process's first context (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection(void) {
    const char* path = std::getenv("FG_KERNEL_TRACE_OUT");
    if (!path) {
        std::fprintf(stderr, "kernel_trace: set FG_KERNEL_TRACE_OUT to the file to write\n");
        return 0;
    }
    trace_file = std::fopen(path, "w");
    if (!trace_file) {
        std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return 0;
    }
    report("cuptiActivityRegisterCallbacks",
           cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    report("cuptiActivityEnable", cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    std::atexit(finish);
    return 1;
}
