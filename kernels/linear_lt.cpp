// kernels/linear_lt.cpp: see linear_lt.h. cuBLASLt is column-major, so (as in matmul.cu) a
// row-major (R, C) matrix is passed as the column-major (C, R) one:
//
//   plain:    C^T (N x M) = op(B)^T op(A)^T: A = B as stored (N x K, ld N; or K x N, ld K with
//             TRANSA = T when trans_b), B = A as stored (K x M, ld K; or M x K, ld M with TRANSB
//             = T when trans_a), D = C (N x M, ld N) in the inputs' type or f32.
//   forward:  y^T (N x M) = op(w^T) x^T with w^T stored (K x N, ld K), op = transpose, so
//             A = w (TRANSA = T), B = x (K x M, ld K), D = y (N x M, ld N). EPILOGUE_BIAS adds the
//             bias, one value per row of D, which is one per output feature.
//   GELU:     the forward's layout with EPILOGUE_GELU_AUX_BIAS: D gets gelu(product + bias) and
//             the auxiliary matrix (the same layout, ld N) product + bias.
//   input:    dx^T (K x M) = w^T dy^T with w^T stored (K x N, ld K) and dy^T stored (N x M, ld N),
//             so A = w, B = dy, no transposes, D = dx (K x M, ld K). EPILOGUE_DGELU multiplies
//             each element by gelu' of the auxiliary matrix (the pre-activation, ld K) before D
//             is rounded.
//
// A plan (the descriptors and the algorithm chosen) is kept per call kind, type, shape, operand
// alignment and way of choosing, so later calls only set the bias and auxiliary pointers and
// launch.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "linear_lt.h"
#include "runtime.h"

// A caller's bug (the op checks these first), not a refusal.
#define FG_ASSERT_LT(cond)                                                                   \
    do {                                                                                     \
        if (!(cond)) throw CudaError(std::string("[cublasLt] linear: bad call: ") + #cond); \
    } while (0)

namespace fg::kernels {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt's Hopper kernels ask at most
// How many of the heuristic's candidates an autotuned plan times (bench_gemm --algorithms: at
// GPT-2 small's shapes the fastest of eight was up to 12% faster than the first).
constexpr int kCandidates = 8;

cublasLtHandle_t handle() {
    static cublasLtHandle_t h = [] {
        cublasLtHandle_t created = nullptr;
        FG_CUBLAS_CHECK(cublasLtCreate(&created));
        return created;
    }();
    return h;
}

void* workspace() {
    static void* buffer = [] {
        void* p = device_malloc(kWorkspaceBytes);
        if (!p) throw CudaError("[cublasLt] cannot allocate its 32 MiB workspace: out of memory");
        return p;
    }();
    return buffer;
}

// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume of it.
std::uint32_t alignment(const void* p) {
    std::uint32_t a = 256;
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
    return a;
}

cudaDataType_t cuda_type(ScalarType type) {
    return type == ScalarType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

enum class Kind { plain, forward, forward_gelu, input_grad_dgelu };

struct Plan {
    bool usable = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first by its guess
};

// (kind, type, m, n, k, alignments of the operands, the bias and the auxiliary matrix, the plain
// kind's transposes and output type, autotune)
using Key = std::tuple<int, int, long long, long long, long long, std::uint32_t, std::uint32_t,
                       std::uint32_t, std::uint32_t, std::uint32_t, int, bool>;

// One call: D = op(A) op(B) with the kind's epilogue, which reads `bias` and reads or writes `aux`.
struct Call {
    Kind kind;
    ScalarType type;
    long long m, n, k;
    const void *a, *b;
    void* d;
    const void* bias;
    const void* aux;
    bool autotune;
    bool trans_a = false, trans_b = false, f32_out = false;  // the plain kind's
};

void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const void* value,
         std::size_t bytes) {
    FG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, what, value, bytes));
}

