// tests/gpu/test_gpu_attention_cudnn.cpp: cuDNN's fused attention (kernels/attention_cudnn.h,
// causal_attention with AttentionBackend::cudnn) against fusegrad's own kernels, which are the
// plain reference: both in bf16 and f16 against the fused kernels in f32 on the same rounded
// inputs, norm-wise in float64, forward and backward; where each picks (auto); that nothing of
// (T, T) size is allocated; and dropout, whose mask is cuDNN's own: the fraction dropped, the
// scale of what is kept and the causal zeros, read off the output with V = identity; the same
// (seed, offset) giving the same mask (the same output bits) and another offset another mask; the
// output and gradients against a float64 reference that applies the mask read off cuDNN; the
// gradient against finite differences of the forward (f16). Then a bf16 GPT and a training run on
// cuDNN's attention, and its call on the packed (B, T, 3C) -> (B, T, C) layouts against the
// permuted one. Errors are printed in units u of the dtype's rounding (2^-8 bf16, 2^-11 f16).
//
// A build without cuDNN passes every case at once (nothing to test). A build with cuDNN where it
// does not work (it does not load, or this GPU cannot run it) fails, saying why.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "../low_precision.h"
#include "core/cuda_backend.h"
#include "scale/scale_wing.h"

using namespace fg;

namespace {

const AttentionOptions kCudnn{AttentionBackend::cudnn};
const AttentionOptions kFused{AttentionBackend::fused};
const AttentionOptions kAuto{AttentionBackend::automatic};

// False (and the case passes) in a build without cuDNN; in a build with it, cuDNN must work.
bool cudnn_built() {
    REQUIRE(cuda_is_available());
    if (!cuda_backend("test").cudnn_attention_built()) {
        SUCCEED("fusegrad was built without cuDNN (FG_CUDNN): nothing to test");
        return false;
    }
    const std::string why = cudnn_attention_unsupported({Device::cuda, DType::bf16, 64});
    INFO("cuDNN's attention does not work here: " << why);
    REQUIRE(why.empty());
    static bool printed = false;
    if (!printed) {
        std::printf("cuDNN attention tests on %s\n",
                    cuda_backend("test").device_info().name.c_str());
        printed = true;
    }
    return true;
}

struct Shape4 {
    std::int64_t b, h, t, d;
};

std::string name_of(const Shape4& s) {
    std::ostringstream o;
    o << s.b << "x" << s.h << "x" << s.t << "x" << s.d;
    return o.str();
}

// The output and dqkv of causal_attention(qkv, p) with `options`, given the output's gradient
// `w`, the dropout generator at (seed, offset).
struct Run {
    Tensor out, dqkv;
};
Run run(const Tensor& qkv, const Tensor& w, double p, const AttentionOptions& options,
        std::uint64_t seed = 21, std::uint64_t offset = 8) {
    default_generator().set_state(seed, offset);
    Tensor x = qkv.detach().set_requires_grad(true);
    Tensor out = causal_attention(x, p, true, options);
    out.backward(w);
    REQUIRE(x.grad().defined());
    return {out.detach(), x.grad()};
}

bool same_bits(const Tensor& a, const Tensor& b) {
    return a.to_vector<double>() == b.to_vector<double>();
}

// ||got - ref|| / ||ref|| in units of `dtype`'s rounding step.
double error_u(const Tensor& got, const Tensor& ref, DType dtype) {
    return test::rel_error(got.to_vector<double>(), ref.to_vector<double>()) /
           test::rounding_unit(dtype);
}

// (3, B, H, T, D) f32 on the CPU with q = k = 0 and, in every head, v_j = e_j (T <= D): then the
// output's row i is row i of the dropped-out probabilities, out[b, h, i, j] = Pd_ij, and every
// visible P_ij is 1 / (i + 1).
Tensor identity_v(const Shape4& s) {
    REQUIRE(s.t <= s.d);
    std::vector<float> values(static_cast<std::size_t>(3 * s.b * s.h * s.t * s.d), 0.0f);
    const std::int64_t v0 = 2 * s.b * s.h * s.t * s.d;
    for (std::int64_t bh = 0; bh < s.b * s.h; ++bh)
        for (std::int64_t j = 0; j < s.t; ++j) values[v0 + (bh * s.t + j) * s.d + j] = 1.0f;
    return Tensor::from_vector(values, {3, s.b, s.h, s.t, s.d});
}

// cuDNN's dropout mask for a call of this shape at (seed, offset): 1 kept, 0 dropped, as an f64
// (B, H, T, T) tensor on the CPU (future positions 0). Read off the training forward (the graph
// a backward follows, whose mask the backward regenerates).
Tensor cudnn_mask(const Shape4& s, DType dtype, double p, std::uint64_t seed,
                  std::uint64_t offset) {
    default_generator().set_state(seed, offset);
    Tensor x = identity_v(s).to(dtype).to(Device::cuda).set_requires_grad(true);
    std::vector<double> pd = causal_attention(x, p, true, kCudnn).to_vector<double>();
    std::vector<double> mask(static_cast<std::size_t>(s.b * s.h * s.t * s.t), 0.0);
    for (std::int64_t bh = 0; bh < s.b * s.h; ++bh)
        for (std::int64_t i = 0; i < s.t; ++i)
            for (std::int64_t j = 0; j <= i; ++j)
                mask[(bh * s.t + i) * s.t + j] = pd[(bh * s.t + i) * s.d + j] != 0.0 ? 1.0 : 0.0;
    return Tensor::from_vector(mask, {s.b, s.h, s.t, s.t});
}

// dropout(softmax(q k^T / sqrt(D), causal)) v in float64 with an explicit 0/1 `mask`, from the
// plain ops: the definition of causal_attention with cuDNN's dropout.
Tensor attention_with_mask(const Tensor& qkv, const Tensor& mask, double p) {
    const std::int64_t b = qkv.size(1), h = qkv.size(2), t = qkv.size(3), d = qkv.size(4);
    Tensor q = qkv.slice(0, 1).reshape({b, h, t, d});
    Tensor k = qkv.slice(1, 2).reshape({b, h, t, d});
    Tensor v = qkv.slice(2, 3).reshape({b, h, t, d});
    Tensor att = softmax(scale(matmul(q, k, false, true), 1.0 / std::sqrt(double(d))), true);
    return matmul(mul(att, scale(mask, 1.0 / (1.0 - p))), v);
}

}  // namespace

