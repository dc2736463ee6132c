// tests/test_errors.cpp: every bad input the ops check, sent on purpose; the message must name the
// op in brackets and say what was expected and what came.
#include <limits>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "test_helpers.h"

using namespace fg;

TEST_CASE("shape mismatches name the op and both shapes", "[errors]") {
    Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 3}), c = Tensor::zeros({3, 5});
    REQUIRE_THROWS_WITH(add(a, b), ContainsSubstring("[add] shapes (2, 3) and (4, 3) do not broadcast"));
    REQUIRE_THROWS_WITH(matmul(a, b), ContainsSubstring("[matmul] inner dimensions differ"));
    REQUIRE_THROWS_WITH(matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 4})),
                        ContainsSubstring("[matmul] batch dimensions differ"));
    REQUIRE_THROWS_WITH(matmul(Tensor::zeros({3}), c), ContainsSubstring("[matmul] inputs need at least 2"));
    REQUIRE_THROWS_WITH(split_heads(Tensor::zeros({1, 2, 6}), 4),
                        ContainsSubstring("[split_heads] C = 6 is not divisible by 4 heads"));
    REQUIRE_THROWS_WITH(permute(a, {0, 0}), ContainsSubstring("[permute] order must be a permutation"));
    REQUIRE_THROWS_WITH(add(Tensor::zeros({2, 3, 4}), Tensor::zeros({2, 1, 4})),
                        ContainsSubstring("[add] broadcasting (2, 1, 4)"));
}

TEST_CASE("dtype mismatches name the op and both dtypes", "[errors]") {
    Tensor f = Tensor::zeros({2}), d = Tensor::zeros({2}, DType::f64);
    REQUIRE_THROWS_WITH(add(f, d), ContainsSubstring("[add] inputs of different dtypes: f32 and f64"));
    REQUIRE_THROWS_WITH(gelu(Tensor::zeros({2}, DType::i32)),
                        ContainsSubstring("[gelu] CPU tensors must be f32, f64, bf16 or f16, got i32"));
    REQUIRE_THROWS_WITH(matmul(Tensor::zeros({2, 2}, DType::bf16), Tensor::zeros({2, 2})),
                        ContainsSubstring("[matmul] inputs of different dtypes: bf16 and f32"));
    REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({2})),
                        ContainsSubstring("[cross_entropy] targets must be i32, got f32"));
    REQUIRE_THROWS_WITH(embedding(Tensor::zeros({4, 2}), Tensor::zeros({3})),
                        ContainsSubstring("[embedding] ids must be i32, got f32"));
    REQUIRE_THROWS_WITH(Tensor::zeros({2}, DType::i32).set_requires_grad(true),
                        ContainsSubstring("only floating tensors can require grad, got i32"));
}

TEST_CASE("index errors name the bad index and the bound", "[errors]") {
    Tensor w = Tensor::zeros({5, 2});
    Tensor ids = Tensor::from_vector(std::vector<std::int32_t>{1, 5}, {2});
    REQUIRE_THROWS_WITH(embedding(w, ids), ContainsSubstring("[embedding] token id 5 at position 1 is out "
                                                    "of range [0, 5)"));
    Tensor targets = Tensor::from_vector(std::vector<std::int32_t>{0, 7}, {2});
    REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({2, 3}), targets),
                        ContainsSubstring("[cross_entropy] target 7 at row 1 is out of range [0, 3)"));
    REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({3}, DType::i32)),
                        ContainsSubstring("targets have shape (3)"));
    REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({2}, DType::i32), -1,
                                      0.0f),
                        ContainsSubstring("[cross_entropy] expected_dloss must be finite and "
                                          "non-zero, got 0"));
    REQUIRE_THROWS_WITH(cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({2}, DType::i32), -1,
                                      std::numeric_limits<float>::quiet_NaN()),
                        ContainsSubstring("[cross_entropy] expected_dloss must be finite and "
                                          "non-zero, got nan"));
}

