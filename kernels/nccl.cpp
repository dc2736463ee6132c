// kernels/nccl.cpp: see nccl.h (the build with NCCL).
#include "nccl.h"

#include <nccl.h>

#include <cstring>
#include <stdexcept>

#include "runtime.h"

namespace fg::kernels {
namespace {

void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
        throw CudaError(std::string("[nccl] ") + what + " failed: " + ncclGetErrorString(r) +
                        (r == ncclSystemError || r == ncclRemoteError
                             ? " (did another rank stop? NCCL_DEBUG=WARN says more)"
                             : ""));
}

ncclDataType_t nccl_type(ScalarType t) {
    if (t == ScalarType::f32) return ncclFloat32;
    if (t == ScalarType::bf16) return ncclBfloat16;
    if (t == ScalarType::f16) return ncclFloat16;
    throw std::invalid_argument("[nccl] sums f32, bf16 or f16 values only");
}

}  // namespace

std::string nccl_unavailable() { return ""; }

std::string nccl_version() {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "";
    // NCCL 2.9 and later: major * 10000 + minor * 100 + patch.
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
}

std::vector<std::uint8_t> nccl_unique_id() {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&id);
    return std::vector<std::uint8_t>(bytes, bytes + sizeof id);
}

void* nccl_communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank) {
    ncclUniqueId id;
    if (unique_id.size() != sizeof id)
        throw std::invalid_argument("[nccl] the unique id has " + std::to_string(unique_id.size()) +
                                    " bytes, NCCL's has " + std::to_string(sizeof id));
    std::memcpy(&id, unique_id.data(), sizeof id);
    ncclComm_t comm = nullptr;
    check(ncclCommInitRank(&comm, world_size, id, rank), "ncclCommInitRank");
    return comm;
}

void nccl_destroy(void* communicator) noexcept {
    if (communicator) ncclCommDestroy(static_cast<ncclComm_t>(communicator));
}

void nccl_all_reduce_sum(void* communicator, void* data, std::size_t count, ScalarType type) {
    if (count == 0) return;
    check(ncclAllReduce(data, data, count, nccl_type(type), ncclSum,
                        static_cast<ncclComm_t>(communicator), stream()),
          "ncclAllReduce");
}

}  // namespace fg::kernels