// The epilogue's auxiliary matrix and bias pointers on the descriptor (cuBLASLt's heuristic reads
// their alignment from them, so they are set before it runs and again at every launch).
void set_pointers(const Plan& p, const Call& c) {
    if (c.kind == Kind::forward || c.kind == Kind::forward_gelu)
        set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias));
    if (c.kind == Kind::forward_gelu || c.kind == Kind::input_grad_dgelu)
        set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof(c.aux));
}

// Makes the plan for a call: the operation, the three matrix layouts (C is D: beta = 0), and
// the heuristic's first algorithm for them (and, to autotune, its next ones), or usable = false
// where it has none. Throws (leaving nothing kept) if cuBLASLt fails otherwise.
Plan make_plan(const Call& c) {
    Plan p;
    const cudaDataType_t ab = cuda_type(c.type);
    const long long m = c.m, n = c.n, k = c.k;
    const bool forward = c.kind == Kind::forward || c.kind == Kind::forward_gelu;
    FG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const bool plain = c.kind == Kind::plain;
    cublasOperation_t trans_a = forward || (plain && c.trans_b) ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t trans_b = plain && c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
    cublasLtEpilogue_t epilogue = c.kind == Kind::forward        ? CUBLASLT_EPILOGUE_BIAS
                                  : c.kind == Kind::forward_gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : plain                        ? CUBLASLT_EPILOGUE_DEFAULT
                                                                 : CUBLASLT_EPILOGUE_DGELU;
    set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    if (forward) set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ab, sizeof(ab));
    if (c.kind == Kind::forward_gelu || c.kind == Kind::input_grad_dgelu) {
        // The pre-activation, laid out as D (its leading dimension is D's rows).
        const std::int64_t aux_ld = c.kind == Kind::forward_gelu ? n : k;
        set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    }
    set_pointers(p, c);

    // The matrices as stored (before TRANSA / TRANSB), column-major: rows, columns, leading dim.
    if (plain) {
        FG_CUBLAS_CHECK(c.trans_b ? cublasLtMatrixLayoutCreate(&p.a, ab, k, n, k)
                                  : cublasLtMatrixLayoutCreate(&p.a, ab, n, k, n));  // B
        FG_CUBLAS_CHECK(c.trans_a ? cublasLtMatrixLayoutCreate(&p.b, ab, m, k, m)
                                  : cublasLtMatrixLayoutCreate(&p.b, ab, k, m, k));  // A
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, c.f32_out ? CUDA_R_32F : ab, n, m, n));
    } else if (forward) {
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, k, n, k));  // w^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, k, m, k));  // x^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, ab, n, m, n));  // y^T
    } else {
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, k, n, k));  // w^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, n, m, n));  // dy^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, ab, k, m, k));  // dx^T
    }

    cublasLtMatmulPreference_t pref = nullptr;
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t ws = kWorkspaceBytes;
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const std::uint32_t align_a = alignment(c.a), align_b = alignment(c.b),
                        align_d = alignment(c.d);
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(c.autotune ? kCandidates : 1);
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle(), p.desc, p.a, p.b, p.d, p.d, pref, static_cast<int>(results.size()),
        results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
    for (int i = 0; p.usable && i < found; ++i) p.candidates.push_back(results[i].algo);
    if (p.usable) p.algo = p.candidates[0];
    return p;
}