TEST_CASE("cuDNN attention is as accurate as the fused kernels, forward and backward",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    std::printf(
        "cuDNN vs fused attention, p = 0, error against the fused f32 kernels (units of u):\n");
    for (const Shape4& s :
         {Shape4{1, 1, 2, 8}, Shape4{2, 3, 37, 16}, Shape4{1, 2, 100, 64}, Shape4{2, 2, 130, 128},
          Shape4{64, 6, 256, 64}, Shape4{4, 12, 1024, 64}}) {
        for (DType dtype : {DType::bf16, DType::f16}) {
            INFO(name_of(s) << " " << dtype_name(dtype));
            // Inputs and the output's gradient rounded to dtype, so that every path sees the same
            // values; the reference is the fused kernels in f32 (no TF32) on them.
            Tensor qkv16 = test::random_f32({3, s.b, s.h, s.t, s.d}).to(dtype).to(Device::cuda);
            Tensor w16 = test::random_f32({s.b, s.h, s.t, s.d}).to(dtype).to(Device::cuda);
            Run ref = run(qkv16.to(DType::f32), w16.to(DType::f32), 0.0, kFused);
            Run fused = run(qkv16, w16, 0.0, kFused);
            Run cudnn = run(qkv16, w16, 0.0, kCudnn);
            REQUIRE(cudnn.out.dtype() == dtype);
            REQUIRE(cudnn.dqkv.dtype() == dtype);
            const double fo = error_u(fused.out, ref.out, dtype),
                         co = error_u(cudnn.out, ref.out, dtype);
            const double fg = error_u(fused.dqkv, ref.dqkv, dtype),
                         cg = error_u(cudnn.dqkv, ref.dqkv, dtype);
            std::printf("  %-14s %s: output fused %.3f cudnn %.3f, dqkv fused %.3f cudnn %.3f\n",
                        name_of(s).c_str(), dtype_name(dtype), fo, co, fg, cg);
            // Both round the probabilities (and in the backward dS) once for the tensor-core
            // products, at other places, and cuDNN's backward takes sum_k dP_ik P_ik from the
            // rounded output (sum_d dO_id O_id): about as accurate, not the same bits.
            CHECK(co <= std::max(1.5 * fo, fo + 0.5));
            CHECK(cg <= std::max(2.0 * fg, fg + 1.0));
            CHECK(co <= 3.0);
            CHECK(cg <= 4.0);
        }
    }
}

