// kernels/attention_cudnn.cpp: see attention_cudnn.h. cuDNN's fused attention through the
// frontend's graph API, in four steps per call:
//   1. describe the call as a graph: the input tensors (shape, strides, a uid each), one sdpa or
//      sdpa_backward node with its options (causal mask, scale, dropout), the outputs;
//   2. build it: validate, lower to cuDNN's operation graph, ask the heuristics for execution
//      plans, keep the first one this GPU supports. Slow (a fraction of a second), so each graph
//      is built once per shape and strides, type, scale, dropout probability, direction and
//      whether the statistics are written, and cached;
//   3. before each run, write the dropout's seed and offset into device memory (a one-thread
//      kernel, attention_cudnn_seed.cu);
//   4. execute: bind every uid to its pointer (a "variant pack") and launch on the handle's
//      stream, which is fusegrad's.
// Errors (cuDNN failing to start, a graph it cannot build or run) are CudaErrors carrying
// cuDNN's or the frontend's message.
#include "attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "runtime.h"

namespace fg::kernels {

// attention_cudnn_seed.cu: dst[0] = seed, dst[1] = offset on fusegrad's stream.
void store_dropout_seed(std::int64_t* dst, std::uint64_t seed, std::uint64_t offset);

namespace {

namespace fe = cudnn_frontend;

[[noreturn]] void fail(const std::string& what) {
    throw CudaError("[attention_cudnn] " + what);
}

// cuDNN's text for a status, with its last detailed message when it left one.
std::string cudnn_message(cudnnStatus_t status) {
    std::string msg = cudnnGetErrorString(status);
    char detail[1024] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    if (detail[0] != '\0') msg += std::string(" (") + detail + ")";
    return msg;
}

void check(const fe::error_object& e, const char* step) {
    if (e.is_bad()) fail(std::string(step) + ": " + e.err_msg);
}

// The one cuDNN handle, bound to fusegrad's stream; or why there is none.
struct CudnnState {
    cudnnHandle_t handle = nullptr;
    std::string error;  // empty when the handle works
};

const CudnnState& cudnn_state() {
    static const CudnnState state = [] {
        CudnnState s;
        if (!cuda_available()) {
            s.error = "no CUDA device is available";
            return s;
        }
        const DeviceInfo& dev = device_info();
        if (dev.compute_major < 8) {
            s.error = "cuDNN's fused attention needs an Ampere (sm_80) or newer GPU; " + dev.name +
                      " is sm_" + std::to_string(dev.compute_major) + "x";
            return s;
        }
        cudnnStatus_t status = cudnnCreate(&s.handle);
        if (status == CUDNN_STATUS_SUCCESS) status = cudnnSetStream(s.handle, stream());
        if (status != CUDNN_STATUS_SUCCESS) {
            s.error = "cuDNN " + std::to_string(cudnnGetVersion()) +
                      " did not start: " + cudnn_message(status) +
                      " (is the folder of libcudnn.so.9 and its sub-libraries on LD_LIBRARY_PATH?)";
            s.handle = nullptr;
        }
        return s;
    }();
    return state;
}

cudnnHandle_t handle() {
    const CudnnState& s = cudnn_state();
    if (!s.handle) fail(s.error);
    return s.handle;
}

// Tensor uids in the graphs' variant packs.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeed, kOffset };

fe::DataType_t io_type(ScalarType t) {
    return t == ScalarType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

std::uint32_t bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// What makes two calls need different graphs (pointers and seeds are bound at execution).
struct GraphKey {
    int type;
    long long b, h, t, d, stride_b, stride_h, stride_t, out_stride_b, out_stride_h, out_stride_t;
    std::uint32_t scale, p;
    bool stats, backward;
    auto tied() const {
        return std::tie(type, b, h, t, d, stride_b, stride_h, stride_t, out_stride_b,
                        out_stride_h, out_stride_t, scale, p, stats, backward);
    }
    bool operator<(const GraphKey& o) const { return tied() < o.tied(); }
};

struct BuiltGraph {
    std::shared_ptr<fe::graph::Graph> graph;
    std::size_t cudnn_workspace = 0;  // bytes, at the start of the caller's workspace
    std::size_t seed_at = 0;          // byte offset of the seed and offset (int64 each), p > 0
    std::size_t total = 0;            // what the caller allocates
};

bool has_dropout(const CudnnAttentionArgs& a) {
    return a.p > 0.0f;
}

// Q, K, V (or dQ, dK, dV): (B, H, T, D) with the call's strides.
std::vector<std::int64_t> dims(const CudnnAttentionArgs& a) {
    return {a.b, a.h, a.t, a.d};
}
std::vector<std::int64_t> qkv_strides(const CudnnAttentionArgs& a) {
    return {a.stride_b, a.stride_h, a.stride_t, 1};
}
// O and dO: the call's strides, or contiguous (B, H, T, D) where it gives none.
std::vector<std::int64_t> out_strides(const CudnnAttentionArgs& a) {
    if (a.out_stride_b == 0) return {a.h * a.t * a.d, a.t * a.d, a.d, 1};
    return {a.out_stride_b, a.out_stride_h, a.out_stride_t, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    std::vector<std::int64_t> dim,
                                                    std::vector<std::int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(std::move(dim))
                        .set_stride(std::move(stride)));
}

// The log-sum-exp per row: fp32 (B, H, T, 1).
fe::graph::Tensor_attributes& as_stats(fe::graph::Tensor_attributes& t,
                                       const CudnnAttentionArgs& a) {
    return t.set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({a.b, a.h, a.t, 1})
        .set_stride({a.h * a.t, a.t, 1, 1});
}

// Dropout's seed and offset: one int64 each, in device memory.
std::pair<std::shared_ptr<fe::graph::Tensor_attributes>,
          std::shared_ptr<fe::graph::Tensor_attributes>>
seed_and_offset(fe::graph::Graph& g) {
    auto scalar = [&](const char* name, Uid uid) {
        return g.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT64));
    };
    return {scalar("seed", kSeed), scalar("offset", kOffset)};
}

// Step 1: the graph of a forward or backward call.
std::shared_ptr<fe::graph::Graph> describe(const CudnnAttentionArgs& a, bool backward) {
    auto g = std::make_shared<fe::graph::Graph>();
    // Storage bf16 / f16; scores, softmax and accumulation fp32.
    g->set_io_data_type(io_type(a.type))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = input(*g, "q", kQ, dims(a), qkv_strides(a));
    auto k = input(*g, "k", kK, dims(a), qkv_strides(a));
    auto v = input(*g, "v", kV, dims(a), qkv_strides(a));
    if (!backward) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("causal_attention")
                       .set_generate_stats(a.stats != nullptr)
                       .set_causal_mask(true)
                       .set_attn_scale(a.scale);
        if (has_dropout(a)) {
            auto [seed, offset] = seed_and_offset(*g);
            opt.set_dropout(a.p, seed, offset);
        }
        auto [o, stats] = g->sdpa(q, k, v, opt);
        o->set_output(true).set_uid(kO).set_dim(dims(a)).set_stride(out_strides(a));
        if (a.stats) as_stats(stats->set_output(true), a);
        return g;
    }
    auto o = input(*g, "o", kO, dims(a), out_strides(a));
    auto dout = input(*g, "dout", kDO, dims(a), out_strides(a));
    auto stats = g->tensor(as_stats(fe::graph::Tensor_attributes().set_name("stats"), a));
    // Not cuDNN's deterministic algorithm: on Hopper it stages dP in a (B, H, T, T) workspace,
    // the very buffer flash attention avoids. So dQ, summed over key blocks with fp32 atomics,
    // may differ in its last bits from run to run; dK and dV (one block of keys per thread
    // block) and the forward do not.
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("causal_attention_backward")
                   .set_causal_mask(true)
                   .set_attn_scale(a.scale)
                   .set_deterministic_algorithm(false);
    if (has_dropout(a)) {
        auto [seed, offset] = seed_and_offset(*g);
        opt.set_dropout(a.p, seed, offset);
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
    dq->set_output(true).set_uid(kDQ).set_dim(dims(a)).set_stride(qkv_strides(a));
    dk->set_output(true).set_uid(kDK).set_dim(dims(a)).set_stride(qkv_strides(a));
    dv->set_output(true).set_uid(kDV).set_dim(dims(a)).set_stride(qkv_strides(a));
    return g;
}

std::string describe_call(const CudnnAttentionArgs& a, bool backward) {
    return std::string(backward ? "backward" : "forward") + " of (B, H, T, D) = (" +
           std::to_string(a.b) + ", " + std::to_string(a.h) + ", " + std::to_string(a.t) + ", " +
           std::to_string(a.d) + "), " + (a.type == ScalarType::f16 ? "f16" : "bf16") +
           ", dropout " + std::to_string(a.p) +
           (a.out_stride_b != 0 ? ", q k v and O strided in (B, T, 3, H, D) and (B, T, H, D)"
                                : "");
}

// Steps 1 and 2, once per key.
const BuiltGraph& graph_for(const CudnnAttentionArgs& a, bool backward) {
    if (a.type != ScalarType::bf16 && a.type != ScalarType::f16)
        fail("q, k and v must be bf16 or f16");
    if (a.b <= 0 || a.h <= 0 || a.t <= 0 || a.d <= 0) fail("empty shape");
    if (!(a.p >= 0.0f && a.p < 1.0f)) fail("dropout p must be in [0, 1)");
    const GraphKey key{static_cast<int>(a.type),
                       a.b,
                       a.h,
                       a.t,
                       a.d,
                       a.stride_b,
                       a.stride_h,
                       a.stride_t,
                       a.out_stride_b,
                       a.out_stride_h,
                       a.out_stride_t,
                       bits(a.scale),
                       bits(a.p),
                       backward || a.stats != nullptr,
                       backward};
    static std::map<GraphKey, BuiltGraph> cache;
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;

    cudnnHandle_t h = handle();
    BuiltGraph built;
    built.graph = describe(a, backward);
    const std::string what = describe_call(a, backward);
    fe::graph::Graph& g = *built.graph;
    check(g.validate(), ("validate " + what).c_str());
    check(g.build_operation_graph(h), ("build_operation_graph " + what).c_str());
    check(g.create_execution_plans({fe::HeurMode_t::A}),
          ("create_execution_plans " + what).c_str());
    check(g.check_support(), ("check_support " + what).c_str());
    check(g.build_plans(), ("build_plans " + what).c_str());
    std::int64_t ws = 0;
    check(g.get_workspace_size(ws), ("get_workspace_size " + what).c_str());
    built.cudnn_workspace = static_cast<std::size_t>(ws);
    built.seed_at = (built.cudnn_workspace + 15) / 16 * 16;
    built.total = built.seed_at + (has_dropout(a) ? 2 * sizeof(std::int64_t) : 0);
    return cache.emplace(key, std::move(built)).first->second;
}

// Steps 3 and 4.
void run(const CudnnAttentionArgs& a, bool backward, std::unordered_map<std::int64_t, void*> pack) {
    const BuiltGraph& built = graph_for(a, backward);
    if (built.total > 0 && !a.workspace)
        fail("workspace missing (cudnn_attention_workspace_bytes)");
    if (has_dropout(a)) {
        auto* seed =
            reinterpret_cast<std::int64_t*>(static_cast<char*>(a.workspace) + built.seed_at);
        store_dropout_seed(seed, a.seed, a.offset);
        pack[kSeed] = seed;
        pack[kOffset] = seed + 1;
    }
    check(built.graph->execute(handle(), pack, a.workspace),
          ("execute " + describe_call(a, backward)).c_str());
}

}  // namespace

