// bench/bench_gemm.cpp: the GEMM-only ceiling of a GPT-2 small training step: every matrix product
// of the step's linear layers (forward, input gradient, weight gradient) run alone through
// cuBLASLt (its heuristic's first algorithm, a 32 MiB workspace, bf16 inputs, fp32 accumulation;
// bf16 outputs, fp32 for the weight gradients as fusegrad keeps them), timed one by one (CUDA
// events, the median of 20, L2 flushed), then summed with each product's count in a step. The
// attention's own products (QK^T, AV) run inside the fused attention kernel and are not counted.
// What the step costs beyond this sum is everything else: attention, norms, GELU, the loss,
// AdamW, and what the products lose inside the step.
//
// Per layer (12): qkv 768 -> 2304, the attention's projection 768 -> 768, fc 768 -> 3072 and the
// MLP's projection 3072 -> 768; then the head 768 -> 50304. A linear of N outputs and K inputs
// over M tokens is three products, row-major as kernels/matmul.h writes them:
//   forward      y (M, N)  = x (M, K) @ w (N, K)^T
//   input grad   dx (M, K) = dy (M, N) @ w (N, K)
//   weight grad  dw (N, K) = dy (M, N)^T @ x (M, K)
// Before timing, each product's layout is checked at a small size against float64 on the CPU.
//
// usage: bench_gemm [--tokens M ...] [--step-ms MS ...] [--algorithms K] [--calls] [--sustained S]
// (default M = 16384 and 65536, GPT-2's 16 x 1024 and 64 x 1024 steps; --step-ms gives a measured
// step time per M to compare with; --algorithms K also times the heuristic's first K algorithms of
// each product and sums the fastest: what choosing by measurement instead of by the heuristic would
// buy; --calls also times the calls a fusegrad step makes for each product, with the heuristic's
// algorithm and autotuned (kernels/linear_lt.h: the forwards with their bias or GELU epilogue, the
// MLP's input gradient with its GELU-gradient epilogue, kernels::gemm for the rest), so the table
// shows what the step's own calls get from autotuning beside what the bare products could;
// --sustained S then runs the step's products back to back, over and over for S seconds, with the
// fastest algorithm found for each: the GEMMs of a step under a load that lasts, where the card's
// power limit may hold its clock below what a product timed alone gets; the run is marked on stdout
// by "energy: start" and "energy: stop" lines, for bench/gpu_energy.py to measure its energy; each
// product runs its count in a row on the same operands, so L2 may keep what a step would fetch
// again: 16 x 1024's activations fit in it, 64 x 1024's do not)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/ops.h"
#include "kernels/linear_lt.h"
#include "kernels/matmul.h"

using namespace fg;

namespace {

void check_lt(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string("cuBLASLt: ") + what + " failed with status " +
                                 std::to_string(static_cast<int>(s)));
}

// One row-major product C (m, n) = op(A) (m, k) @ op(B) (k, n) through cuBLASLt, planned once:
// column-major, that is C^T = op(B)^T op(A)^T, so B is cuBLASLt's first operand.
class LtProduct {
public:
    LtProduct(cublasLtHandle_t lt, bool trans_a, bool trans_b, long long m, long long n,
              long long k, cudaDataType_t c_type, void* workspace, std::size_t workspace_bytes,
              int algorithms = 1)
        : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {
        check_lt(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
        const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_b,
                                                sizeof op_b), "transa");
        check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                                sizeof op_a), "transb");
        // Stored shapes, column-major: B is (n, k) read as is, or (k, n) transposed; A likewise.
        check_lt(trans_b ? cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, k, n, k)
                         : cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, n, k, n), "layout b");
        check_lt(trans_a ? cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, m, k, m)
                         : cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, k, m, k), "layout a");
        check_lt(cublasLtMatrixLayoutCreate(&c_, c_type, n, m, n), "layout c");
        cublasLtMatmulPreference_t pref;
        check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
        check_lt(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                     sizeof workspace_bytes_), "workspace");
        heuristics_.resize(algorithms);
        int found = 0;
        check_lt(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, b_, a_, c_, c_, pref, algorithms,
                                                heuristics_.data(), &found), "heuristic");
        cublasLtMatmulPreferenceDestroy(pref);
        if (found == 0) throw std::runtime_error("cuBLASLt offers no algorithm for this product");
        heuristics_.resize(found);
    }
    ~LtProduct() {
        cublasLtMatrixLayoutDestroy(a_);
        cublasLtMatrixLayoutDestroy(b_);
        cublasLtMatrixLayoutDestroy(c_);
        cublasLtMatmulDescDestroy(desc_);
    }
    LtProduct(const LtProduct&) = delete;
    LtProduct& operator=(const LtProduct&) = delete;

    int algorithms() const { return static_cast<int>(heuristics_.size()); }

    // With the heuristic's `algorithm`-th choice (0: its first).
    void run(const void* a, const void* b, void* c, int algorithm = 0) const {
        const float one = 1.0f, zero = 0.0f;
        check_lt(cublasLtMatmul(lt_, desc_, &one, b, b_, a, a_, &zero, c, c_, c, c_,
                                &heuristics_[algorithm].algo, workspace_, workspace_bytes_,
                                kernels::stream()),
                 "matmul");
    }

