// bench/bench_core.cpp: the core's speed on the GPU, each figure beside its baseline in one run.
//   copy:        device-to-device copy bandwidth (the ceiling for memory-bound ops)
//   elementwise: add, mul, scale, gelu, bias add, in-place add_ at 2^26 f32 elements, GB/s and
//                % of copy
//   matmul:      fusegrad's matmul against cuBLAS called directly on the same buffers, TFLOP/s
//                (FP32 and TF32): they should be equal, i.e. no hidden copies
//   overhead:    host time of one small op (1 element), CPU and GPU, with and without autograd
// Usage: bench_core [--json PATH]
#include <cublas_v2.h>

#include <chrono>
#include <cstring>

#include "bench_common.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"

using namespace fg;
using bench::Row;

namespace {

double gbs(double bytes, double ms) { return bytes / (ms * 1e6); }

std::vector<Row> bench_elementwise(bench::Timer& timer, double copy_gbs) {
    const std::int64_t n = 1 << 26;
    Tensor a = randn({n}, Device::cuda), b = randn({n}, Device::cuda);
    const std::int64_t act_rows = n / 384;  // activations of the toy GPT: (B*T, C = 384)
    Tensor x3 = randn({act_rows, 384}, Device::cuda), bias = randn({384}, Device::cuda);
    const double f = sizeof(float);
    struct Case {
        const char* name;
        double bytes;
        std::function<void()> fn;
    };
    std::vector<Case> cases{
        {"add (a + b)", 3 * n * f, [&] { add(a, b); }},
        {"mul (a * b)", 3 * n * f, [&] { mul(a, b); }},
        {"scale (0.5 a)", 2 * n * f, [&] { scale(a, 0.5); }},
        {"gelu", 2 * n * f, [&] { gelu(a); }},
        {"bias add (x + b[C]), C=384", 2 * act_rows * 384 * f, [&] { add(x3, bias); }},
        {"add_ (a += b)", 3 * n * f, [&] { add_(a, b); }},
    };
    std::vector<Row> rows;
    for (const Case& c : cases) {
        double ms = timer.median_ms(c.fn);
        double v = gbs(c.bytes, ms);
        rows.push_back({"elementwise", c.name, "2^26 f32", ms, v, "GB/s", v / copy_gbs, "of copy"});
    }
    return rows;
}

std::vector<Row> bench_matmul(bench::Timer& timer) {
    struct Shape3 {
        std::int64_t m, n, k;
        const char* note;
    };
    std::vector<Shape3> shapes{{4096, 4096, 4096, "square"},
                               {16384, 1152, 384, "toy GPT qkv"},
                               {16384, 384, 1536, "toy GPT mlp proj"}};
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate");
    cublasSetStream(handle, kernels::stream());
    std::vector<Row> rows;
    for (const Shape3& s : shapes) {
        Tensor a = randn({s.m, s.k}, Device::cuda), b = randn({s.k, s.n}, Device::cuda);
        Tensor c = Tensor::empty({s.m, s.n}, DType::f32, Device::cuda);
        double flops = 2.0 * s.m * s.n * s.k;
        char shape[64];
        std::snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)s.m, (long long)s.n,
                      (long long)s.k);
        for (bool tf32 : {false, true}) {
            cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
            const float one = 1.0f, zero = 0.0f;
            // Row-major C = A B as column-major C^T = B^T A^T (see kernels/matmul.cu).
            double direct = timer.median_ms([&] {
                cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)s.n, (int)s.m, (int)s.k, &one,
                             b.data<float>(), CUDA_R_32F, (int)s.n, a.data<float>(), CUDA_R_32F,
                             (int)s.k, &zero, c.data<float>(), CUDA_R_32F, (int)s.n, compute,
                             CUBLAS_GEMM_DEFAULT);
            }, 20);
            double ours = timer.median_ms([&] { matmul(a, b, false, false, {tf32}); }, 20);
            std::string mode = tf32 ? "TF32" : "FP32";
            rows.push_back({"matmul", "cublas direct " + mode + " (" + s.note + ")", shape, direct,
                            flops / (direct * 1e9), "TF/s", 0.0, ""});
            rows.push_back({"matmul", "fg::matmul " + mode + " (" + s.note + ")", shape, ours,
                            flops / (ours * 1e9), "TF/s", direct / ours, "of cublas"});
        }
    }
    cublasDestroy(handle);
    return rows;
}

// Host microseconds per call of a 1-element add: what a toy model's many small ops pay.
std::vector<Row> bench_overhead() {
    std::vector<Row> rows;
    for (Device device : {Device::cpu, Device::cuda}) {
        for (bool grad : {false, true}) {
            Tensor x = Tensor::ones({1}, DType::f32, device);
            if (grad) x.set_requires_grad(true);
            const int iters = 20000;
            for (int i = 0; i < 100; ++i) add(x, x);
            kernels::synchronize();
            auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; ++i) add(x, x);
            kernels::synchronize();
            double us = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start).count() / iters;
            std::string name = std::string("add of 1 element, ") + device_name(device) +
                               (grad ? ", recording" : ", no grad");
            rows.push_back({"overhead", name, "(1)", us / 1000.0, us, "us", 0.0, ""});
        }
    }
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    std::string json = "bench_core.json";
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
    try {
        const kernels::DeviceInfo& dev = kernels::device_info();
        std::printf("bench_core on %s (%d SMs, L2 %d MiB)\n", dev.name.c_str(), dev.sm_count,
                    dev.l2_bytes >> 20);
        bench::Timer timer;
        double copy = bench::copy_bandwidth_gbs(timer, std::size_t(1) << 30);
        std::vector<Row> rows{{"copy", "cudaMemcpy device to device", "1 GiB", 0.0, copy,
                               "GB/s", 1.0, "of copy"}};
        for (auto part : {bench_elementwise(timer, copy), bench_matmul(timer), bench_overhead()})
            rows.insert(rows.end(), part.begin(), part.end());
        bench::print_table(rows);
        bench::write_json(json, dev.name, copy, rows);
        std::printf("\nwrote %s\n", json.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
