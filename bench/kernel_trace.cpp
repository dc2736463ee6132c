// bench/kernel_trace.cpp: libfg_kernel_trace.so, a CUPTI injection library that records the GPU
// start and end of every kernel, memory copy (peer-to-peer ones aside) and memset a process runs,
// as it runs them: those
// inside CUDA graphs included, nothing serialised or replayed. Nsight Compute
// (bench/kernel_times.py) times each kernel alone, at whatever clock the card holds between
// kernels, with the caches flushed; this library sees the kernels inside the step, at the clock
// the busy card holds. Any CUDA process can be traced this way, fusegrad's trainer and a PyTorch
// script alike, so the two are timed by one tool.
//
// usage: FG_KERNEL_TRACE_OUT=FILE CUDA_INJECTION64_PATH=/path/to/libfg_kernel_trace.so PROGRAM ...
// FILE gets one line a record, "start_ns end_ns name", in the order CUPTI hands them over (not
// sorted): a kernel's mangled name, or "[memcpy HtoD 65536 bytes]", "[memset 4096 bytes]";
// bench/kernel_trace_report.py sums them over whole training steps. Only the process started
// this way is traced: the library takes CUDA_INJECTION64_PATH out of the environment, so the
// processes it starts (compile workers) neither load it nor rewrite FILE. Records CUPTI dropped
// or left incomplete are counted on stderr at exit.
// Who asks for the memsets: every asynchronous memset call, to the runtime (cudaMemsetAsync) or
// to the driver (cuMemsetD8Async and kin, which the runtime's may call in turn: a call can count
// at both), is attributed to the first library on its call stack that is not CUDA's own
// (libcublasLt, libcudnn_..., the program), and FILE ends with a line "# memset API:LIBRARY BYTES
// CALLS" for each API, library and size. These are API calls over the whole run: a captured
// graph's memsets are called once, at its capture, and then replayed.
#include <cupti.h>  // with the driver calls' parameter structs (generated_cuda_meta.h)
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace {

std::mutex guard;             // the buffer callback runs on CUPTI's thread
FILE* trace_file = nullptr;   // under guard
unsigned long long dropped = 0, incomplete = 0;  // under guard
std::map<std::pair<std::string, unsigned long long>, unsigned long long> memset_calls;  // guard
CUpti_SubscriberHandle subscriber = nullptr;

void report(const char* what, CUptiResult result) {
    if (result == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    cuptiGetResultString(result, &text);
    std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text ? text : "?");
}

const char* copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
        default: return "other";
    }
}

// CUPTI asks for a buffer to fill with activity records, and hands it back when full or flushed.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 16u << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
    std::lock_guard<std::mutex> lock(guard);
    CUpti_Activity* record = nullptr;
    CUptiResult status;
    while ((status = cuptiActivityGetNextRecord(buffer, valid, &record)) == CUPTI_SUCCESS) {
        if (!trace_file) continue;
        // The record layouts of the CUPTI this library was built with (checked at start).
        unsigned long long start = 0, end = 0;
        char name[64];
        const char* label = name;
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            start = kernel->start;
            end = kernel->end;
            label = kernel->name;
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            start = copy->start;
            end = copy->end;
            std::snprintf(name, sizeof name, "[memcpy %s %llu bytes]", copy_kind(copy->copyKind),
                          static_cast<unsigned long long>(copy->bytes));
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            start = set->start;
            end = set->end;
            std::snprintf(name, sizeof name, "[memset %llu bytes]",
                          static_cast<unsigned long long>(set->bytes));
        } else {
            continue;
        }
        if (start == 0 || end < start) {
            ++incomplete;
            continue;
        }
        std::fprintf(trace_file, "%llu %llu %s\n", start, end, label);
    }
    if (status != CUPTI_ERROR_MAX_LIMIT_REACHED) report("cuptiActivityGetNextRecord", status);
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &lost) == CUPTI_SUCCESS)
        dropped += lost;
    std::free(buffer);
}

// The file name of the first caller on this thread's stack outside CUDA's libraries and this one.
std::string calling_library() {
    void* frames[48];
    const int depth = backtrace(frames, 48);
    for (int i = 0; i < depth; ++i) {
        Dl_info info{};
        if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
        const char* file = std::strrchr(info.dli_fname, '/');
        file = file ? file + 1 : info.dli_fname;
        if (std::strncmp(file, "libcuda.", 8) != 0 && std::strncmp(file, "libcudart", 9) != 0 &&
            std::strncmp(file, "libcupti", 8) != 0 && std::strstr(file, "kernel_trace") == nullptr)
            return *file ? file : "(the program)";
    }
    return "(unknown)";
}