TEST_CASE("auto runs cuDNN's attention where it can when training, the fused kernels elsewhere",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    // The output of a call that records a backward (training), and of one that does not.
    auto recording = [](const Tensor& qkv, const AttentionOptions& o) {
        return causal_attention(qkv.detach().set_requires_grad(true), 0.0, true, o).detach();
    };
    auto forward_only = [](const Tensor& qkv, const AttentionOptions& o) {
        NoGradGuard no_grad;
        return causal_attention(qkv, 0.0, true, o);
    };
    Tensor x = test::random_f32({3, 2, 3, 40, 32}, Device::cuda);
    for (DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        Tensor x16 = x.to(dtype);
        CHECK(same_bits(recording(x16, kAuto), recording(x16, kCudnn)));
        CHECK_FALSE(same_bits(recording(x16, kAuto), recording(x16, kFused)));
        // Forward only (evaluation, sampling, whose T grows at every token): the fused kernels,
        // unless cudnn is asked for.
        CHECK(same_bits(forward_only(x16, kAuto), forward_only(x16, kFused)));
        CHECK(forward_only(x16, kCudnn).dtype() == dtype);
        // Head sizes cuDNN does not take: 12 (not a multiple of 8) and 136 (above 128).
        for (std::int64_t d : {12, 136}) {
            Tensor odd = test::random_f32({3, 1, 2, 16, d}, Device::cuda).to(dtype);
            CHECK(same_bits(recording(odd, kAuto), recording(odd, kFused)));
            REQUIRE_THROWS_WITH(
                recording(odd, kCudnn),
                ContainsSubstring("[causal_attention] the cudnn backend cannot run this call") &&
                    ContainsSubstring("multiples of 8 up to 128, not " + std::to_string(d)));
        }
    }
    // f32 runs the fused kernels; cudnn is refused.
    CHECK(same_bits(recording(x, kAuto), recording(x, kFused)));
    REQUIRE_THROWS_WITH(recording(x, kCudnn), ContainsSubstring("the tensors are f32"));
    // T = 1: cuDNN's forward runs it, its backward does not: when recording, auto runs the fused
    // kernels and cudnn says why.
    Tensor one = test::random_f32({3, 2, 3, 1, 32}, Device::cuda).to(DType::bf16);
    CHECK(forward_only(one, kCudnn).numel() == 2 * 3 * 32);
    CHECK(same_bits(recording(one, kAuto), recording(one, kFused)));
    REQUIRE_THROWS_WITH(recording(one, kCudnn),
                        ContainsSubstring("cuDNN's backward takes sequences of T >= 2, not 1"));
    // The generator moves by as much on both paths: what is drawn after does not depend on it.
    for (const AttentionOptions& o : {kCudnn, kFused}) {
        default_generator().set_state(5, 0);
        causal_attention(x.to(DType::bf16), 0.2, true, o);
        CHECK(default_generator().offset() == 2 * 3 * 40 * 40);
    }
}