private:
    cublasLtHandle_t lt_;
    void* workspace_;
    std::size_t workspace_bytes_;
    cublasLtMatmulDesc_t desc_{};
    cublasLtMatrixLayout_t a_{}, b_{}, c_{};
    std::vector<cublasLtMatmulHeuristicResult_t> heuristics_;
};

struct Product {
    const char* layer;
    const char* pass;
    bool trans_a, trans_b;
    long long m, n, k;
    bool f32_out;  // the weight gradient
    int count;     // how many a step makes
};

// The three products of a linear of n_out outputs, n_in inputs, over `tokens`, `count` a step.
void linear(std::vector<Product>& out, const char* layer, long long tokens, long long n_out,
            long long n_in, int count) {
    out.push_back({layer, "forward", false, true, tokens, n_out, n_in, false, count});
    out.push_back({layer, "input grad", false, false, tokens, n_in, n_out, false, count});
    out.push_back({layer, "weight grad", true, false, n_out, n_in, tokens, true, count});
}

Tensor bf16_randn(long long rows, long long cols) {
    return randn({rows, cols}, Device::cuda).to(DType::bf16);
}

// The product's layout against float64 on the CPU at m = min(m, 256) (and k likewise for the weight
// gradient): the largest difference relative to the largest value of the reference.
double layout_error(cublasLtHandle_t lt, const Product& p, void* ws, std::size_t ws_bytes) {
    // m and k differ, so that a transposed operand read with the two swapped would show.
    const long long m = std::min(p.m, 256LL), n = p.n, k = p.trans_a ? std::min(p.k, 128LL) : p.k;
    const Tensor a = p.trans_a ? bf16_randn(k, m) : bf16_randn(m, k);
    const Tensor b = p.trans_b ? bf16_randn(n, k) : bf16_randn(k, n);
    const DType c_type = p.f32_out ? DType::f32 : DType::bf16;
    Tensor c = Tensor::empty({m, n}, c_type, Device::cuda);
    LtProduct product(lt, p.trans_a, p.trans_b, m, n, k, p.f32_out ? CUDA_R_32F : CUDA_R_16BF, ws,
                      ws_bytes);
    product.run(a.raw_data(), b.raw_data(), c.raw_data());
    const Tensor ref = matmul(a.to(Device::cpu).to(DType::f64), b.to(Device::cpu).to(DType::f64),
                              p.trans_a, p.trans_b);
    const std::vector<double> got = c.to_vector<double>();  // widened on the host
    const std::vector<double> want = ref.to_vector<double>();
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, (double)std::fabs(got[i] - want[i]));
        scale = std::max(scale, (double)std::fabs(want[i]));
    }
    return diff / std::max(scale, 1e-30);
}

// The call a fusegrad step makes for product `p` (a, b, c as the bare product's operands), with
// the heuristic's algorithm or autotuned: a layer's forward with its bias epilogue (fc's with the
// GELU's), the MLP's input gradient through its second weight with the GELU-gradient epilogue, and
// kernels::gemm (cuBLASLt's plain kind) for the head's forward and the other gradients. `bias` (n)
// and, for the two GELU calls, `pre` (m x n) are scratch of the product's output shape.
void fusegrad_call(const Product& p, const Tensor& a, const Tensor& b, Tensor& c,
                   const Tensor& bias, Tensor& pre, bool autotune) {
    using kernels::ScalarType;
    const std::string layer = p.layer, pass = p.pass;
    bool ran = true;
    if (pass == "forward" && layer == "fc")
        ran = kernels::linear_gelu_forward_lt(ScalarType::bf16, p.m, p.n, p.k, a.raw_data(),
                                              b.raw_data(), bias.raw_data(), c.raw_data(),
                                              pre.raw_data(), autotune);
    else if (pass == "forward" && layer != "head")
        ran = kernels::linear_forward_lt(ScalarType::bf16, p.m, p.n, p.k, a.raw_data(),
                                         b.raw_data(), bias.raw_data(), c.raw_data(), autotune);
    else if (pass == "input grad" && layer == "mlp proj")  // dx = (dy @ w2) * gelu'(pre)
        ran = kernels::linear_input_grad_dgelu_lt(ScalarType::bf16, p.m, p.k, p.n, a.raw_data(),
                                                  b.raw_data(), pre.raw_data(), c.raw_data(),
                                                  autotune);
    else
        kernels::gemm(ScalarType::bf16, p.f32_out ? ScalarType::f32 : ScalarType::bf16, p.trans_a,
                      p.trans_b, p.m, p.n, p.k, 1.0f, a.raw_data(), 0, b.raw_data(), 0, 0.0f,
                      c.raw_data(), 0, 1, false, autotune);
    if (!ran)
        throw std::runtime_error(std::string("cuBLASLt refused fusegrad's call for ") + p.layer +
                                 " " + p.pass);
}

