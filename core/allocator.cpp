// core/allocator.cpp: see allocator.h.
#include "allocator.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_backend.h"
#include "error.h"

namespace fg {
namespace {

constexpr std::size_t kSmallGranule = 512;
constexpr std::size_t kLargeGranule = 2u << 20;
constexpr std::size_t kLargeThreshold = 1u << 20;


class Pool {
public:
    explicit Pool(Device device) : device_(device) {}

    void* allocate(std::size_t bytes) {
        std::size_t size = allocation_size(bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.allocations;
        void* ptr = nullptr;
        auto it = free_.find(size);
        if (active_graph_pool_ != 0) {
            // No retry after emptying the cache: that synchronises, which a capture forbids.
            // (cudaMalloc itself is allowed: kernels/runtime.h captures in relaxed mode.)
            ptr = graph_allocate(size);
            if (!ptr) out_of_memory(size, " (while capturing a CUDA graph)");
        } else if (it != free_.end() && !it->second.empty()) {
            ptr = take(it->second);
        } else {
            ptr = raw_allocate(size);
            if (!ptr && device_ == Device::cuda) {  // release the cache and try once more
                release_cached_locked();
                ptr = raw_allocate(size);
            }
            if (!ptr) out_of_memory(size, "");
            ++stats_.device_allocations;
            stats_.bytes_reserved += size;
        }
        stats_.bytes_in_use += size;
        if (stats_.bytes_in_use > stats_.peak_bytes_in_use)
            stats_.peak_bytes_in_use = stats_.bytes_in_use;
        return ptr;
    }

    void deallocate(void* ptr, std::size_t bytes) noexcept {
        if (!ptr) return;
        std::size_t size = allocation_size(bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.bytes_in_use -= size;
        if (device_ == Device::cpu) {  // host memory is cheap to get back: no cache
            std::free(ptr);
            stats_.bytes_reserved -= size;
            return;
        }
        try {
            auto owner = graph_owner_.find(ptr);
            if (owner != graph_owner_.end()) graph_free_[owner->second][size].push_back(ptr);
            else free_[size].push_back(ptr);
        } catch (...) {  // no memory for the free list: give the block back instead
            if (CudaBackend* cuda = cuda_backend_or_null()) cuda->free(ptr);
            graph_owner_.erase(ptr);
            stats_.bytes_reserved -= size;
        }
    }

    void release_cached() {
        std::lock_guard<std::mutex> lock(mutex_);
        release_cached_locked();
    }

    MemoryStats stats() {
        std::lock_guard<std::mutex> lock(mutex_);
        MemoryStats out = stats_;
        for (const auto& [id, lists] : graph_free_)
            for (const auto& [size, blocks] : lists) out.graph_pool_free_bytes += size * blocks.size();
        return out;
    }

    void reset_peak() {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }

    int create_graph_pool() {
        std::lock_guard<std::mutex> lock(mutex_);
        return next_graph_pool_++;
    }

    // The pool's free blocks join the shared cache; its blocks in use lose their owner, so they
    // join it when freed.
    void release_graph_pool(int id) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto pool = graph_free_.find(id);
        if (pool != graph_free_.end()) {
            for (auto& [size, blocks] : pool->second)
                free_[size].insert(free_[size].end(), blocks.begin(), blocks.end());
            graph_free_.erase(pool);
        }
        for (auto it = graph_owner_.begin(); it != graph_owner_.end();)
            it = it->second == id ? graph_owner_.erase(it) : std::next(it);
    }

    int set_active_graph_pool(int id) {
        std::lock_guard<std::mutex> lock(mutex_);
        const int previous = active_graph_pool_;
        active_graph_pool_ = id;
        return previous;
    }

private:
    [[noreturn]] void out_of_memory(std::size_t size, const char* when) {
        std::size_t kept = 0;  // free, but kept for CUDA graphs
        for (const auto& [id, lists] : graph_free_)
            for (const auto& [bytes, blocks] : lists) kept += bytes * blocks.size();
        fail("allocator", "out of ", device_name(device_), " memory", when, ": asked for ",
             format_bytes(size), " with ", format_bytes(stats_.bytes_in_use), " in use and ",
             format_bytes(stats_.bytes_reserved), " reserved",
             kept ? " (of which " + format_bytes(kept) + " is kept for a captured CUDA graph's "
                    "step: kernels.cuda_graph=false leaves it to the rest of the run)"
                  : std::string());
    }

    // A block of `size` for the active graph pool: its own free block, else one of the shared
    // cache's, else a fresh one (nullptr when the driver has none); the last two join the pool.
    void* graph_allocate(std::size_t size) {
        auto& own = graph_free_[active_graph_pool_][size];
        if (!own.empty()) return take(own);
        void* ptr = nullptr;
        auto shared = free_.find(size);
        if (shared != free_.end() && !shared->second.empty()) {
            ptr = take(shared->second);
        } else {
            ptr = raw_allocate(size);
            if (!ptr) return nullptr;
            ++stats_.device_allocations;
            stats_.bytes_reserved += size;
        }
        graph_owner_[ptr] = active_graph_pool_;
        return ptr;
    }

    // The last block of a free list, a cache hit.
    void* take(std::vector<void*>& blocks) {
        void* ptr = blocks.back();
        blocks.pop_back();
        ++stats_.cache_hits;
        return ptr;
    }

    void* raw_allocate(std::size_t size) {
        if (device_ == Device::cpu) return std::aligned_alloc(64, size);
        return cuda_backend("allocator").malloc(size);
    }

    void release_cached_locked() {
        if (device_ != Device::cuda) return;
        CudaBackend& cuda = cuda_backend("allocator");
        cuda.synchronize();  // cached blocks may still be read by queued kernels' neighbours
        for (auto& [size, blocks] : free_) {
            for (void* ptr : blocks) cuda.free(ptr);
            stats_.bytes_reserved -= size * blocks.size();
            blocks.clear();
        }
    }

    Device device_;
    std::mutex mutex_;
    std::unordered_map<std::size_t, std::vector<void*>> free_;  // the shared cache
    // Graph pools: the pool of each block a pool holds (in use or free), and each pool's free
    // blocks by size; the pool allocations come from now (0: none, the shared cache).
    std::unordered_map<void*, int> graph_owner_;
    std::unordered_map<int, std::unordered_map<std::size_t, std::vector<void*>>> graph_free_;
    int active_graph_pool_ = 0;
    int next_graph_pool_ = 1;
    MemoryStats stats_;
};

// Never destroyed: tensors that outlive main() may still free into it during static destruction.
Pool& pool(Device device) {
    static Pool* cpu = new Pool(Device::cpu);
    static Pool* cuda = new Pool(Device::cuda);
    return device == Device::cpu ? *cpu : *cuda;
}

}  // namespace

std::size_t allocation_size(std::size_t bytes) {
    if (bytes == 0) bytes = 1;
    std::size_t granule = bytes < kLargeThreshold ? kSmallGranule : kLargeGranule;
    return (bytes + granule - 1) / granule * granule;
}

void* allocate_bytes(Device device, std::size_t bytes) { return pool(device).allocate(bytes); }
void free_bytes(Device device, void* ptr, std::size_t bytes) noexcept {
    pool(device).deallocate(ptr, bytes);
}
MemoryStats memory_stats(Device device) { return pool(device).stats(); }
void reset_peak_memory(Device device) { pool(device).reset_peak(); }

std::size_t available_memory(Device device) {
    if (device == Device::cuda) {
        MemoryStats s = memory_stats(device);
        return cuda_backend("memory").free_bytes() +
               (s.bytes_reserved - s.bytes_in_use - s.graph_pool_free_bytes);
    }
    // /proc/meminfo's "MemAvailable:   123456 kB" (Linux); elsewhere the free physical pages.
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    std::size_t kib = 0;
    while (meminfo >> key >> kib) {
        if (key == "MemAvailable:") return kib * 1024;
        meminfo.ignore(64, '\n');
    }
    return static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) *
           static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}
void empty_cuda_cache() { pool(Device::cuda).release_cached(); }

int create_graph_pool() { return pool(Device::cuda).create_graph_pool(); }
void release_graph_pool(int id) { pool(Device::cuda).release_graph_pool(id); }
GraphMemoryScope::GraphMemoryScope(int id)
    : previous_(pool(Device::cuda).set_active_graph_pool(id)) {}
GraphMemoryScope::~GraphMemoryScope() { pool(Device::cuda).set_active_graph_pool(previous_); }

std::string format_bytes(double b) {
    char buf[64];
    if (b >= 1024.0 * 1024 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.3g TiB", b / (1024.0 * 1024 * 1024 * 1024));
    else if (b >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f TiB", b / (1024.0 * 1024 * 1024 * 1024));
    else if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
    else std::snprintf(buf, sizeof buf, "%.0f B", b);
    return buf;
}

std::string format_memory_stats(const MemoryStats& s) {
    double hit = s.allocations ? 100.0 * s.cache_hits / s.allocations : 0.0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "in use %s (peak %s), reserved %s, %zu allocations, "
                  "%zu fresh blocks (malloc or cudaMalloc), %.1f%% from cache",
                  format_bytes(s.bytes_in_use).c_str(), format_bytes(s.peak_bytes_in_use).c_str(),
                  format_bytes(s.bytes_reserved).c_str(), s.allocations, s.device_allocations, hit);
    return buf;
}

}  // namespace fg