TEST_CASE("cuDNN reads and writes the packed layouts in place: causal_attention between permutes",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    // causal_self_attention on c_attn's (B, T, 3C) and to c_proj's (B, T, C), with strides,
    // against causal_attention on the permuted (3, B, H, T, D), both cuDNN's: the same mask (the
    // same dropout counters), the same values up to cuDNN's own run-to-run differences (its dQ
    // adds with atomics): well under one rounding, where a layout mistake gives tens of them.
    for (DType dt : {DType::bf16, DType::f16}) {
        for (Shape4 s : {Shape4{2, 3, 64, 64}, Shape4{4, 6, 256, 64}, Shape4{1, 4, 160, 128}}) {
            for (double p : {0.0, 0.2}) {
                INFO(dtype_name(dt) << " " << name_of(s) << " p " << p);
                const std::int64_t c = s.h * s.d;
                const Tensor packed = test::random_f32({s.b, s.t, 3 * c}).to(dt).to(Device::cuda);
                const Tensor w = test::random_f32({s.b, s.t, c}).to(dt).to(Device::cuda);
                default_generator().set_state(5, 16);
                Tensor x = packed.detach().set_requires_grad(true);
                Tensor y = causal_self_attention(x, s.h, p, true, kCudnn);
                y.backward(w);
                REQUIRE(packed_cudnn_attention_failure().empty());
                default_generator().set_state(5, 16);
                Tensor xr = packed.detach().set_requires_grad(true);
                Tensor heads = permute(xr.reshape({s.b, s.t, 3, s.h, s.d}), {2, 0, 3, 1, 4});
                Tensor ref = merge_heads(causal_attention(heads, p, true, kCudnn));
                ref.backward(w);
                const double out_u = error_u(y, ref, dt), grad_u = error_u(x.grad(), xr.grad(), dt);
                std::printf("packed vs permuted %s %s p=%.1f: out %.3g u, dqkv %.3g u\n",
                            dtype_name(dt), name_of(s).c_str(), p, out_u, grad_u);
                CHECK(out_u <= 0.3);
                CHECK(grad_u <= 0.3);
            }
        }
    }
}

TEST_CASE("cuDNN attention allocates nothing of (T, T) size", "[gpu][attention]") {
    if (!cudnn_built()) return;
    const Shape4 s{4, 12, 1024, 64};
    Tensor qkv = test::random_f32({3, s.b, s.h, s.t, s.d}, Device::cuda).to(DType::bf16);
    Tensor w = test::random_f32({s.b, s.h, s.t, s.d}, Device::cuda).to(DType::bf16);
    for (double p : {0.0, 0.2}) {
        run(qkv, w, p, kCudnn);  // the graphs are built (and their workspaces known) first
        const std::size_t before = memory_stats(Device::cuda).bytes_in_use;
        reset_peak_memory(Device::cuda);
        run(qkv, w, p, kCudnn);
        const double peak =
            static_cast<double>(memory_stats(Device::cuda).peak_bytes_in_use - before);
        // Forward and backward together hold out, lse, dqkv, the output's gradient copy (none:
        // w is aligned) and cuDNN's workspace; one bf16 (B H, T, T) tensor alone is 96 MiB.
        const double one_tt = static_cast<double>(s.b * s.h * s.t * s.t * 2);
        std::printf(
            "cuDNN attention %s p = %.1f: forward + backward peak %.1f MiB beyond the "
            "inputs (a bf16 (B H, T, T) tensor: %.1f MiB)\n",
            name_of(s).c_str(), p, peak / 1048576.0, one_tt / 1048576.0);
        CHECK(peak < 0.5 * one_tt);
    }
}

TEST_CASE("cuDNN's dropout drops a fraction p of the probabilities and scales the rest by 1/(1-p)",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    // V = identity: out[b, h, i, j] = Pd_ij, with P_ij = 1 / (i + 1) for j <= i (q = k = 0).
    const Shape4 s{4, 8, 64, 64};
    const double p = 0.2;
    for (DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        const double u = test::rounding_unit(dtype);
        for (double prob : {0.0, p}) {
            INFO("p " << prob);
            default_generator().set_state(3, 0);
            Tensor x = identity_v(s).to(dtype).to(Device::cuda).set_requires_grad(true);
            std::vector<double> pd = causal_attention(x, prob, true, kCudnn).to_vector<double>();
            std::int64_t visible = 0, dropped = 0, future_nonzero = 0, off_scale = 0;
            for (std::int64_t bh = 0; bh < s.b * s.h; ++bh)
                for (std::int64_t i = 0; i < s.t; ++i)
                    for (std::int64_t j = 0; j < s.t; ++j) {
                        const double v = pd[(bh * s.t + i) * s.d + j];
                        if (j > i) {
                            future_nonzero += v != 0.0;
                            continue;
                        }
                        ++visible;
                        if (v == 0.0) {
                            ++dropped;
                            continue;
                        }
                        const double want = 1.0 / ((i + 1) * (1.0 - prob));
                        off_scale += std::fabs(v - want) > 2 * u * want;
                    }
            const double fraction = static_cast<double>(dropped) / static_cast<double>(visible);
            std::printf("cuDNN dropout p = %.1f, %s: %.4f of %lld visible probabilities dropped\n",
                        prob, dtype_name(dtype), fraction, static_cast<long long>(visible));
            CHECK(future_nonzero == 0);
            CHECK(off_scale == 0);
            // 66560 Bernoulli(p) draws: the standard deviation of the fraction is 0.0016.
            CHECK(std::fabs(fraction - prob) < 0.01);
        }
    }
}

