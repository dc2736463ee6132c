// kernels/runtime.cu: implementation of runtime.h (error text, the stream, memory, graphs, events,
// pinned memory, the device error word). The only kernel launched here is busy_wait's one-thread
// spin.
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "device_error.cuh"
#include "runtime.h"

namespace fg::kernels {

namespace detail {
void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    std::ostringstream msg;
    msg << "[cuda] " << expr << " failed at " << file << ":" << line << ": "
        << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
    throw CudaError(msg.str());
}
void throw_cublas_error(int status, const char* expr, const char* file, int line) {
    std::ostringstream msg;
    msg << "[cublas] " << expr << " failed at " << file << ":" << line << ": "
        << cublasGetStatusName(static_cast<cublasStatus_t>(status)) << " ("
        << cublasGetStatusString(static_cast<cublasStatus_t>(status)) << ")";
    throw CudaError(msg.str());
}
}  // namespace detail

bool cuda_available() {
    static const bool available = [] {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) {
            cudaGetLastError();  // clear the sticky "no driver" error
            return false;
        }
        return count > 0;
    }();
    return available;
}

int device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

void select_device(int index) {
    const int count = device_count();
    if (index < 0 || index >= count)
        throw CudaError("[cuda] GPU " + std::to_string(index) + " asked for, but this process " +
                        "sees " + std::to_string(count) + " (CUDA_VISIBLE_DEVICES)");
    FG_CUDA_CHECK(cudaSetDevice(index));
}

const DeviceInfo& device_info() {
    static const DeviceInfo info = [] {
        DeviceInfo d;
        cudaDeviceProp prop{};
        int device = 0;
        FG_CUDA_CHECK(cudaGetDevice(&device));
        FG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        d.name = prop.name;
        d.sm_count = prop.multiProcessorCount;
        d.l2_bytes = prop.l2CacheSize;
        d.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
        d.compute_major = prop.major;
        d.smem_per_block_optin = (int)prop.sharedMemPerBlockOptin;
        d.smem_per_sm = (int)prop.sharedMemPerMultiprocessor;
        d.cooperative_launch = prop.cooperativeLaunch != 0;
        d.total_bytes = prop.totalGlobalMem;
        return d;
    }();
    return info;
}

int resident_blocks_per_sm(const void* kernel, int threads, std::size_t smem) {
    // The occupancy query costs more than a launch and its answer never changes for a kernel,
    // block size and shared memory: each is asked once.
    using Key = std::tuple<const void*, int, std::size_t>;
    static std::map<Key, int> known;
    static std::mutex guard;
    std::lock_guard<std::mutex> lock(guard);
    auto [at, inserted] = known.try_emplace(Key{kernel, threads, smem}, 0);
    if (inserted) {
        int blocks = 0;
        cudaError_t err =
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
        if (err != cudaSuccess) known.erase(at);
        FG_CUDA_CHECK(err);
        at->second = blocks > 0 ? blocks : 1;
    }
    return at->second;
}

void allow_dynamic_smem(const void* kernel, std::size_t bytes) {
    static std::map<const void*, std::size_t> allowed;
    static std::mutex guard;
    std::lock_guard<std::mutex> lock(guard);
    std::size_t& now = allowed[kernel];
    if (bytes <= now) return;
    FG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
    now = bytes;
}

namespace {
// The StreamOverride in force on this thread, if any (a flag: the null stream is a valid override).
thread_local bool t_override_active = false;
thread_local cudaStream_t t_override = nullptr;
}  // namespace

StreamOverride::StreamOverride(cudaStream_t s)
    : previous_(t_override), previous_active_(t_override_active) {
    t_override = s;
    t_override_active = true;
}

StreamOverride::~StreamOverride() {
    t_override = previous_;
    t_override_active = previous_active_;
}

cudaStream_t stream() {
    if (t_override_active) return t_override;
    static cudaStream_t s = [] {
        cudaStream_t created = nullptr;
        FG_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
        return created;
    }();
    return s;
}