// Autotuning: times each candidate on the call's own operands (twice, three launches each, the
// faster of the two kept) and keeps the fastest. D (and the GELU forward's auxiliary matrix) is
// written over by each launch, and the call's own launch follows, so nothing else changes. Not
// while the stream is being captured into a CUDA graph, where nothing runs: the plan then keeps
// the heuristic's first (a captured step's shapes were met by the eager step before it).
void autotune(Plan& p, const Call& c, void* ws) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FG_CUDA_CHECK(cudaStreamIsCapturing(stream(), &capturing));
    if (p.candidates.size() < 2 || capturing != cudaStreamCaptureStatusNone) return;
    const float alpha = 1.0f, beta = 0.0f;
    struct Events {  // destroyed on every way out
        cudaEvent_t start = nullptr, stop = nullptr;
        ~Events() {
            if (start) cudaEventDestroy(start);
            if (stop) cudaEventDestroy(stop);
        }
    } e;
    FG_CUDA_CHECK(cudaEventCreate(&e.start));
    FG_CUDA_CHECK(cudaEventCreate(&e.stop));
    std::vector<float> best(p.candidates.size(), 1e30f);
    for (int round = 0; round < 2; ++round) {
        for (std::size_t i = 0; i < p.candidates.size(); ++i) {
            auto launch = [&] {
                return cublasLtMatmul(handle(), p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d,
                                      p.d, c.d, p.d, &p.candidates[i], ws, kWorkspaceBytes,
                                      stream());
            };
            if (launch() != CUBLAS_STATUS_SUCCESS) {  // a candidate that cannot run
                cudaGetLastError();  // leaves no launch error for a later check to misname
                continue;
            }
            FG_CUDA_CHECK(cudaEventRecord(e.start, stream()));
            for (int r = 0; r < 3; ++r) FG_CUBLAS_CHECK(launch());
            FG_CUDA_CHECK(cudaEventRecord(e.stop, stream()));
            FG_CUDA_CHECK(cudaEventSynchronize(e.stop));
            float ms = 0.0f;
            FG_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
            best[i] = std::min(best[i], ms);
        }
    }
    std::size_t fastest = 0;
    for (std::size_t i = 1; i < best.size(); ++i)
        if (best[i] < best[fastest]) fastest = i;
    p.algo = p.candidates[fastest];
}

// The call with the plan's epilogue. Plans are kept per key for the process (a handful a model:
// one per layer shape and batch); the lock covers the lookup, the pointers set on the shared
// descriptor and the launch that reads them.
bool run(const Call& c) {
    FG_ASSERT_LT(c.type == ScalarType::bf16 || c.type == ScalarType::f16);
    FG_ASSERT_LT(c.m > 0 && c.n > 0 && c.k > 0);
    static std::map<Key, Plan> plans;
    static std::mutex guard;
    std::lock_guard<std::mutex> lock(guard);
    void* ws = workspace();  // a first call allocates it
    const Key key{static_cast<int>(c.kind), static_cast<int>(c.type), c.m, c.n, c.k,
                  alignment(c.a), alignment(c.b), alignment(c.d), alignment(c.bias),
                  alignment(c.aux), c.trans_a + 2 * c.trans_b + 4 * c.f32_out, c.autotune};
    auto it = plans.find(key);
    const bool fresh = it == plans.end();
    if (fresh) it = plans.emplace(key, make_plan(c)).first;
    Plan& p = it->second;
    if (!p.usable) return false;
    set_pointers(p, c);
    if (fresh) autotune(p, c, ws);
    const float alpha = 1.0f, beta = 0.0f;
    FG_CUBLAS_CHECK(cublasLtMatmul(handle(), p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d, p.d,
                                   c.d, p.d, &p.algo, ws, kWorkspaceBytes, stream()));
    return true;
}

}  // namespace

bool gemm_lt(ScalarType type, bool f32_out, bool trans_a, bool trans_b, long long m, long long n,
             long long k, const void* a, const void* b, void* c, bool autotune) {
    Call call{Kind::plain, type, m, n, k, b, a, c, nullptr, nullptr, autotune};
    call.trans_a = trans_a;
    call.trans_b = trans_b;
    call.f32_out = f32_out;
    return run(call);
}

bool linear_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                       const void* w, const void* bias, void* y, bool autotune) {
    return run({Kind::forward, type, m, n, k, w, x, y, bias, nullptr, autotune});
}

bool linear_gelu_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                            const void* w, const void* bias, void* y, void* pre, bool autotune) {
    return run({Kind::forward_gelu, type, m, n, k, w, x, y, bias, pre, autotune});
}

bool linear_input_grad_dgelu_lt(ScalarType type, long long m, long long n, long long k,
                                const void* dy, const void* w, const void* pre, void* dx,
                                bool autotune) {
    return run({Kind::input_grad_dgelu, type, m, n, k, w, dy, dx, nullptr, pre, autotune});
}

}  // namespace fg::kernels