TEST_CASE("cuDNN's dropout: the same seed and offset give the same mask, other ones another",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    Tensor qkv = test::random_f32({3, 2, 4, 96, 64}, Device::cuda).to(DType::bf16);
    Tensor w = test::random_f32({2, 4, 96, 64}, Device::cuda).to(DType::bf16);
    Run a = run(qkv, w, 0.2, kCudnn, 21, 8), again = run(qkv, w, 0.2, kCudnn, 21, 8);
    CHECK(same_bits(a.out, again.out));
    // dQ is summed with fp32 atomics (attention_cudnn.h): its last bits may differ, never more
    // than rounding (another mask moves the gradient by O(1)).
    const double regrad = error_u(again.dqkv, a.dqkv, DType::bf16);
    std::printf("cuDNN dropout, the same (seed, offset) twice: dqkv %s (%.3f u apart)\n",
                same_bits(a.dqkv, again.dqkv) ? "bitwise equal" : "not bitwise equal", regrad);
    CHECK(regrad <= 0.5);
    auto share_differing = [](const Tensor& x, const Tensor& y) {
        std::vector<double> xs = x.to_vector<double>(), ys = y.to_vector<double>();
        std::int64_t n = 0;
        for (std::size_t i = 0; i < xs.size(); ++i) n += xs[i] != ys[i];
        return static_cast<double>(n) / static_cast<double>(xs.size());
    };
    // Another offset (as the next call gets), another seed: most outputs change.
    const Tensor other_offset = run(qkv, w, 0.2, kCudnn, 21, 8 + 2 * 4 * 96 * 96).out;
    const Tensor other_seed = run(qkv, w, 0.2, kCudnn, 22, 8).out;
    CHECK(share_differing(a.out, other_offset) > 0.5);
    CHECK(share_differing(a.out, other_seed) > 0.5);
    // Not training: no dropout, and the generator does not move.
    default_generator().set_state(21, 8);
    Tensor eval = causal_attention(qkv, 0.2, false, kCudnn);
    CHECK(default_generator().offset() == 8);
    CHECK(same_bits(eval, causal_attention(qkv, 0.0, true, kCudnn)));
}

TEST_CASE(
    "cuDNN attention with dropout matches float64 with cuDNN's own mask, forward and backward",
    "[gpu][attention]") {
    if (!cudnn_built()) return;
    const double p = 0.2;
    for (const Shape4& s : {Shape4{2, 4, 64, 64}, Shape4{1, 3, 100, 128}}) {
        for (DType dtype : {DType::bf16, DType::f16}) {
            INFO(name_of(s) << " " << dtype_name(dtype));
            const Tensor mask = cudnn_mask(s, dtype, p, 21, 8);  // the mask of these counters
            Tensor qkv16 = test::random_f32({3, s.b, s.h, s.t, s.d}).to(dtype);
            Tensor w16 = test::random_f32({s.b, s.h, s.t, s.d}).to(dtype);
            Run cudnn = run(qkv16.to(Device::cuda), w16.to(Device::cuda), p, kCudnn, 21, 8);
            Tensor x = qkv16.to(DType::f64).detach().set_requires_grad(true);
            Tensor ref = attention_with_mask(x, mask, p);
            ref.backward(w16.to(DType::f64));
            const double eo = error_u(cudnn.out, ref, dtype),
                         eg = error_u(cudnn.dqkv, x.grad(), dtype);
            std::printf(
                "cuDNN dropout %s %s against float64 with its mask: output %.3f u, dqkv %.3f u\n",
                name_of(s).c_str(), dtype_name(dtype), eo, eg);
            CHECK(eo <= 3.0);
            CHECK(eg <= 4.0);
        }
    }
}

