// core/ops/embedding.cpp: rows of a weight table picked by integer ids.
//   out[n, :] = W[ids[n], :]          dW[v, :] = sum over n with ids[n] == v of g[n, :]
// The CPU backward walks n in order; the CUDA backward sorts ids first (kernels/embedding.h).
// Both are deterministic: the same inputs give the same bits every run.
#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;

template <typename T>
void embedding_forward_cpu(const T* w, const std::int32_t* ids, std::int64_t n, std::int64_t dim,
                           std::int64_t vocab, T* out) {
    for (std::int64_t i = 0; i < n; ++i) {
        FG_CHECK(ids[i] >= 0 && ids[i] < vocab, "embedding", "token id ", ids[i], " at position ",
                 i, " is out of range [0, ", vocab, ")");
        for (std::int64_t c = 0; c < dim; ++c) out[i * dim + c] = w[ids[i] * dim + c];
    }
}

template <typename T>
void embedding_backward_cpu(const T* g, const std::int32_t* ids, std::int64_t n, std::int64_t dim,
                            T* dw) {
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < dim; ++c) dw[ids[i] * dim + c] += g[i * dim + c];
}

Tensor embedding_backward(const Tensor& ids, const Tensor& g, const Shape& weight_shape) {
    std::int64_t vocab = weight_shape[0], dim = weight_shape[1], n = ids.numel();
    Tensor dw = Tensor::empty(weight_shape, g.dtype(), g.device());
    if (g.is_cuda()) {
        CudaBackend& cuda = cuda_backend("embedding");
        Tensor ws = scratch_bytes(g.device(), cuda.embedding_backward_workspace_bytes(n));
        cuda.embedding_backward(scalar_type(g.dtype()), g.raw_data(), ids.data<std::int32_t>(), n,
                                dim, vocab, dw.raw_data(), ws.raw_data());
        return dw;
    }
    // 16-bit gradients are summed in f32 and rounded once, as the kernel does.
    cpu_reference(g, dw, [&](const auto* gs, auto* out) {
        std::fill_n(out, vocab * dim, 0);
        embedding_backward_cpu(gs, ids.data<std::int32_t>(), n, dim, out);
    });
    return dw;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
    const char* op = "embedding";
    check_defined(op, weight, "weight");
    check_defined(op, ids, "ids");
    check_arithmetic_dtype(op, weight);
    check_same_device(op, weight, ids);
    FG_CHECK(weight.dim() == 2, op, "weight must be (V, C), got ", shape_str(weight.shape()));
    FG_CHECK(ids.dtype() == DType::i32, op, "ids must be i32, got ", dtype_name(ids.dtype()));
    std::int64_t vocab = weight.size(0), dim = weight.size(1), n = ids.numel();
    Shape out_shape = ids.shape();
    out_shape.push_back(dim);
    Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
    if (weight.is_cuda()) {
        cuda_backend(op).embedding_forward(scalar_type(weight.dtype()), weight.raw_data(),
                                           ids.data<std::int32_t>(), n, dim, vocab,
                                           out.raw_data());
    } else {
        // A 16-bit row is copied exactly (widened, then rounded back).
        cpu_reference(weight, out, [&](const auto* w, auto* dst) {
            embedding_forward_cpu(w, ids.data<std::int32_t>(), n, dim, vocab, dst);
        });
    }
    Tensor saved_ids = ids.detach();
    Shape weight_shape = weight.shape();
    return record(op, {weight, ids}, out,
                  [saved_ids, weight_shape](const Tensor& g) -> std::vector<Tensor> {
                      return {embedding_backward(saved_ids, g, weight_shape), Tensor()};
                  });
}

}  // namespace fg
