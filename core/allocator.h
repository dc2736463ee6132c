// core/allocator.h: where tensor memory comes from.
// CUDA: a caching allocator. Sizes are rounded up (512 B granules below 1 MiB, 2 MiB granules
// above) and a freed block goes onto the free list of its rounded size instead of back to
// cudaFree, so a training loop that allocates the same shapes every step reaches a steady state
// with no cudaMalloc at all. All work runs on one stream, so a freed block is safe to hand out
// again at once (later kernels are ordered after the ones that used it).
// CPU: 64-byte aligned host memory, with the same counters.
#pragma once

#include <cstddef>
#include <string>

#include "dtype.h"

namespace fg {

struct MemoryStats {
    std::size_t bytes_in_use = 0;       // held by live tensors (rounded sizes)
    std::size_t peak_bytes_in_use = 0;  // high-water mark since the last reset_peak
    std::size_t bytes_reserved = 0;     // obtained from the driver (in use + cached)
    std::size_t allocations = 0;        // allocate() calls
    std::size_t cache_hits = 0;         // allocate() calls served from the cache
    std::size_t device_allocations = 0; // fresh blocks from the underlying malloc / cudaMalloc
    std::size_t graph_pool_free_bytes = 0;  // cached, unused, but kept for CUDA graphs' pools
};

void* allocate_bytes(Device device, std::size_t bytes);
// What a request of `bytes` occupies: its size rounded up to the allocator's granule.
std::size_t allocation_size(std::size_t bytes);
void free_bytes(Device device, void* ptr, std::size_t bytes) noexcept;

MemoryStats memory_stats(Device device);
// What a new allocation on `device` can still get: on the CPU the kernel's MemAvailable (free
// memory plus reclaimable caches); on CUDA the driver's free memory plus this allocator's cached,
// unused blocks (not those kept for a CUDA graph's pool).
std::size_t available_memory(Device device);
void reset_peak_memory(Device device);
// Returns every cached, unused CUDA block to the driver.
void empty_cuda_cache();

// A CUDA graph's private memory (a captured training step's). While a GraphMemoryScope is open,
// CUDA allocations are served from the pool's own blocks (or, when it has none of the size, from
// the shared cache or the driver, the block then joining the pool), and a pool's block that is
// freed, whenever that happens, returns to the pool, never to the shared cache. So the addresses a
// graph was captured with stay the graph's across its replays, whatever else runs between them.
// Pools are numbered from 1; release_graph_pool hands the pool's free blocks back to the shared
// cache (call it once the graph is destroyed and its last replay has finished) and its blocks
// still in use join the shared cache when they are freed.
int create_graph_pool();
void release_graph_pool(int pool);
class GraphMemoryScope {
public:
    explicit GraphMemoryScope(int pool);
    ~GraphMemoryScope();
    GraphMemoryScope(const GraphMemoryScope&) = delete;
    GraphMemoryScope& operator=(const GraphMemoryScope&) = delete;

private:
    int previous_;
};
// "in use 12.0 MiB (peak 40.5 MiB), reserved 64.0 MiB, 1200 allocations, 18 fresh blocks (malloc
// or cudaMalloc), 98.5% from cache"
std::string format_memory_stats(const MemoryStats& stats);
// "512 B", "1.5 KiB", "40.5 MiB", "1.52 GiB", "2.00 TiB", "8.67e+06 TiB": a double, so that an
// estimate past 2^64 bytes prints as what it is, not as a wrapped-around size.
std::string format_bytes(double bytes);

}  // namespace fg