TEST_CASE("cuDNN attention's gradient agrees with finite differences of its forward (f16)",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    // L(x) = sum(w * out(x)) along a direction u: L(x + e u) - L(x - e u) against
    // grad . (x+ - x-), with x+- rounded to f16 (the difference taken exactly from the rounded
    // values) and the same dropout mask at every evaluation. Two directions: a random one, and the
    // analytic gradient's own (scaled to the random one's length), along which the derivative is
    // largest, so that the f16 rounding of the outputs cannot hide a wrong gradient (a mask the
    // backward regenerates wrongly gives a gradient that is not the forward's).
    const Shape4 s{1, 2, 48, 32};
    Tensor x = test::random_f32({3, s.b, s.h, s.t, s.d});
    Tensor random_direction = test::random_f32(x.shape());
    Tensor w = test::random_f32({s.b, s.h, s.t, s.d}).to(DType::f16);
    const double e = 0.05;
    Tensor x16 = x.to(DType::f16);
    for (double p : {0.0, 0.2}) {
        INFO("dropout " << p);
        // Returns L and the standard deviation of its error from rounding each output to f16
        // (uniform within half a unit in the last place: 2^-11 / sqrt(3) relative).
        auto loss = [&](const Tensor& at) {
            // Recording, as run() does: the training graph (the one with lse), whose mask the
            // backward regenerates.
            default_generator().set_state(9, 4);
            Tensor leaf = at.to(Device::cuda).set_requires_grad(true);
            std::vector<double> out = causal_attention(leaf, p, true, kCudnn).to_vector<double>();
            std::vector<double> ws = w.to_vector<double>();
            double total = 0.0, variance = 0.0;
            for (std::size_t i = 0; i < out.size(); ++i) {
                total += ws[i] * out[i];
                variance += ws[i] * out[i] * ws[i] * out[i];
            }
            return std::pair<double, double>{
                total, std::ldexp(1.0, -11) / std::sqrt(3.0) * std::sqrt(variance)};
        };
        Tensor grad =
            run(x16.to(Device::cuda), w.to(Device::cuda), p, kCudnn, 9, 4).dqkv.to(Device::cpu);
        std::vector<double> g = grad.to_vector<double>();
        auto norm = [](const Tensor& t) {
            double n2 = 0.0;
            for (double v : t.to_vector<double>()) n2 += v * v;
            return std::sqrt(n2);
        };
        Tensor along_gradient = scale(grad.to(DType::f32), norm(random_direction) / norm(grad));
        struct Direction {
            const char* name;
            Tensor u;
            bool along_gradient;
        };
        for (const Direction& d : {Direction{"random", random_direction, false},
                                   Direction{"the gradient's", along_gradient, true}}) {
            INFO(d.name << " direction");
            Tensor plus = add(x, scale(d.u, e)).to(DType::f16);
            Tensor minus = sub(x, scale(d.u, e)).to(DType::f16);
            auto [l_plus, sd_plus] = loss(plus);
            auto [l_minus, sd_minus] = loss(minus);
            const double numeric = l_plus - l_minus;
            // Three standard deviations of the difference's rounding error.
            const double rounding = 3.0 * std::hypot(sd_plus, sd_minus);
            std::vector<double> xp = plus.to_vector<double>(), xm = minus.to_vector<double>();
            double analytic = 0.0;
            for (std::size_t i = 0; i < g.size(); ++i) analytic += g[i] * (xp[i] - xm[i]);
            std::printf(
                "cuDNN attention f16 p = %.1f, %s direction: directional derivative %.6f, "
                "finite difference %.6f, its rounding %.6f\n",
                p, d.name, analytic, numeric, rounding);
            // Along the gradient the derivative must stand well clear of the rounding, so that
            // this check can fail.
            if (d.along_gradient) CHECK(std::fabs(analytic) >= 20.0 * rounding);
            CHECK(std::fabs(numeric - analytic) <= 0.05 * std::fabs(analytic) + rounding);
        }
    }
}

