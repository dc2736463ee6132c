// core/ops/norm.cpp: RMSNorm and LayerNorm as differentiable ops. On CUDA tensors they run the
// fused kernels (kernels/norm.h states the math); on CPU tensors the plain reference below, which
// follows the same formulas line by line and accumulates in double.
//
// Saved for backward: the input that was normalised (x, or h when the residual add is fused), the
// weight, and the per-row statistics (mean for LayerNorm, rstd); x_hat is recomputed from them.
// When no input requires grad, the statistics are not even written.
#include <cmath>
#include <vector>

#include "kernels/half.h"
#include "op_utils.h"

namespace fg {
namespace {

using namespace ops_detail;
using kernels::NormKind;

const char* op_name(NormKind kind) { return kind == NormKind::rms ? "rmsnorm" : "layernorm"; }

// ---- CPU reference -------------------------------------------------------------------------

// x + residual as the kernels store h: rounded to the storage dtype (16-bit x is widened here).
template <typename T>
T residual_sum(T a, T b, DType storage) {
    T sum = a + b;
    const float f = static_cast<float>(sum);
    if (storage == DType::bf16) return static_cast<T>(half::bf16_to_float(half::float_to_bf16(f)));
    if (storage == DType::f16) return static_cast<T>(half::f16_to_float(half::float_to_f16(f)));
    return sum;
}

template <typename T>
void norm_forward_cpu(NormKind kind, const T* x, const T* residual, T* h_out, const T* w,
                      const T* b, bool zc, double eps, std::int64_t rows, std::int64_t cols, T* y,
                      T* mean_out, T* rstd_out, DType storage) {
    std::vector<double> v(cols);
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t base = r * cols;
        for (std::int64_t c = 0; c < cols; ++c) {
            T value = residual ? residual_sum(x[base + c], residual[base + c], storage)
                               : x[base + c];
            if (residual) h_out[base + c] = value;
            v[c] = value;
        }
        double mu = 0.0, var = 0.0;
        if (kind == NormKind::layer) {
            for (double e : v) mu += e;
            mu /= cols;
        }
        for (double e : v) var += (e - mu) * (e - mu);
        var /= cols;
        double rstd = 1.0 / std::sqrt(var + eps);
        if (rstd_out) {
            rstd_out[r] = static_cast<T>(rstd);
            if (mean_out) mean_out[r] = static_cast<T>(mu);
        }
        for (std::int64_t c = 0; c < cols; ++c) {
            double scale = w ? (zc ? 1.0 + w[c] : double(w[c])) : 1.0;
            y[base + c] = static_cast<T>((v[c] - mu) * rstd * scale + (b ? double(b[c]) : 0.0));
        }
    }
}

template <typename T>
void norm_backward_cpu(NormKind kind, const T* x, const T* dy, const T* dh, const T* w, bool zc,
                       const T* mean, const T* rstd, std::int64_t rows, std::int64_t cols, T* dx,
                       T* dw, T* db) {
    std::vector<double> dw_acc(cols, 0.0), db_acc(cols, 0.0), xh(cols), g(cols);
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t base = r * cols;
        double mu = kind == NormKind::layer ? double(mean[r]) : 0.0, rs = rstd[r];
        double c1 = 0.0, c2 = 0.0;
        for (std::int64_t c = 0; c < cols; ++c) {
            double scale = w ? (zc ? 1.0 + w[c] : double(w[c])) : 1.0;
            xh[c] = (x[base + c] - mu) * rs;
            g[c] = scale * dy[base + c];
            c1 += xh[c] * g[c];
            c2 += g[c];
            dw_acc[c] += dy[base + c] * xh[c];
            db_acc[c] += dy[base + c];
        }
        c1 /= cols;
        c2 = kind == NormKind::layer ? c2 / cols : 0.0;
        for (std::int64_t c = 0; c < cols; ++c)
            dx[base + c] = static_cast<T>((g[c] - xh[c] * c1 - c2) * rs + (dh ? double(dh[base + c]) : 0.0));
    }
    for (std::int64_t c = 0; c < cols; ++c) {
        if (dw) dw[c] = static_cast<T>(dw_acc[c]);
        if (db) db[c] = static_cast<T>(db_acc[c]);
    }
}

