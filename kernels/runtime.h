// kernels/runtime.h: the CUDA runtime as fusegrad uses it. Error checking (every CUDA and cuBLAS
// call, every launch), the one stream all work is queued on, raw device memory, copies, device
// properties, and the device-side error word through which kernels report bad input (an
// out-of-range token id) without a host synchronisation. No Tensor here: pointers and sizes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fg {

// Thrown for any failed CUDA or cuBLAS call; the message names the expression, file:line and the
// library's own error text.
struct CudaError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

namespace kernels {
namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line);
}  // namespace detail

#define FG_CUDA_CHECK(expr)                                                            \
    do {                                                                               \
        cudaError_t fg_err_ = (expr);                                                  \
        if (fg_err_ != cudaSuccess)                                                    \
            ::fg::kernels::detail::throw_cuda_error(fg_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// For cuBLAS and cuBLASLt calls (both return cublasStatus_t, whose success is 0).
#define FG_CUBLAS_CHECK(expr)                                                             \
    do {                                                                                  \
        const int fg_status_ = static_cast<int>(expr);                                    \
        if (fg_status_ != 0)                                                              \
            ::fg::kernels::detail::throw_cublas_error(fg_status_, #expr, __FILE__, __LINE__); \
    } while (0)

// After every <<<...>>>: catches bad launch configurations at the launch site.
#define FG_LAUNCH_CHECK() FG_CUDA_CHECK(cudaGetLastError())

// True when a CUDA device can be used; never throws (a machine without a driver says false).
bool cuda_available();
// How many GPUs this process sees (CUDA_VISIBLE_DEVICES); 0 without a driver.
int device_count();
// Makes GPU `index` this thread's device (cudaSetDevice) before fusegrad has used any: its
// stream, memory, library handles and device_info() are then that GPU's. A rank of several on a
// host takes the GPU of its LOCAL_RANK this way, every GPU staying visible, so that NCCL can
// reach its peers' memory directly (peer-to-peer over NVLink needs the peer GPU visible).
// Without a call: the device CUDA starts on, 0.
void select_device(int index);

struct DeviceInfo {
    std::string name;
    int sm_count = 0;
    int l2_bytes = 0;
    int max_threads_per_sm = 0;
    int compute_major = 0;          // compute capability, e.g. 9 for Hopper
    int smem_per_block_optin = 0;   // the most dynamic + static shared memory a block may opt into
    int smem_per_sm = 0;            // shared memory of one SM, shared by its resident blocks
    bool cooperative_launch = false;  // grids whose blocks are all resident at once (grid sync)
    std::size_t total_bytes = 0;
};
const DeviceInfo& device_info();

// How many blocks of `kernel` (a __global__ function) with `threads` threads and `smem` bytes of
// dynamic shared memory fit on one SM at once (registers, shared memory and thread limits): what
// a persistent grid is sized from. At least 1. Asked of the driver once per kernel, threads and
// smem, then remembered (so ask after allowing the kernel that much dynamic shared memory).
int resident_blocks_per_sm(const void* kernel, int threads, std::size_t smem);

// Lets `kernel` (a __global__ function) use `bytes` of dynamic shared memory: more than 48 KiB
// needs an opt-in (at most DeviceInfo::smem_per_block_optin, less the kernel's static shared
// memory). Asked of the driver only when a kernel needs more than it was last allowed.
void allow_dynamic_smem(const void* kernel, std::size_t bytes);

// The stream every fusegrad kernel, copy and cuBLAS call is queued on. One stream means the
// caching allocator can reuse a freed block at once: later work is ordered after earlier work.
// While a StreamOverride lives, stream() returns its stream instead, on that thread only (the
// cuBLAS and cuDNN handles keep the stream they were created with: only kernels that ask stream()
// at each launch, as the norm kernels behind capi/ do, follow an override).
cudaStream_t stream();
void synchronize();

// Makes stream() return `s` on this thread until destroyed (overrides nest): how the norm
// kernels' C ABI (capi/fusegrad_norm.h) launches on its caller's stream, PyTorch's current
// stream, rather than on fusegrad's own. `s` may be the null (default) stream.
class StreamOverride {
public:
    explicit StreamOverride(cudaStream_t s);
    ~StreamOverride();
    StreamOverride(const StreamOverride&) = delete;
    StreamOverride& operator=(const StreamOverride&) = delete;

private:
    cudaStream_t previous_;
    bool previous_active_;
};

void* device_malloc(std::size_t bytes);  // nullptr when the device is out of memory
void device_free(void* ptr);
// Bytes the driver can still hand out on the device (cudaMemGetInfo's free).
std::size_t device_free_bytes();
void copy_host_to_device(void* dst, const void* src, std::size_t bytes);
void copy_device_to_host(void* dst, const void* src, std::size_t bytes);  // synchronises
void copy_device_to_device(void* dst, const void* src, std::size_t bytes);
void memset_device(void* dst, int byte, std::size_t bytes);
// Keeps the stream busy for about `microseconds` (one thread spinning on the GPU's clock):
// benchmarks queue it before a timed region, so that the host has queued all of the region's
// launches before its start event is reached and host-side launch cost is not timed.
void busy_wait(double microseconds);

// CUDA graphs. Between begin_capture and end_capture the stream's work is recorded, not run
// (in relaxed capture mode, so that memory can still be allocated); end_capture returns
// the instantiated graph (a cudaGraphExec_t, as an opaque pointer), which launch_graph queues on
// the stream as one unit. abort_capture ends a capture that failed part way and discards it,
// leaving the stream usable; it never throws.
void begin_capture();
void* end_capture();
void abort_capture() noexcept;
bool capturing();
void launch_graph(void* graph);
void destroy_graph(void* graph) noexcept;

// Page-locked host memory: the source of copies that must not synchronise (copy_host_to_device
// waits for its pageable copy; copy_pinned_to_device does not, so `src` must stay unchanged until
// an event recorded after it has completed).
void* pinned_malloc(std::size_t bytes);
void pinned_free(void* ptr) noexcept;
void copy_pinned_to_device(void* dst, const void* src, std::size_t bytes);
// Events on the stream: record marks the point the stream has reached; synchronize waits for it.
void* event_create();
void event_record(void* event);
void event_synchronize(void* event);
void event_destroy(void* event) noexcept;
// An event that also keeps the time it was reached, and the GPU time in milliseconds between two
// such events once both have been reached (it waits for `end`): a step's phase times, say.
void* event_create_timed();
float event_elapsed_ms(void* start, void* end);

// The dropout counters' device-side base. Kernels that draw dropout masks (dropout, the fused
// attention's probabilities, cuDNN's seed) use the counter offset + *base when a base is set,
// offset alone when it is null (the default). A captured training step sets it while it is
// captured, so that the offsets baked into the graph are relative and one small kernel moves the
// base on at every replay.
void set_philox_offset_base(const unsigned long long* base);
const unsigned long long* philox_offset_base();

// Kernels that find bad input (an index out of range) record the first such event here instead of
// trapping; the host reads it at its next synchronisation and throws with the op's name.
enum class DeviceErrorCode : int { none = 0, embedding_index = 1, cross_entropy_target = 2 };
struct DeviceErrorRecord {
    int code;
    int padding;
    long long value;  // the offending index
    long long bound;  // the exclusive upper bound it broke
};
// The record in device memory, zeroed when first created; kernels take this pointer.
DeviceErrorRecord* device_error_record();
// Reads and clears the record (one small copy); called after synchronisations.
DeviceErrorRecord take_device_error();

}  // namespace kernels
}  // namespace fg