// A product the sustained run repeats: its plan, operands and fastest algorithm, and how many a
// step makes.
struct Held {
    std::unique_ptr<LtProduct> product;
    Tensor a, b, c;
    int algorithm;
    int count;
};

// Milliseconds a step's products take back to back (each `count` times), over `seconds` of them
// queued one step after another: the host checks the time after queueing each step and runs ahead
// of the GPU by at most the launch queue, so the GPU never waits between steps. Timed on the host
// from an idle stream to its end: over seconds of work, the first launch's and the last
// synchronisation's latencies (microseconds) do not count.
double sustained_step_ms(const std::vector<Held>& held, double seconds) {
    const auto one_step = [&] {
        for (const Held& h : held)
            for (int i = 0; i < h.count; ++i)
                h.product->run(h.a.raw_data(), h.b.raw_data(), h.c.raw_data(), h.algorithm);
    };
    using Clock = std::chrono::steady_clock;
    const auto since = [](Clock::time_point t0) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    cudaStream_t s = kernels::stream();
    one_step();  // untimed: the first launches of each plan
    FG_CUDA_CHECK(cudaStreamSynchronize(s));
    std::printf("energy: start\n");
    std::fflush(stdout);
    const auto t0 = Clock::now();
    long long steps = 0;
    do {
        one_step();
        ++steps;
    } while (since(t0) < seconds);
    FG_CUDA_CHECK(cudaStreamSynchronize(s));
    const double ms = 1e3 * since(t0);
    std::printf("energy: stop\n");
    std::fflush(stdout);
    std::printf("sustained: %lld steps' GEMMs in %.2f s\n", steps, ms / 1e3);
    return ms / steps;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<long long> token_counts;
    std::vector<double> step_ms;
    int algorithms = 1;
    bool calls = false;
    double sustained_s = 0.0;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--tokens" && i + 1 < argc) token_counts.push_back(std::atoll(argv[++i]));
        else if (arg == "--step-ms" && i + 1 < argc) step_ms.push_back(std::atof(argv[++i]));
        else if (arg == "--algorithms" && i + 1 < argc)
            algorithms = std::max(1, std::atoi(argv[++i]));
        else if (arg == "--calls") calls = true;
        else if (arg == "--sustained" && i + 1 < argc) {
            char* end = nullptr;
            sustained_s = std::strtod(argv[++i], &end);
            if (end == argv[i] || *end != '\0' || !(sustained_s > 0.0 && sustained_s <= 3600.0)) {
                std::fprintf(stderr, "bench_gemm: --sustained wants seconds in (0, 3600] (got "
                                     "'%s')\n", argv[i]);
                return 2;
            }
        } else {
            std::fprintf(stderr, "usage: bench_gemm [--tokens M ...] [--step-ms MS ...] "
                                 "[--algorithms K] [--calls] [--sustained S]\n");
            return 2;
        }
    }
    if (token_counts.empty()) token_counts = {16384, 65536};
    try {
        cublasLtHandle_t lt;
        check_lt(cublasLtCreate(&lt), "create");
        const std::size_t ws_bytes = 32u << 20;
        void* ws = nullptr;
        FG_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
        bench::Timer timer;
        std::printf("%s; GPT-2 small's linear layers, bf16, cuBLASLt (heuristic's first "
                    "algorithm)\n", kernels::device_info().name.c_str());
        for (std::size_t t = 0; t < token_counts.size(); ++t) {
            const long long M = token_counts[t];
            std::vector<Product> products;
            linear(products, "qkv", M, 2304, 768, 12);
            linear(products, "attention proj", M, 768, 768, 12);
            linear(products, "fc", M, 3072, 768, 12);
            linear(products, "mlp proj", M, 768, 3072, 12);
            linear(products, "head", M, 50304, 768, 1);
            std::printf("\nM = %lld tokens\n| layer | pass | m x n x k | layout error | ms | "
                        "TFLOP/s | a step | best of %d: ms (which) | fusegrad's call: heuristic, "
                        "autotuned ms |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
                        M, algorithms);
            double total_ms = 0.0, total_flops = 0.0, best_total_ms = 0.0;
            double call_ms[2] = {0.0, 0.0};
            std::vector<Held> held;  // with --sustained
            for (const Product& p : products) {
                const double err = layout_error(lt, p, ws, ws_bytes);
                if (!(err < 2e-2))
                    throw std::runtime_error(std::string("layout check failed: ") + p.layer + " " +
                                             p.pass + ", relative error " + std::to_string(err));
                const Tensor a = p.trans_a ? bf16_randn(p.k, p.m) : bf16_randn(p.m, p.k);
                const Tensor b = p.trans_b ? bf16_randn(p.n, p.k) : bf16_randn(p.k, p.n);
                Tensor c = Tensor::empty({p.m, p.n}, p.f32_out ? DType::f32 : DType::bf16,
                                         Device::cuda);
                auto product = std::make_unique<LtProduct>(
                    lt, p.trans_a, p.trans_b, p.m, p.n, p.k, p.f32_out ? CUDA_R_32F : CUDA_R_16BF,
                    ws, ws_bytes, algorithms);
                const auto time = [&](int algorithm) {
                    return timer.median_ms(
                        [&] { product->run(a.raw_data(), b.raw_data(), c.raw_data(), algorithm); },
                        20);
                };
                const double ms = time(0);
                double best_ms = ms;
                int best = 0;
                for (int i = 1; i < product->algorithms(); ++i) {
                    const double t = time(i);
                    if (t < best_ms) best_ms = t, best = i;
                }
                double call[2] = {0.0, 0.0};
                if (calls) {
                    const std::string layer = p.layer, pass = p.pass;
                    const bool gelu = (pass == "forward" && layer == "fc") ||
                                      (pass == "input grad" && layer == "mlp proj");
                    const Tensor bias = bf16_randn(1, p.n);
                    Tensor pre = gelu ? bf16_randn(p.m, p.n) : Tensor();  // the GELU's input
                    for (int tuned = 0; tuned < 2; ++tuned) {
                        fusegrad_call(p, a, b, c, bias, pre, tuned);  // plans (and tunes) first
                        call[tuned] = timer.median_ms(
                            [&] { fusegrad_call(p, a, b, c, bias, pre, tuned); }, 20);
                        call_ms[tuned] += call[tuned] * p.count;
                    }
                }
                const double flops = 2.0 * p.m * p.n * p.k;
                total_ms += ms * p.count;
                best_total_ms += best_ms * p.count;
                total_flops += flops * p.count;
                std::printf("| %s | %s | %lld x %lld x %lld | %.1e | %.3f | %.0f | x%d | %.3f (%d of "
                            "%d) | %.3f, %.3f |\n", p.layer, p.pass, p.m, p.n, p.k, err, ms,
                            flops / (ms * 1e9), p.count, best_ms, best, product->algorithms(),
                            call[0], call[1]);
                if (sustained_s > 0.0) held.push_back({std::move(product), a, b, c, best, p.count});
            }
            std::printf("GEMMs of a step: %.2f ms, %.1f TFLOP, %.0f TFLOP/s, %.0f tokens/s at most",
                        total_ms, total_flops / 1e12, total_flops / (total_ms * 1e9),
                        M / (total_ms / 1e3));
            if (t < step_ms.size())
                std::printf("; the measured step %.2f ms: the GEMMs alone are %.0f%% of it",
                            step_ms[t], 100.0 * total_ms / step_ms[t]);
            if (algorithms > 1)
                std::printf("\nthe fastest of the first %d algorithms: %.2f ms (%.1f%% less)",
                            algorithms, best_total_ms, 100.0 * (1.0 - best_total_ms / total_ms));
            if (calls)
                std::printf("\nfusegrad's calls: %.2f ms with the heuristic's algorithms, %.2f "
                            "autotuned (%.1f%% less)", call_ms[0], call_ms[1],
                            100.0 * (1.0 - call_ms[1] / call_ms[0]));
            std::printf("\n");
            if (sustained_s > 0.0) {
                const double ms = sustained_step_ms(held, sustained_s);
                std::printf("the GEMMs of a step, sustained for %.0f s: %.2f ms, %.0f TFLOP/s "
                            "(timed one at a time, each with the fastest of its %d algorithms "
                            "tried: %.2f ms)\n", sustained_s, ms, total_flops / (ms * 1e9),
                            algorithms, best_total_ms);
            }
        }
        cudaFree(ws);
        cublasLtDestroy(lt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gemm: %s\n", e.what());
        return 1;
    }
    return 0;
}