// t's data as T* (inputs take it as const T*), or nullptr for an undefined t.
template <typename T>
T* ptr_or_null(const Tensor& t) {
    return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// ---- checks --------------------------------------------------------------------------------

void check_inputs(NormKind kind, const Tensor& x, const Tensor& residual, const Tensor& weight,
                  const Tensor& bias, const NormOptions& opt) {
    const char* op = op_name(kind);
    check_defined(op, x, "input");
    FG_CHECK(x.dim() >= 1 && x.size(-1) >= 1, op, "input needs a non-empty last dim, got shape ",
             shape_str(x.shape()));
    FG_CHECK(std::isfinite(opt.eps) && opt.eps > 0.0, op, "eps must be > 0, got ", opt.eps);
    check_arithmetic_dtype(op, x);
    std::int64_t n = x.size(-1);
    for (const Tensor* p : {&weight, &bias}) {
        if (!p->defined()) continue;
        const char* what = p == &weight ? "weight" : "bias";
        FG_CHECK(p->dim() == 1 && p->numel() == n, op, what, " has ", p->numel(),
                 " elements (shape ", shape_str(p->shape()), "), input rows have ", n);
        FG_CHECK(p->device() == x.device(), op, what, " is on ", device_name(p->device()),
                 ", input is on ", device_name(x.device()));
        FG_CHECK(p->dtype() == x.dtype() || p->dtype() == DType::f32, op, what, " must be f32 or ",
                 dtype_name(x.dtype()), " like the input, got ", dtype_name(p->dtype()));
    }
    FG_CHECK(!(weight.defined() && bias.defined()) || weight.dtype() == bias.dtype(), op,
             "weight and bias dtypes differ: ", dtype_name(weight.dtype()), " and ",
             dtype_name(bias.dtype()));
    FG_CHECK(weight.defined() || !opt.zero_centered, op, "a zero-centred weight needs a weight");
    if (residual.defined()) {
        FG_CHECK(residual.shape() == x.shape(), op, "residual has shape ",
                 shape_str(residual.shape()), ", input has shape ", shape_str(x.shape()));
        FG_CHECK(residual.device() == x.device() && residual.dtype() == x.dtype(), op,
                 "residual is ", dtype_name(residual.dtype()), " on ",
                 device_name(residual.device()), ", input is ", dtype_name(x.dtype()), " on ",
                 device_name(x.device()));
    }
}

// ---- the autograd node -------------------------------------------------------------------------

// Inputs (edges) are always [x, residual, weight, bias], undefined where absent; outputs are y, and
// h when the residual add is fused.
class NormNode final : public Node {
public:
    NormNode(NormKind kind, const NormOptions& opt, bool residual, Tensor input, Tensor weight,
             DType param_dtype, Tensor mean, Tensor rstd)
        : Node(op_name(kind), residual ? 2 : 1), kind_(kind), opt_(opt), residual_(residual),
          input_(std::move(input)), weight_(std::move(weight)), param_dtype_(param_dtype),
          mean_(std::move(mean)), rstd_(std::move(rstd)) {}

    void release_saved() override {
        input_ = weight_ = mean_ = rstd_ = Tensor();
    }

    std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
        FG_ASSERT(input_.defined(), "norm node without saved input");
        Tensor gy = grads[0], gh = residual_ ? grads[1] : Tensor();
        DType xt = input_.dtype();
        if (gy.defined() && gy.dtype() != xt) gy = cast(gy, xt);
        if (gh.defined() && gh.dtype() != xt) gh = cast(gh, xt);
        bool want_w = next_edges[2].node != nullptr, want_b = next_edges[3].node != nullptr;
        if (!gy.defined()) {  // only h was used: the gradient passes straight through the add
            return {gh, residual_ ? gh : Tensor(), Tensor(), Tensor()};
        }
        Tensor dx = empty_like(input_);
        Tensor dw = want_w ? Tensor::empty({cols()}, param_dtype_, input_.device()) : Tensor();
        Tensor db = want_b ? Tensor::empty({cols()}, param_dtype_, input_.device()) : Tensor();
        if (input_.is_cuda()) backward_cuda(gy, gh, dx, dw, db);
        else backward_cpu(gy, gh, dx, dw, db);
        return {dx, residual_ ? dx : Tensor(), dw, db};
    }

private:
    std::int64_t cols() const { return input_.size(-1); }
    std::int64_t rows() const { return input_.numel() / cols(); }

    void backward_cuda(const Tensor& gy, const Tensor& gh, Tensor& dx, Tensor& dw, Tensor& db) {
        kernels::NormBackwardArgs a;
        a.kind = kind_;
        a.x_type = scalar_type(input_.dtype());
        a.w_type = scalar_type(param_dtype_);
        a.rows = rows();
        a.cols = cols();
        a.zero_centered = opt_.zero_centered;
        a.reduction = opt_.reduction;
        a.tuning = opt_.tuning;
        a.x = input_.raw_data();
        a.dy = gy.raw_data();
        a.dh = gh.defined() ? gh.raw_data() : nullptr;
        a.weight = weight_.defined() ? weight_.raw_data() : nullptr;
        a.mean = kind_ == NormKind::layer ? mean_.data<float>() : nullptr;
        a.rstd = rstd_.data<float>();
        a.dx = dx.raw_data();
        a.dweight = dw.defined() ? dw.raw_data() : nullptr;
        a.dbias = db.defined() ? db.raw_data() : nullptr;
        CudaBackend& cuda = cuda_backend(name().c_str());
        Tensor ws = scratch_bytes(Device::cuda, cuda.norm_backward_workspace_bytes(a));
        a.workspace = ws.raw_data();
        cuda.norm_backward(a);
    }

    void backward_cpu(const Tensor& gy, const Tensor& gh, Tensor& dx, Tensor& dw, Tensor& db) {
        // The reference computes in x's accumulate dtype (f64 for f64, else f32: 16-bit tensors
        // are widened); a weight of another dtype is converted for it, dw and db back.
        DType ct = accumulate_dtype(input_.dtype());
        Tensor x = widened(input_), gyw = widened(gy), ghw = widened(gh), work = computed_in(dx);
        Tensor w = weight_.defined() ? cast_raw(weight_, ct) : Tensor();
        Tensor dw_x = dw.defined() ? Tensor::empty({cols()}, ct) : Tensor();
        Tensor db_x = db.defined() ? Tensor::empty({cols()}, ct) : Tensor();
        dispatch_float(ct, [&](auto tag) {
            using T = decltype(tag);
            norm_backward_cpu<T>(kind_, ptr_or_null<T>(x), ptr_or_null<T>(gyw),
                                 ptr_or_null<T>(ghw), ptr_or_null<T>(w), opt_.zero_centered,
                                 ptr_or_null<T>(mean_), ptr_or_null<T>(rstd_), rows(), cols(),
                                 ptr_or_null<T>(work), ptr_or_null<T>(dw_x), ptr_or_null<T>(db_x));
        });
        round_into(work, dx);
        if (dw.defined()) dw = cast_raw(dw_x, dw.dtype());
        if (db.defined()) db = cast_raw(db_x, db.dtype());
    }

    NormKind kind_;
    NormOptions opt_;
    bool residual_;
    Tensor input_, weight_;
    DType param_dtype_;  // of weight and bias (and so of dw and db)
    Tensor mean_, rstd_;
};