constexpr CUpti_CallbackId kDriverMemsetCalls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,  CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async, CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz};
constexpr CUpti_CallbackId kRuntimeMemsetCalls[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000};

// The bytes a memset call (one of the two lists above) sets, from its parameters.
template <typename Params>
unsigned long long count_of(const void* params) {
    return static_cast<const Params*>(params)->count;
}
template <typename Params>
unsigned long long n_of(const void* params) {
    return static_cast<const Params*>(params)->N;
}
unsigned long long memset_bytes(CUpti_CallbackDomain domain, CUpti_CallbackId id,
                                const void* params) {
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
        return id == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020
                   ? count_of<cudaMemsetAsync_v3020_params>(params)
                   : count_of<cudaMemsetAsync_ptsz_v7000_params>(params);
    switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
            return n_of<cuMemsetD8Async_params>(params);
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz:
            return n_of<cuMemsetD8Async_ptsz_params>(params);
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async:
            return 2 * n_of<cuMemsetD16Async_params>(params);
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz:
            return 2 * n_of<cuMemsetD16Async_ptsz_params>(params);
        case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
            return 4 * n_of<cuMemsetD32Async_params>(params);
        default:  // cuMemsetD32Async_ptsz
            return 4 * n_of<cuMemsetD32Async_ptsz_params>(params);
    }
}

// An asynchronous memset, as it is called (on the calling thread): counted by API, library, size.
void CUPTIAPI on_memset_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                             const void* data) {
    const auto* call = static_cast<const CUpti_CallbackData*>(data);
    if (call->callbackSite != CUPTI_API_ENTER) return;
    const unsigned long long bytes = memset_bytes(domain, id, call->functionParams);
    std::string library = (domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime:" : "driver:") +
                          calling_library();
    std::lock_guard<std::mutex> lock(guard);
    ++memset_calls[{library, bytes}];
}

constexpr CUpti_ActivityKind kTraced[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                           CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

void finish() {
    for (CUpti_ActivityKind kind : kTraced) cuptiActivityDisable(kind);
    if (subscriber) cuptiUnsubscribe(subscriber);
    report("cuptiActivityFlushAll", cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    std::lock_guard<std::mutex> lock(guard);
    for (const auto& [key, calls] : memset_calls)
        if (trace_file)
            std::fprintf(trace_file, "# memset %s %llu %llu\n", key.first.c_str(), key.second,
                         calls);
    if (dropped || incomplete)
        std::fprintf(stderr, "kernel_trace: %llu records dropped, %llu incomplete\n",
                     dropped, incomplete);
    if (trace_file) std::fclose(trace_file);
    trace_file = nullptr;
}

}  // namespace

// Called by the CUDA driver when it creates the process's first context (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection(void) {
    unsetenv("CUDA_INJECTION64_PATH");  // this process only
    uint32_t version = 0;
    // An older CUPTI may not write the records this library reads; newer ones keep them.
    if (cuptiGetVersion(&version) != CUPTI_SUCCESS || version < CUPTI_API_VERSION) {
        std::fprintf(stderr, "kernel_trace: built for CUPTI API %u, loaded %u: rebuild it\n",
                     static_cast<unsigned>(CUPTI_API_VERSION), static_cast<unsigned>(version));
        return 0;
    }
    const char* path = std::getenv("FG_KERNEL_TRACE_OUT");
    if (!path) {
        std::fprintf(stderr, "kernel_trace: set FG_KERNEL_TRACE_OUT to the file to write\n");
        return 0;
    }
    {
        std::lock_guard<std::mutex> lock(guard);
        trace_file = std::fopen(path, "w");
    }
    if (!trace_file) {
        std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return 0;
    }
    report("cuptiActivityRegisterCallbacks",
           cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (CUpti_ActivityKind kind : kTraced)
        report("cuptiActivityEnable", cuptiActivityEnable(kind));
    report("cuptiSubscribe", cuptiSubscribe(&subscriber, on_memset_call, nullptr));
    // Those calls alone: every other call stays as fast as untraced.
    for (CUpti_CallbackId id : kDriverMemsetCalls)
        if (subscriber)
            report("cuptiEnableCallback",
                   cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id));
    for (CUpti_CallbackId id : kRuntimeMemsetCalls)
        if (subscriber)
            report("cuptiEnableCallback",
                   cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id));
    std::atexit(finish);
    return 1;
}