void synchronize() { FG_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void* device_malloc(std::size_t bytes) {
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return nullptr;
    }
    FG_CUDA_CHECK(err);
    return ptr;
}

void device_free(void* ptr) {
    // Called from destructors: never throw. A failure here means the context is already broken.
    if (ptr) cudaFree(ptr);
}

std::size_t device_free_bytes() {
    std::size_t free = 0, total = 0;
    FG_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
}

void copy_host_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    FG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    // The host buffer may be freed as soon as we return: wait for the pageable copy to finish.
    FG_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void copy_device_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    FG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    FG_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void copy_device_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    FG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void memset_device(void* dst, int byte, std::size_t bytes) {
    if (bytes == 0) return;
    FG_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream()));
}

void begin_capture() {
    // Relaxed: a graph's memory pool may need a block the cache does not have, and cudaMalloc
    // (not a stream operation, so not recorded) is refused by the stricter modes.
    FG_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
}

void* end_capture() {
    cudaGraph_t graph = nullptr;
    FG_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    FG_CUDA_CHECK(err);
    return exec;
}

void abort_capture() noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
        cudaGraph_t graph = nullptr;
        if (cudaStreamEndCapture(stream(), &graph) == cudaSuccess && graph)
            cudaGraphDestroy(graph);
    }
    cudaGetLastError();  // the capture's error is the caller's to report, not the next call's
}

bool capturing() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FG_CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
    return status != cudaStreamCaptureStatusNone;
}

void launch_graph(void* graph) {
    FG_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream()));
}

void destroy_graph(void* graph) noexcept {
    if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

void* pinned_malloc(std::size_t bytes) {
    void* ptr = nullptr;
    FG_CUDA_CHECK(cudaMallocHost(&ptr, bytes));
    return ptr;
}

void pinned_free(void* ptr) noexcept {
    if (ptr) cudaFreeHost(ptr);
}

void copy_pinned_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    FG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
}

void* event_create() {
    cudaEvent_t event = nullptr;
    FG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

void event_record(void* event) {
    FG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream()));
}

void event_synchronize(void* event) {
    FG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

void event_destroy(void* event) noexcept {
    if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void* event_create_timed() {
    cudaEvent_t event = nullptr;
    FG_CUDA_CHECK(cudaEventCreate(&event));
    return event;
}

float event_elapsed_ms(void* start, void* end) {
    FG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
    float ms = 0.0f;
    FG_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                       static_cast<cudaEvent_t>(end)));
    return ms;
}

namespace {
const unsigned long long* g_philox_offset_base = nullptr;
}  // namespace

void set_philox_offset_base(const unsigned long long* base) { g_philox_offset_base = base; }
const unsigned long long* philox_offset_base() { return g_philox_offset_base; }

namespace {
// Spins until the GPU's global timer (nanoseconds) has moved `ns` on.
__global__ void busy_wait_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
}  // namespace

void busy_wait(double microseconds) {
    busy_wait_kernel<<<1, 1, 0, stream()>>>((unsigned long long)(microseconds * 1e3));
    FG_LAUNCH_CHECK();
}

DeviceErrorRecord* device_error_record() {
    static DeviceErrorRecord* record = [] {
        void* ptr = nullptr;
        FG_CUDA_CHECK(cudaMalloc(&ptr, sizeof(DeviceErrorRecord)));
        FG_CUDA_CHECK(cudaMemsetAsync(ptr, 0, sizeof(DeviceErrorRecord), stream()));
        return static_cast<DeviceErrorRecord*>(ptr);
    }();
    return record;
}

DeviceErrorRecord take_device_error() {
    DeviceErrorRecord record{};
    copy_device_to_host(&record, device_error_record(), sizeof(record));
    if (record.code != 0) memset_device(device_error_record(), 0, sizeof(record));
    return record;
}

}  // namespace fg::kernels