TEST_CASE("bad arguments are rejected", "[errors]") {
    Tensor x = Tensor::zeros({4});
    REQUIRE_THROWS_WITH(dropout(x, 1.0), ContainsSubstring("[dropout] p must be in [0, 1), got 1"));
    REQUIRE_THROWS_WITH(Tensor::zeros({-1, 2}), ContainsSubstring("[empty] negative dimension"));
    REQUIRE_THROWS_WITH(Tensor::zeros({2}, DType::f64, Device::cuda),
                        ContainsSubstring("f64 tensors live on the CPU only"));
    REQUIRE_THROWS_WITH(x.item(), ContainsSubstring("[item] needs a tensor with one element"));
    REQUIRE_THROWS_WITH(softmax(Tensor::zeros({4}), true), ContainsSubstring("[softmax] a causal softmax"));
}

TEST_CASE("CUDA requests without a device say why", "[errors]") {
    if (cuda_is_available()) {
        WARN("a CUDA device is present: the no-device messages cannot be checked here");
        return;
    }
    std::string why = built_with_cuda() ? "no CUDA device is available" : "built without CUDA";
    REQUIRE_THROWS_WITH(Tensor::zeros({2}, DType::f32, Device::cuda), ContainsSubstring(why));
    REQUIRE_THROWS_WITH(Tensor::zeros({2}).to(Device::cuda), ContainsSubstring(why));
}

TEST_CASE("layout and shape arguments are checked", "[errors]") {
    Tensor x = Tensor::zeros({2, 3, 4});
    REQUIRE_THROWS_WITH(permute(x, {1, 0}), ContainsSubstring("[permute] order has 2 entries for a tensor with 3 dims"));
    REQUIRE_THROWS_WITH(permute(Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), {0, 1, 2, 3, 4, 5, 6, 7, 8}),
                        ContainsSubstring("[permute] at most 8 dims, got 9"));
    REQUIRE_THROWS_WITH(transpose(x, 0, 3), ContainsSubstring("[transpose] dims out of range for (2, 3, 4)"));
    REQUIRE_THROWS_WITH(x.reshape({-1, -1}), ContainsSubstring("[reshape] only one dimension can be -1"));
    REQUIRE_THROWS_WITH(x.reshape({5, -1}), ContainsSubstring("[reshape] cannot infer -1 in (5, -1) for 24 elements"));
    REQUIRE_THROWS_WITH(x.size(3), ContainsSubstring("[size] dimension 3 out of range for shape (2, 3, 4)"));
    REQUIRE_THROWS_WITH(Tensor::zeros({}).slice(0, 0), ContainsSubstring("[slice] cannot slice a scalar"));
    REQUIRE_THROWS_WITH(split_heads(Tensor::zeros({2, 4}), 2), ContainsSubstring("[split_heads] expects (B, T, C), got (2, 4)"));
    REQUIRE_THROWS_WITH(merge_heads(x), ContainsSubstring("[merge_heads] expects (B, H, T, D), got (2, 3, 4)"));
    REQUIRE_THROWS_WITH(softmax(Tensor::zeros({})), ContainsSubstring("[softmax] needs at least one dimension"));
    REQUIRE_THROWS_WITH(softmax(Tensor::zeros({3, 2}), true), ContainsSubstring("[softmax] causal mask needs Tq <= Tk, got (3, 2)"));
    Tensor a = Tensor::zeros({3});
    REQUIRE_THROWS_WITH(add_(a, Tensor::zeros({4})), ContainsSubstring("[add_] shapes differ: (3) += (4)"));
    REQUIRE_THROWS_WITH(copy_(a, Tensor::zeros({4})),
                        ContainsSubstring("[copy_] the tensors differ: (3) f32 on cpu = (4) f32 on cpu"));
    REQUIRE_THROWS_WITH(copy_(a, Tensor::zeros({3}, DType::f64)),
                        ContainsSubstring("[copy_] the tensors differ: (3) f32 on cpu = (3) f64 on cpu"));
    REQUIRE_THROWS_WITH(a.data<double>(), ContainsSubstring("[data] tensor holds f32, asked for f64"));
    REQUIRE_THROWS_WITH(randint({2}, 0), ContainsSubstring("[randint] high must be positive, got 0"));
    REQUIRE_THROWS_WITH(Tensor().backward(), ContainsSubstring("[backward] called on an undefined tensor"));
}
