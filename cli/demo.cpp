// cli/demo.cpp: see demo.h. The task: points x in R^16 drawn from a normal distribution, labelled
// by which of 4 fixed random vectors has the largest dot product with them. Shapes: N samples, F =
// 16 features, H = 64 hidden units, K = 4 classes.
#include "demo.h"

#include <chrono>
#include <cstdio>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"

namespace fg {

double run_demo(const DemoOptions& opt) {
    const std::int64_t n = 2048, features = 16, hidden = 64, classes = 4;
    Generator gen(opt.seed);
    // Data on the CPU: labels = argmax over classes of x @ directions.
    Tensor x = randn({n, features}, Device::cpu, &gen);                    // (N, F)
    Tensor directions = randn({classes, features}, Device::cpu, &gen);     // (K, F)
    std::vector<float> scores = matmul(x, directions, false, true).to_vector<float>();  // (N, K)
    std::vector<std::int32_t> labels(n);
    for (std::int64_t i = 0; i < n; ++i) {
        int best = 0;
        for (int k = 1; k < classes; ++k)
            if (scores[i * classes + k] > scores[i * classes + best]) best = k;
        labels[i] = best;
    }
    Tensor y = Tensor::from_vector(labels, {n}, opt.device);
    x = x.to(opt.device);

    // Parameters: Linear layers store W as (out, in), as nanoGPT does.
    auto param = [&](const Shape& shape, double stddev) {
        Tensor p = randn(shape, opt.device, &gen, 0.0f, static_cast<float>(stddev));
        p.set_requires_grad(true);
        return p;
    };
    Tensor w1 = param({hidden, features}, 0.25), b1 = param({hidden}, 0.0);
    Tensor w2 = param({classes, hidden}, 0.125), b2 = param({classes}, 0.0);
    std::vector<Tensor*> params{&w1, &b1, &w2, &b2};

    std::printf("demo: MLP %lld -> %lld -> %lld on %lld points, device %s\n", (long long)features,
                (long long)hidden, (long long)classes, (long long)n, device_name(opt.device));
    const double lr = 0.5;
    auto start = std::chrono::steady_clock::now();
    Tensor logits;
    for (int step = 1; step <= opt.steps; ++step) {
        Tensor h = gelu(matmul(x, w1, false, true) + b1);  // (N, H)
        logits = matmul(h, w2, false, true) + b2;          // (N, K)
        Tensor loss = cross_entropy(logits, y);
        loss.backward();
        {
            NoGradGuard no_grad;
            for (Tensor* p : params) {
                Tensor update = scale(p->grad(), -lr);
                add_(*p, update);
                p->zero_grad();
            }
        }
        if (step == 1 || step % 50 == 0 || step == opt.steps)
            std::printf("  step %4d  loss %.4f\n", step, loss.item());
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<float> final_logits = logits.to_vector<float>();
    int correct = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        int best = 0;
        for (int k = 1; k < classes; ++k)
            if (final_logits[i * classes + k] > final_logits[i * classes + best]) best = k;
        correct += best == labels[i];
    }
    double accuracy = static_cast<double>(correct) / n;
    std::printf("demo: accuracy %.1f%% after %d steps, %.2f ms/step\n", 100.0 * accuracy,
                opt.steps, 1000.0 * seconds / opt.steps);
    std::printf("demo: %s memory: %s\n", device_name(opt.device),
                format_memory_stats(memory_stats(opt.device)).c_str());
    return accuracy;
}

}  // namespace fg
