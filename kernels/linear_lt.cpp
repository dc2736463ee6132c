// kernels/linear_lt.cpp: see linear_lt.h. cuBLASLt is column-major, so (as in matmul.cu) a
// row-major (R, C) matrix is passed as the column-major (C, R) one:
//
//   forward:  y^T (N x M) = op(w^T) x^T with w^T stored (K x N, ld K), op = transpose, so
//             A = w (TRANSA = T), B = x (K x M, ld K), D = y (N x M, ld N). EPILOGUE_BIAS adds the
//             bias, one value per row of D, which is one per output feature.
//   weight:   dw^T (K x N) = x^T op(dy^T) with x^T stored (K x M, ld K) and dy^T stored (N x M,
//             ld N), op = transpose, so A = x, B = dy (TRANSB = T), D = dw (K x N, ld K) in f32.
//             EPILOGUE_BGRADB writes the sum of op(B) over the product's k = M dimension, one value
//             per column of D: dbias[j] = sum_r dy[r, j].
//
// A plan (the descriptors and the algorithm the heuristic chose) is kept per call kind, type,
// shape and operand alignment, so later calls only set the bias pointer and launch.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

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

enum class Kind { forward, weight_grad };

struct Plan {
    bool usable = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

// (kind, type, m, n, k, alignments of the operands and the bias)
using Key = std::tuple<int, int, long long, long long, long long, std::uint32_t, std::uint32_t,
                       std::uint32_t, std::uint32_t>;

void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const void* value,
         std::size_t bytes) {
    FG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, what, value, bytes));
}

// Makes the plan for a call: the operation, the three matrix layouts (C is D: beta = 0), and
// the heuristic's first algorithm for them, or usable = false where it has none. Throws (leaving
// nothing kept) if cuBLASLt fails otherwise.
Plan make_plan(Kind kind, ScalarType type, long long m, long long n, long long k, const void* a,
               const void* b, const void* d, const void* bias) {
    Plan p;
    const cudaDataType_t ab = cuda_type(type);
    FG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t trans_a = kind == Kind::forward ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t trans_b = kind == Kind::forward ? CUBLAS_OP_N : CUBLAS_OP_T;
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
    set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
    cublasLtEpilogue_t epilogue =
        kind == Kind::forward ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    cudaDataType_t bias_type = kind == Kind::forward ? ab : CUDA_R_32F;
    set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));

    // The matrices as stored (before TRANSA / TRANSB), column-major: rows, columns, leading dim.
    if (kind == Kind::forward) {
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, k, n, k));  // w^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, k, m, k));  // x^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, ab, n, m, n));  // y^T
    } else {
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, k, m, k));          // x^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, n, m, n));          // dy^T
        FG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, k, n, k));  // dw^T
    }

    cublasLtMatmulPreference_t pref = nullptr;
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t ws = kWorkspaceBytes;
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const std::uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    FG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle(), p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.usable) p.algo = result.algo;
    return p;
}

// D = op(A) op(B) with the plan's epilogue reading or writing `bias`. Plans are kept per key for
// the process (a handful a model: one per layer shape and batch); the lock covers the lookup, the
// bias pointer set on the shared descriptor and the launch that reads it.
bool run(Kind kind, ScalarType type, long long m, long long n, long long k, const void* a,
         const void* b, void* d, const void* bias) {
    FG_ASSERT_LT(type == ScalarType::bf16 || type == ScalarType::f16);
    FG_ASSERT_LT(m > 0 && n > 0 && k > 0);
    static std::map<Key, Plan> plans;
    static std::mutex guard;
    std::lock_guard<std::mutex> lock(guard);
    void* ws = workspace();  // a first call allocates it
    const Key key{static_cast<int>(kind), static_cast<int>(type), m, n, k, alignment(a),
                  alignment(b), alignment(d), alignment(bias)};
    auto it = plans.find(key);
    if (it == plans.end())
        it = plans.emplace(key, make_plan(kind, type, m, n, k, a, b, d, bias)).first;
    Plan& p = it->second;
    if (!p.usable) return false;
    set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    const float alpha = 1.0f, beta = 0.0f;
    FG_CUBLAS_CHECK(cublasLtMatmul(handle(), p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d,
                                     p.d, &p.algo, ws, kWorkspaceBytes, stream()));
    return true;
}

}  // namespace

bool linear_forward_lt(ScalarType type, long long m, long long n, long long k, const void* x,
                       const void* w, const void* bias, void* y) {
    return run(Kind::forward, type, m, n, k, w, x, y, bias);
}

bool linear_weight_grad_lt(ScalarType type, long long m, long long n, long long k,
                           const void* dy, const void* x, float* dw, float* dbias) {
    return run(Kind::weight_grad, type, m, n, k, x, dy, dw, dbias);
}

}  // namespace fg::kernels
