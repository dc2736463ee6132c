// kernels/attention_cudnn_seed.cu: one helper of attention_cudnn.cpp (a C++ file: the cuDNN
// frontend is plain C++). cuDNN's dropout reads its Philox seed and offset from device memory
// (two int64 tensors of shape (1, 1, 1, 1)), and they change at every call. A one-thread kernel
// writes them there in stream order: the values travel as launch arguments, so no host buffer
// has to outlive the call and nothing synchronises (a host-to-device copy from pageable memory
// might). A captured training step moves the offset on at each replay through runtime.h's
// philox_offset_base, which the kernel adds when it is set.
#include <cstdint>

#include "runtime.h"

namespace fg::kernels {

namespace {
__global__ void store_dropout_seed_kernel(std::int64_t* dst, std::int64_t seed,
                                          std::int64_t offset,
                                          const unsigned long long* offset_base) {
    dst[0] = seed;
    dst[1] = offset_base ? static_cast<std::int64_t>(offset + *offset_base) : offset;
}
}  // namespace

// dst[0] = seed, dst[1] = offset (+ the base, when set; their bits as int64), on fusegrad's
// stream.
void store_dropout_seed(std::int64_t* dst, std::uint64_t seed, std::uint64_t offset) {
    store_dropout_seed_kernel<<<1, 1, 0, stream()>>>(dst, static_cast<std::int64_t>(seed),
                                                     static_cast<std::int64_t>(offset),
                                                     philox_offset_base());
    FG_LAUNCH_CHECK();
}

}  // namespace fg::kernels
