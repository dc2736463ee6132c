// tests/low_precision.h: every op of a GPT step in bf16 (and f16) against the float64 CPU
// reference, forward and backward, on odd shapes. Shared by the CPU tests (the CPU computes
// 16-bit tensors in float, so CI runs the same dtype paths) and the GPU tests (the kernels).
//
// How a case is judged. Its f32 inputs are first rounded to the low dtype, so the reference and
// the op under test see the same values; the reference runs on f64 copies of them. The upstream
// gradient is random and representable in the output's dtype. Errors are relative to the
// reference's norm, ||got - ref|| / ||ref||, and tolerances are in units of the dtype's rounding
// step u (2^-8 for bf16, 2^-11 for f16): a value rounded once to bf16 is off by at most u / 2 of
// itself, so an op that rounds its result once lands near 0.3 u, and every further rounding of
// an intermediate (attention's probabilities, a saved activation) adds about as much again.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/random.h"
#include "test_helpers.h"

namespace fg::test {

struct LowPrecisionCase {
    std::string name;
    OpFn fn;
    std::vector<Tensor> inputs;     // f32 (rounded to the low dtype) or i32, on the CPU
    double out_tol, grad_tol;       // in units of u
    std::vector<std::size_t> keep;  // indices of f32 inputs kept f32 (a norm's weight)
    bool f16 = true;                // false: f16's range cannot hold the case (see mean)
};

inline double rounding_unit(DType dtype) {
    return dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// Runs one case on `device` in `dtype`; with `report`, prints the measured errors in units of u.
inline void check_low_precision(const LowPrecisionCase& c, DType dtype, Device device,
                                bool report = false) {
    const double u = rounding_unit(dtype);
    INFO(c.name << " in " << dtype_name(dtype) << " on " << device_name(device));
    std::vector<Tensor> ref_in, low_in;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
        const Tensor& t = c.inputs[i];
        if (!is_floating(t.dtype())) {
            ref_in.push_back(t);
            low_in.push_back(t.to(device));
            continue;
        }
        bool kept = std::find(c.keep.begin(), c.keep.end(), i) != c.keep.end();
        Tensor values = kept ? t : t.to(dtype);
        ref_in.push_back(values.to(DType::f64).detach().set_requires_grad(true));
        low_in.push_back(values.to(device).detach().set_requires_grad(true));
    }
    Tensor ref_out = c.fn(ref_in);
    Tensor low_out = c.fn(low_in);
    REQUIRE(low_out.device() == device);
    REQUIRE(low_out.shape() == ref_out.shape());
    const double out_err = rel_error(low_out.to_vector<double>(), ref_out.to_vector<double>()) / u;
    Tensor w = random_f32(ref_out.shape()).to(low_out.dtype() == DType::f32 ? DType::f32 : dtype);
    ref_out.backward(w.to(DType::f64));
    low_out.backward(w.to(low_out.dtype()).to(device));
    double worst_grad = 0.0;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
        if (!is_floating(c.inputs[i].dtype())) continue;
        INFO("gradient of input " << i);
        REQUIRE(low_in[i].grad().defined());
        REQUIRE(low_in[i].grad().device() == device);
        REQUIRE(low_in[i].grad().dtype() == low_in[i].dtype());
        double err = rel_error(low_in[i].grad().to_vector<double>(),
                               ref_in[i].grad().to_vector<double>()) / u;
        worst_grad = std::max(worst_grad, err);
        CHECK(err <= c.grad_tol);
    }
    if (report)
        std::printf("  %-44s %s: output %.3f u, gradients %.3f u (tolerances %.1f, %.1f)\n",
                    c.name.c_str(), dtype_name(dtype), out_err, worst_grad, c.out_tol, c.grad_tol);
    CHECK(out_err <= c.out_tol);
}