bool cudnn_attention_built() {
    return true;
}

std::string cudnn_attention_unsupported(ScalarType type, long long head_dim) {
    const CudnnState& s = cudnn_state();
    if (!s.handle) return s.error;
    if (type != ScalarType::bf16 && type != ScalarType::f16)
        return "cuDNN's fused attention takes bf16 or f16 tensors";
    if (head_dim % 8 != 0 || head_dim > 128 || head_dim <= 0)
        return "cuDNN's fused attention takes head sizes D that are multiples of 8 up to 128, "
               "not " +
               std::to_string(head_dim);
    return "";
}

std::size_t cudnn_attention_workspace_bytes(const CudnnAttentionArgs& a, bool backward) {
    return graph_for(a, backward).total;
}

void cudnn_attention_forward(const CudnnAttentionArgs& a) {
    std::unordered_map<std::int64_t, void*> pack{{kQ, const_cast<void*>(a.q)},
                                                 {kK, const_cast<void*>(a.k)},
                                                 {kV, const_cast<void*>(a.v)},
                                                 {kO, a.out}};
    if (a.stats) pack[kStats] = a.stats;
    run(a, false, std::move(pack));
}

void cudnn_attention_backward(const CudnnAttentionArgs& a) {
    if (!a.stats) fail("the backward needs the forward's stats");
    run(a, true,
        {{kQ, const_cast<void*>(a.q)},
         {kK, const_cast<void*>(a.k)},
         {kV, const_cast<void*>(a.v)},
         {kO, a.out},
         {kStats, a.stats},
         {kDO, const_cast<void*>(a.dout)},
         {kDQ, a.dq},
         {kDK, a.dk},
         {kDV, a.dv}});
}

}  // namespace fg::kernels