TEST_CASE("a bf16 GPT with cuDNN's attention is as close to float64 as with the fused kernels",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    GPTConfig c = test::small_gpt(37, 65, 2, 4, 128);  // D = 32
    Generator g0(9), g1(9), g2(9);
    GPT ref(c, g0);
    ref.to(DType::f64);
    c.compute_dtype = DType::bf16;
    GPT fused(c, g1, Device::cuda), cudnn(c, g2, Device::cuda);
    auto set = [](GPT& model, AttentionBackend b) {
        model.apply([b](Module& m) {
            if (auto* attn = dynamic_cast<CausalSelfAttention*>(&m)) attn->set_backend(b);
        });
    };
    set(fused, AttentionBackend::fused);
    set(cudnn, AttentionBackend::cudnn);
    Tensor ids = randint({4, 65}, 37), targets = randint({4, 65}, 37);
    Tensor ref_logits = ref.forward(ids);
    ref.loss(ref_logits, targets).backward();
    const double u = test::rounding_unit(DType::bf16);
    std::vector<double> errors[2];
    int which = 0;
    for (GPT* model : {&fused, &cudnn}) {
        Tensor logits = model->forward(ids.to(Device::cuda));
        model->loss(logits, targets.to(Device::cuda)).backward();
        errors[which].push_back(
            test::rel_error(logits.to_vector<double>(), ref_logits.to_vector<double>()) / u);
        auto rp = ref.named_parameters(), mp = model->named_parameters();
        REQUIRE(rp.size() == mp.size());
        for (std::size_t i = 0; i < rp.size(); ++i)
            errors[which].push_back(test::rel_error(mp[i].second->grad().to_vector<double>(),
                                                    rp[i].second->grad().to_vector<double>()) /
                                    u);
        ++which;
    }
    const auto names = ref.named_parameters();
    std::printf(
        "bf16 GPT against float64, units of u (fused / cudnn): logits %.3f / %.3f, worst "
        "gradient %.3f / %.3f\n",
        errors[0][0], errors[1][0], *std::max_element(errors[0].begin() + 1, errors[0].end()),
        *std::max_element(errors[1].begin() + 1, errors[1].end()));
    for (std::size_t i = 0; i < errors[0].size(); ++i) {
        INFO((i == 0 ? std::string("logits") : names[i - 1].first)
             << ": fused " << errors[0][i] << " u, cudnn " << errors[1][i] << " u");
        CHECK(errors[1][i] <= std::max(2.0 * errors[0][i], errors[0][i] + 2.0));
    }
}

TEST_CASE("kernels.attention=cudnn trains a bf16 run on CUDA, and refuses an f32 one",
          "[gpu][attention]") {
    if (!cudnn_built()) return;
    const std::string dir = "/tmp/fg_gpu_attention_cudnn";
    std::filesystem::remove_all(dir);
    std::ostringstream log;
    {
        Trainer t(test::tiny_addition_run(dir, 3,
                                          {"train.device=cuda", "train.precision=bf16",
                                           "model.dropout=0.1", "kernels.attention=cudnn"}),
                  log, std::make_unique<ScaleWing>());
        t.model().apply([](Module& m) {
            if (auto* attn = dynamic_cast<CausalSelfAttention*>(&m))
                CHECK(attn->backend() == AttentionBackend::cudnn);
        });
        t.run();
        REQUIRE(t.losses().size() == 3);
        for (double l : t.losses()) CHECK(std::isfinite(l));
    }
    std::filesystem::remove_all(dir);
    REQUIRE_THROWS_WITH(
        Trainer(test::tiny_addition_run(dir, 1, {"train.device=cuda", "kernels.attention=cudnn"}),
                log, std::make_unique<ScaleWing>()),
        ContainsSubstring("[train] kernels.attention is cudnn, but cuDNN's fused attention cannot run this "
                 "model: the tensors are f32"));
    std::filesystem::remove_all(dir);
}