// The dtype of the affine parameters: the weight's, else the bias's, else the input's.
DType param_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return weight.defined() ? weight.dtype() : bias.defined() ? bias.dtype() : x.dtype();
}

// ---- forward -------------------------------------------------------------------------------

NormResidualResult norm_forward(NormKind kind, const Tensor& x, const Tensor& residual,
                                const Tensor& weight, const Tensor& bias, const NormOptions& opt) {
    check_inputs(kind, x, residual, weight, bias, opt);
    const bool grad = needs_grad({x, residual, weight, bias});
    const std::int64_t cols = x.size(-1), rows = x.numel() / cols;
    Tensor y = empty_like(x);
    Tensor h = residual.defined() ? empty_like(x) : Tensor();
    Tensor mean, rstd;
    if (x.is_cuda()) {
        if (grad) {
            rstd = Tensor::empty({rows}, DType::f32, Device::cuda);
            if (kind == NormKind::layer) mean = Tensor::empty({rows}, DType::f32, Device::cuda);
        }
        kernels::NormForwardArgs a;
        a.kind = kind;
        a.x_type = scalar_type(x.dtype());
        a.w_type = scalar_type(param_dtype(x, weight, bias));
        a.rows = rows;
        a.cols = cols;
        a.eps = static_cast<float>(opt.eps);
        a.zero_centered = opt.zero_centered;
        a.tuning = opt.tuning;
        a.x = x.raw_data();
        a.residual = residual.defined() ? residual.raw_data() : nullptr;
        a.h_out = h.defined() ? h.raw_data() : nullptr;
        a.weight = weight.defined() ? weight.raw_data() : nullptr;
        a.bias = bias.defined() ? bias.raw_data() : nullptr;
        a.y = y.raw_data();
        a.mean = mean.defined() ? mean.data<float>() : nullptr;
        a.rstd = rstd.defined() ? rstd.data<float>() : nullptr;
        cuda_backend(op_name(kind)).norm_forward(a);
    } else {
        // Computed in x's accumulate dtype (16-bit x widened to f32; statistics f32), weights
        // converted to it; y and h rounded once to x's dtype.
        DType ct = accumulate_dtype(x.dtype());
        if (grad) {
            rstd = Tensor::empty({rows}, ct);
            if (kind == NormKind::layer) mean = Tensor::empty({rows}, ct);
        }
        Tensor xw = widened(x), rw = widened(residual), yw = computed_in(y), hw = computed_in(h);
        Tensor w = weight.defined() ? cast_raw(weight, ct) : Tensor();
        Tensor b = bias.defined() ? cast_raw(bias, ct) : Tensor();
        dispatch_float(ct, [&](auto tag) {
            using T = decltype(tag);
            norm_forward_cpu<T>(kind, ptr_or_null<T>(xw), ptr_or_null<T>(rw), ptr_or_null<T>(hw),
                                ptr_or_null<T>(w), ptr_or_null<T>(b), opt.zero_centered, opt.eps,
                                rows, cols, ptr_or_null<T>(yw), ptr_or_null<T>(mean),
                                ptr_or_null<T>(rstd), x.dtype());
        });
        round_into(yw, y);
        round_into(hw, h);
    }
    if (grad) {
        Tensor saved_input = (residual.defined() ? h : x).detach();
        auto node = std::make_shared<NormNode>(kind, opt, residual.defined(), saved_input,
                                               weight.defined() ? weight.detach() : Tensor(),
                                               param_dtype(x, weight, bias), mean, rstd);
        std::vector<Tensor> outputs{y};
        if (h.defined()) outputs.push_back(h);
        record_node(node, {x, residual, weight, bias}, outputs);
    }
    return {y, h};
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const NormOptions& opt) {
    return norm_forward(NormKind::rms, x, Tensor(), weight, bias, opt).y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const NormOptions& opt) {
    return norm_forward(NormKind::layer, x, Tensor(), weight, bias, opt).y;
}

NormResidualResult rms_norm_residual(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                     const Tensor& bias, const NormOptions& opt) {
    check_defined("rmsnorm", residual, "residual");
    return norm_forward(NormKind::rms, x, residual, weight, bias, opt);
}

NormResidualResult layer_norm_residual(const Tensor& x, const Tensor& residual,
                                       const Tensor& weight, const Tensor& bias,
                                       const NormOptions& opt) {
    check_defined("layernorm", residual, "residual");
    return norm_forward(NormKind::layer, x, residual, weight, bias, opt);
}

}  // namespace fg