// The cases: every op the GPT's step uses, on shapes chosen to hit odd sizes and the vector and
// scalar paths of the kernels (cols 1, 7, 33, 1000, 4097; misaligned views).
inline std::vector<LowPrecisionCase> low_precision_cases() {
    std::vector<LowPrecisionCase> cases;
    auto add_case = [&](std::string name, OpFn fn, std::vector<Tensor> inputs, double out_tol,
                        double grad_tol, std::vector<std::size_t> keep = {}) {
        cases.push_back({std::move(name), std::move(fn), std::move(inputs), out_tol, grad_tol,
                         std::move(keep), true});
    };
    for (std::int64_t cols : {1, 7, 33, 1000, 4097}) {
        const std::string s = " 37 x " + std::to_string(cols);
        Tensor a = random_f32({37, cols}), b = random_f32({37, cols});
        Tensor bias = random_f32({cols}), row = random_f32({37, 1});
        add_case("add" + s, [](auto& in) { return add(in[0], in[1]); }, {a, b}, 1, 1);
        add_case("sub (bias)" + s, [](auto& in) { return sub(in[0], in[1]); }, {a, bias}, 1, 1);
        add_case("mul (row)" + s, [](auto& in) { return mul(in[0], in[1]); }, {a, row}, 1, 1);
        add_case("scale" + s, [](auto& in) { return scale(in[0], -0.37); }, {a}, 1, 1);
        add_case("gelu" + s, [](auto& in) { return gelu(in[0]); }, {a}, 1, 2);
        add_case("gelu tanh" + s, [](auto& in) { return gelu(in[0], GeluForm::tanh); }, {a}, 1, 2);
        // rsqrt's backward, -g y^3 / 2, is three rounded products of the rounded y, and the
        // gradient then passes the rounded square; at 37 x 1 the offset's gradient is one sum of
        // 37 such terms of both signs, which magnifies their error: the widest tolerance here.
        add_case("rsqrt" + s, [](auto& in) { return rsqrt(add(mul(in[0], in[0]), in[1])); },
                 {a, Tensor::full({cols}, 0.5)}, 2, 10);
        add_case("dropout" + s,
                 [](auto& in) {
                     default_generator().set_state(5, 8);
                     return dropout(in[0], 0.3);
                 },
                 {a}, 1, 1);
        add_case("sum_last" + s, [](auto& in) { return sum_last(in[0]); }, {a}, 1, 1);
        add_case("mean" + s, [](auto& in) { return mean(in[0]); }, {a}, 1, 1);
        // f16: the gradient of a mean over 37 x 1000 values, 2.7e-5 each, is below f16's
        // smallest normal number (6.1e-5) and loses bits: what f16 training's loss scaling is for.
        if (cols >= 1000) cases.back().f16 = false;
        add_case("softmax" + s, [](auto& in) { return softmax(in[0]); }, {scale(a, 3.0)}, 1, 3);
        Tensor targets = randint({37}, static_cast<std::int32_t>(cols));
        add_case("cross_entropy" + s, [](auto& in) { return cross_entropy(in[0], in[1]); },
                 {scale(a, 3.0), targets}, 1, 2);
        add_case("embedding" + s, [](auto& in) { return embedding(in[0], in[1]); },
                 {random_f32({65, cols}), randint({3, 111}, 65)}, 0.01, 1);
        NormOptions zc;
        zc.zero_centered = true;
        add_case("layer_norm, f32 weight and bias" + s,
                 [](auto& in) { return layer_norm(in[0], in[1], in[2]); },
                 {a, random_f32({cols}), random_f32({cols})}, 1, 3, {1, 2});
        add_case("rms_norm, weight of x's dtype" + s,
                 [](auto& in) { return rms_norm(in[0], in[1]); }, {a, random_f32({cols})}, 1, 3);
        add_case("layer_norm_residual" + s,
                 [](auto& in) {
                     NormResidualResult r = layer_norm_residual(in[0], in[1], in[2]);
                     return add(r.y, r.h);
                 },
                 {a, b, random_f32({cols})}, 2, 4, {2});
        add_case("rms_norm zero-centred" + s,
                 [zc](auto& in) { return rms_norm(in[0], in[1], Tensor(), zc); },
                 {a, random_f32({cols}, Device::cpu, 0.1f)}, 1, 3, {1});
    }
    add_case("causal softmax 2 x 3 x 37 x 40",
             [](auto& in) { return softmax(in[0], true); }, {random_f32({2, 3, 37, 40})}, 1, 3);
    add_case("cross_entropy, ignored rows",
             [](auto& in) { return cross_entropy(in[0], in[1]); },
             {random_f32({4, 65}), Tensor::from_vector(std::vector<std::int32_t>{3, -1, 64, -1},
                                                       {4})},
             1, 2);
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const std::int64_t m = 33, n = 65, k = 130;
            add_case(std::string("matmul ") + (ta ? "T" : "N") + (tb ? "T" : "N"),
                     [ta, tb](auto& in) { return matmul(in[0], in[1], ta, tb); },
                     {random_f32(ta ? Shape{k, m} : Shape{m, k}),
                      random_f32(tb ? Shape{n, k} : Shape{k, n})},
                     1, 1);
        }
    add_case("matmul batched", [](auto& in) { return matmul(in[0], in[1]); },
             {random_f32({3, 17, 33}), random_f32({3, 33, 9})}, 1, 1);
    add_case("matmul shared weight (Linear)",
             [](auto& in) { return matmul(in[0], in[1], false, true); },
             {random_f32({4, 7, 48}), random_f32({96, 48})}, 1, 1);
    add_case("permute", [](auto& in) { return permute(in[0], {2, 0, 3, 1}); },
             {random_f32({3, 5, 4, 7})}, 0.01, 0.01);
    add_case("split_heads and merge_heads",
             [](auto& in) {
                 return merge_heads(mul(split_heads(in[0], 4), split_heads(in[1], 4)));
             },
             {random_f32({2, 9, 32}), random_f32({2, 9, 32})}, 1, 1);
    add_case("slice and reshape",
             [](auto& in) { return mul(in[0].slice(1, 3).reshape({2, 3, 7}), in[1]); },
             {random_f32({4, 21}), random_f32({2, 3, 7})}, 1, 1);
    // fusegrad's own kernels (the reference draws their dropout mask); cuDNN's attention is
    // tested against them in tests/gpu/test_gpu_attention_cudnn.cpp.
    for (double p : {0.0, 0.2})
        for (std::int64_t t : {1, 37, 256})
            add_case("causal_attention T " + std::to_string(t) + " dropout " + std::to_string(p),
                     [p](auto& in) {
                         default_generator().set_state(21, 7);
                         return causal_attention(in[0], p, true, {AttentionBackend::fused});
                     },
                     {random_f32({3, 2, 3, t, 32})}, 2, 2);
    return cases;
}

}  // namespace fg::test
