// kernels/nccl.cpp: see nccl.h (the build with NCCL).
#include "nccl.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

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
    if (t == ScalarType::i32) return ncclInt32;
    throw std::invalid_argument("[nccl] exchanges f32, bf16, f16 or i32 values only");
}

// What nccl_communicator hands out: NCCL's communicator, the stream its collectives run on, and
// the events that order that stream after fusegrad's and fusegrad's after it.
struct Communicator {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t queued = nullptr;  // recorded on fusegrad's stream before each collective
    cudaEvent_t done = nullptr;    // recorded on the communicator's stream at nccl_join
    cudaEvent_t drained = nullptr;  // recorded on fusegrad's stream by nccl_wait
    bool aborted = false;
};

Communicator& unwrap(void* communicator) {
    if (communicator == nullptr) throw std::invalid_argument("[nccl] no communicator");
    Communicator& c = *static_cast<Communicator*>(communicator);
    if (c.aborted) throw CudaError("[nccl] the communicator was aborted after an earlier error");
    return c;
}

// The communicator's stream waits for everything queued on fusegrad's stream so far.
cudaStream_t after_fusegrad(Communicator& c) {
    FG_CUDA_CHECK(cudaEventRecord(c.queued, stream()));
    FG_CUDA_CHECK(cudaStreamWaitEvent(c.stream, c.queued, 0));
    return c.stream;
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
    auto c = std::make_unique<Communicator>();
    FG_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    FG_CUDA_CHECK(cudaEventCreateWithFlags(&c->queued, cudaEventDisableTiming));
    FG_CUDA_CHECK(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
    FG_CUDA_CHECK(cudaEventCreateWithFlags(&c->drained, cudaEventDisableTiming));
    try {
        check(ncclCommInitRank(&c->comm, world_size, id, rank), "ncclCommInitRank");
    } catch (...) {
        nccl_destroy(c.release());
        throw;
    }
    return c.release();
}

void nccl_destroy(void* communicator) noexcept {
    if (!communicator) return;
    auto* c = static_cast<Communicator*>(communicator);
    if (c->comm) {
        // ncclCommDestroy finishes what is queued first, which hangs if a peer is gone.
        const bool idle = c->stream && cudaStreamQuery(c->stream) == cudaSuccess;
        if (idle && !c->aborted)
            ncclCommDestroy(c->comm);
        else
            ncclCommAbort(c->comm);
    }
    if (c->drained) cudaEventDestroy(c->drained);
    if (c->done) cudaEventDestroy(c->done);
    if (c->queued) cudaEventDestroy(c->queued);
    if (c->stream) cudaStreamDestroy(c->stream);
    delete c;
}

void nccl_all_reduce_sum(void* communicator, void* data, std::size_t count, ScalarType type) {
    if (count == 0) return;
    Communicator& c = unwrap(communicator);
    check(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, c.comm, after_fusegrad(c)),
          "ncclAllReduce");
}

void nccl_reduce_scatter_sum(void* communicator, const void* in, void* out, std::size_t count,
                             ScalarType type) {
    if (count == 0) return;
    Communicator& c = unwrap(communicator);
    check(ncclReduceScatter(in, out, count, nccl_type(type), ncclSum, c.comm, after_fusegrad(c)),
          "ncclReduceScatter");
}

void nccl_all_gather(void* communicator, const void* in, void* out, std::size_t count,
                     ScalarType type) {
    if (count == 0) return;
    Communicator& c = unwrap(communicator);
    check(ncclAllGather(in, out, count, nccl_type(type), c.comm, after_fusegrad(c)),
          "ncclAllGather");
}

void nccl_join(void* communicator) {
    Communicator& c = unwrap(communicator);
    FG_CUDA_CHECK(cudaEventRecord(c.done, c.stream));
    FG_CUDA_CHECK(cudaStreamWaitEvent(stream(), c.done, 0));
}

namespace {

// A rank that gives up on the others may not get its error out: with collectives queued inside
// a captured step's replays, ncclCommAbort can wait for them forever (they wait for the lost
// rank; docs/ARCHITECTURE.md, "When a rank fails"). So the process ends itself, saying why,
// unless `aborted` is set within 5 s.
void exit_unless_aborted(const std::string& why, std::shared_ptr<std::atomic<bool>> aborted) {
    std::thread([why, aborted] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        if (*aborted) return;
        std::fprintf(stderr, "error: [nccl] %s; aborting the collectives did not end in 5 s "
                     "(a captured step's replays wait in them): the process ends without "
                     "them\n", why.c_str());
        std::_Exit(1);
    }).detach();
}

// The host waits until `event` has happened, checking NCCL's error state, `peers_lost` and the
// time: on an error, a lost peer or after timeout_s, the communicator is aborted (its kernels
// stop) and an error says why.
void wait_for(Communicator& c, cudaEvent_t event, double timeout_s,
              const std::function<std::string()>& peers_lost) {
    const auto give_up = [&c](const std::string& why) {
        auto aborted = std::make_shared<std::atomic<bool>>(false);
        exit_unless_aborted(why, aborted);
        ncclCommAbort(c.comm);
        *aborted = true;
        c.comm = nullptr;
        c.aborted = true;
        throw CudaError("[nccl] " + why + "; the communicator was aborted");
    };
    const auto start = std::chrono::steady_clock::now();
    // Short naps: the GPU idles from the exchange's end until this loop notices it and the host
    // queues the update, so a nap is time lost every step (a poll costs a few microseconds).
    auto nap = std::chrono::microseconds(10);
    for (;;) {
        const cudaError_t done = cudaEventQuery(event);
        if (done == cudaSuccess) return;
        if (done != cudaErrorNotReady) FG_CUDA_CHECK(done);
        ncclResult_t async = ncclSuccess;
        check(ncclCommGetAsyncError(c.comm, &async), "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress)
            give_up(std::string("a collective failed: ") + ncclGetErrorString(async) +
                    " (did another rank stop?)");
        if (peers_lost) {
            const std::string lost = peers_lost();
            if (!lost.empty()) give_up("the exchange cannot finish: " + lost);
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            timeout_s)
            give_up("the ranks' exchange did not finish in " +
                    std::to_string(static_cast<int>(timeout_s)) +
                    " s (did another rank stop or hang?)");
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(100));
    }
}

}  // namespace

void nccl_synchronize(void* communicator, double timeout_s,
                      const std::function<std::string()>& peers_lost) {
    nccl_join(communicator);
    Communicator& c = unwrap(communicator);
    wait_for(c, c.done, timeout_s, peers_lost);
}

void nccl_wait(void* communicator, void* event, double timeout_s,
               const std::function<std::string()>& peers_lost) {
    Communicator& c = unwrap(communicator);
    cudaEvent_t e = static_cast<cudaEvent_t>(event);
    if (e == nullptr) {
        FG_CUDA_CHECK(cudaEventRecord(c.drained, stream()));
        e = c.drained;
    }
    wait_for(c, e, timeout_s, peers_lost);
}

}  // namespace fg::kernels
