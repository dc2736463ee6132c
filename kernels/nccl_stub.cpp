// kernels/nccl_stub.cpp: nccl.h in a build without NCCL: every call says so.
#include <stdexcept>

#include "nccl.h"

namespace fg::kernels {
namespace {
[[noreturn]] void missing() { throw std::runtime_error("[nccl] " + nccl_unavailable()); }
}  // namespace

std::string nccl_unavailable() {
    return "this fusegrad was built without NCCL (configure with -DFG_NCCL=ON where NCCL is "
           "installed: the CUDA toolkit's, or pip's nvidia-nccl-cu13)";
}
std::string nccl_version() { return ""; }
std::vector<std::uint8_t> nccl_unique_id() { missing(); }
void* nccl_communicator(const std::vector<std::uint8_t>&, int, int) { missing(); }
void nccl_destroy(void*) noexcept {}
void nccl_all_reduce_sum(void*, void*, std::size_t, ScalarType) { missing(); }
void nccl_reduce_scatter_sum(void*, const void*, void*, std::size_t, ScalarType) { missing(); }
void nccl_all_gather(void*, const void*, void*, std::size_t, ScalarType) { missing(); }
void nccl_join(void*) { missing(); }
void nccl_synchronize(void*, double, const std::function<std::string()>&) { missing(); }
void nccl_wait(void*, void*, double, const std::function<std::string()>&) { missing(); }

}  // namespace fg::kernels
