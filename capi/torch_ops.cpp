// capi/torch_ops.cpp: fusegrad's norm kernels as PyTorch operators, registered with PyTorch's
// dispatcher in C++. Built as libfusegrad_torch.so against the installed PyTorch (the package's
// _library.py loads it with torch.ops.load_library); it calls the kernels through the C ABI of
// fusegrad_norm.h (libfusegrad_norm.so beside it). The framework itself never includes torch.
//
//   fusegrad::norm_forward(input, residual?, weight?, bias?, kind, eps, zero_centered, reduction,
//                          save_stats) -> (y, h, mean, rstd)
//   fusegrad::norm_backward(grad_y, grad_h?, saved, weight?, mean, rstd, kind, zero_centered,
//                           reduction, param_dtype, want_dweight, want_dbias)
//                          -> (grad_input, grad_weight, grad_bias)
//
// input, residual, y, h are (..., N) and contiguous; weight, bias (N,); mean, rstd (M,) fp32, M the
// product of the leading dims. Outputs a call does not make are empty tensors: h without a
// residual, mean for RMSNorm, both statistics without save_stats. kind: 0 RMSNorm, 1 LayerNorm;
// reduction: 0 auto, 1 locked, 2 grid (how dw / db are summed across rows).
//
// Each op has a CUDA implementation (the kernels on PyTorch's current stream, every buffer from
// PyTorch's allocator, so CUDA graphs and streams see them as any op) and a Meta one (shapes only:
// torch.compile traces with it); both run the same argument checks first, whose messages name the
// argument. norm_forward's derivative is registered under the Autograd key, in C++: autograd calls
// norm_backward through the dispatcher with no Python on the way. norm_backward has none: a double
// backward is refused.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "capi/fusegrad_norm.h"

namespace {

using at::Tensor;
using std::optional;

constexpr int64_t kRms = FGN_RMS_NORM, kLayer = FGN_LAYER_NORM;

// ---- the messages' pieces, written as the Python side writes them ------------------------------

const char* function_name(int64_t kind) {
    return kind == kRms ? "fusegrad.rms_norm" : "fusegrad.layer_norm";
}

std::string dtype_name(at::ScalarType t) { return c10::getDtypeNames(t).first; }

// A size as text: its value, or for torch.compile's symbolic sizes the symbol. (Not through
// SymInt's operator<<, which crashed in a library built by GCC 13 against PyTorch 2.11's wheel.)
std::string int_text(const c10::SymInt& v) {
    if (auto i = v.maybe_as_int()) return std::to_string(*i);
    return v.toSymNodeImplUnowned()->str();
}

// (2, 3) and (5,), as Python prints a tuple.
std::string tuple_text(c10::SymIntArrayRef ints) {
    std::string s = "(";
    for (size_t i = 0; i < ints.size(); ++i) s += (i ? ", " : "") + int_text(ints[i]);
    return s + (ints.size() == 1 ? ",)" : ")");
}

// A float as Python's repr writes it: the fewest digits that read back the same; 0.0, not 0.
std::string float_text(double v) {
    char buf[32];
    for (int digits = 1; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (!std::isfinite(v) || std::strtod(buf, nullptr) == v) break;
    }
    std::string text = buf;
    if (std::isfinite(v) && text.find_first_of(".en") == std::string::npos) text += ".0";
    return text;
}

std::string shape(const Tensor& t) { return tuple_text(t.sym_sizes()); }

// The C ABI's code of a dtype the checks let through (float32, bfloat16, float16).
int dtype_code(at::ScalarType t) {
    TORCH_INTERNAL_ASSERT(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
    return t == at::kFloat ? FGN_F32 : t == at::kBFloat16 ? FGN_BF16 : FGN_F16;
}

// Sizes are SymInts, so that torch.compile's symbolic shapes pass through the Meta
// implementations; on real tensors they are plain integers.
c10::SymInt rows_of(const Tensor& t) { return t.sym_numel() / t.sym_size(-1); }

// ---- argument checks, shared by the CUDA and the Meta implementations --------------------------

void check_input(const char* fn, const Tensor& input) {
    const auto device = input.device().type();
    TORCH_CHECK_VALUE(device == at::kCUDA || device == at::kMeta, fn, ": input is on ",
                      input.device().str(), ": fusegrad's norm kernels run on CUDA tensors only "
                      "(move the tensors and the module with .cuda())");
    const auto t = input.scalar_type();
    TORCH_CHECK_TYPE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, fn, ": input is ",
                     dtype_name(t), ": the kernels take float32, bfloat16 and float16");
    TORCH_CHECK_VALUE(input.dim() >= 1 && input.sym_size(-1) >= 1, fn,
                      ": input needs a non-empty last dimension, got shape ", shape(input));
}

void check_placement(const char* fn, const char* name, const Tensor& t, const Tensor& input) {
    TORCH_CHECK_VALUE(t.device() == input.device(), fn, ": ", name, " is on ", t.device().str(),
                      ", input is on ", input.device().str(),
                      ": all tensors must be on the input's device");
    TORCH_CHECK_VALUE(t.is_contiguous(), fn, ": ", name, " is not contiguous (shape ", shape(t),
                      ", strides ", tuple_text(t.sym_strides()), ")");
}

at::ScalarType param_dtype(const Tensor& input, const optional<Tensor>& weight,
                           const optional<Tensor>& bias) {
    return weight ? weight->scalar_type() : bias ? bias->scalar_type() : input.scalar_type();
}

void check_forward(const Tensor& input, const optional<Tensor>& residual,
                   const optional<Tensor>& weight, const optional<Tensor>& bias, int64_t kind,
                   double eps, bool zero_centered, int64_t reduction) {
    TORCH_CHECK_VALUE(kind == kRms || kind == kLayer, "fusegrad::norm_forward: kind must be 0 "
                      "(RMSNorm) or 1 (LayerNorm), got ", kind);
    const char* fn = function_name(kind);
    check_input(fn, input);
    check_placement(fn, "input", input, input);
    const c10::SymInt n = input.sym_size(-1);
    if (residual) {
        TORCH_CHECK_VALUE(residual->sym_sizes() == input.sym_sizes(), fn, ": residual has shape ",
                          shape(*residual), ", input has shape ", shape(input),
                          ": they must be the same");
        TORCH_CHECK_TYPE(residual->scalar_type() == input.scalar_type(), fn, ": residual is ",
                         dtype_name(residual->scalar_type()), ", input is ",
                         dtype_name(input.scalar_type()), ": they must be the same dtype");
        check_placement(fn, "residual", *residual, input);
    }
    for (const auto& [name, p] : {std::pair{"weight", &weight}, std::pair{"bias", &bias}}) {
        if (!*p) continue;
        const Tensor& t = **p;
        TORCH_CHECK_VALUE(t.dim() == 1 && t.sym_size(0) == n, fn, ": ", name, " has shape ", shape(t),
                          ", but the input's rows have ", int_text(n), " values: it must have shape (",
                          int_text(n), ",)");
        TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == input.scalar_type(),
                         fn, ": ", name, " is ", dtype_name(t.scalar_type()), ", input is ",
                         dtype_name(input.scalar_type()),
                         ": weights must be float32 or the input's dtype");
        check_placement(fn, name, t, input);
    }
    TORCH_CHECK_TYPE(!weight || !bias || weight->scalar_type() == bias->scalar_type(), fn,
                     ": weight is ", dtype_name(weight ? weight->scalar_type() : at::kFloat),
                     " and bias is ", dtype_name(bias ? bias->scalar_type() : at::kFloat),
                     ": they must be the same dtype");
    TORCH_CHECK_VALUE(!zero_centered || weight, fn,
                      ": zero_centered=True needs a weight (weight is None)");
    TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, fn, ": eps must be a finite number > 0, got ",
                      float_text(eps));
    TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, fn,
                      ": reduction must be one of 'auto', 'locked', 'grid', got ", reduction);
}

void check_backward(const Tensor& grad_y, const optional<Tensor>& grad_h, const Tensor& saved,
                    const optional<Tensor>& weight, const Tensor& mean, const Tensor& rstd,
                    int64_t kind, int64_t reduction, at::ScalarType param_dtype,
                    bool want_dweight) {
    const char* fn = "fusegrad::norm_backward";
    TORCH_CHECK_VALUE(kind == kRms || kind == kLayer, fn,
                      ": kind must be 0 (RMSNorm) or 1 (LayerNorm), got ", kind);
    check_input(fn, saved);
    check_placement(fn, "saved", saved, saved);
    TORCH_CHECK_TYPE(param_dtype == at::kFloat || param_dtype == saved.scalar_type(), fn,
                     ": param_dtype is ", dtype_name(param_dtype), ", the saved input is ",
                     dtype_name(saved.scalar_type()),
                     ": weights must be float32 or the input's dtype");
    TORCH_CHECK_TYPE(!weight || weight->scalar_type() == param_dtype, fn, ": weight is ",
                     dtype_name(weight ? weight->scalar_type() : param_dtype),
                     ", param_dtype is ", dtype_name(param_dtype), ": they must be the same");
    const c10::SymInt rows = rows_of(saved);
    for (const auto& [name, p] : {std::pair{"grad_y", optional<Tensor>(grad_y)},
                                  std::pair{"grad_h", grad_h}}) {
        if (!p) continue;
        TORCH_CHECK_VALUE(p->sym_sizes() == saved.sym_sizes() && p->scalar_type() == saved.scalar_type(),
                          fn, ": ", name, " is ", dtype_name(p->scalar_type()), " ", shape(*p),
                          ", the saved input is ", dtype_name(saved.scalar_type()), " ",
                          shape(saved));
        check_placement(fn, name, *p, saved);
    }
    for (const auto& [name, t] : {std::pair{"rstd", &rstd}, std::pair{"mean", &mean}}) {
        if (t == &mean && kind != kLayer) continue;
        TORCH_CHECK_VALUE(rows == 0 || (t->scalar_type() == at::kFloat && t->dim() == 1 &&
                                        t->sym_size(0) == rows),
                          fn, ": ", name, " is ", dtype_name(t->scalar_type()), " ", shape(*t),
                          ", expected float32 (", int_text(rows), ",) (the forward's statistics; a forward "
                          "run with save_stats=False has none)");
        check_placement(fn, name, *t, saved);
    }
    if (weight) {
        TORCH_CHECK_VALUE(weight->dim() == 1 && weight->sym_size(0) == saved.sym_size(-1), fn,
                          ": weight has shape ", shape(*weight), ", the input's rows have ",
                          int_text(saved.sym_size(-1)), " values");
        check_placement(fn, "weight", *weight, saved);
    }
    TORCH_CHECK_VALUE(weight || !want_dweight, fn, ": want_dweight without a weight");
    TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, fn,
                      ": reduction must be 0, 1 or 2, got ", reduction);
}

// ---- outputs (the Meta implementations are these alone) ----------------------------------------

using Forward = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using Backward = std::tuple<Tensor, Tensor, Tensor>;

Forward forward_outputs(const Tensor& input, bool residual, int64_t kind, bool save_stats) {
    const c10::SymInt rows = rows_of(input), none = 0;
    const auto stats = input.options().dtype(at::kFloat);
    Tensor y = at::empty_like(input, at::MemoryFormat::Contiguous);
    Tensor h = residual ? at::empty_like(y) : at::empty({0}, input.options());
    Tensor rstd = at::empty_symint({save_stats ? rows : none}, stats);
    Tensor mean = at::empty_symint({save_stats && kind == kLayer ? rows : none}, stats);
    return {y, h, mean, rstd};
}

Backward backward_outputs(const Tensor& saved, at::ScalarType param_dtype, bool want_dweight,
                          bool want_dbias) {
    const c10::SymInt n = saved.sym_size(-1), none = 0;
    const auto options = saved.options().dtype(param_dtype);
    return {at::empty_like(saved, at::MemoryFormat::Contiguous),
            at::empty_symint({want_dweight ? n : none}, options),
            at::empty_symint({want_dbias ? n : none}, options)};
}

Forward forward_meta(const Tensor& input, const optional<Tensor>& residual,
                     const optional<Tensor>& weight, const optional<Tensor>& bias, int64_t kind,
                     double eps, bool zero_centered, int64_t reduction, bool save_stats) {
    check_forward(input, residual, weight, bias, kind, eps, zero_centered, reduction);
    return forward_outputs(input, residual.has_value(), kind, save_stats);
}

Backward backward_meta(const Tensor& grad_y, const optional<Tensor>& grad_h, const Tensor& saved,
                       const optional<Tensor>& weight, const Tensor& mean, const Tensor& rstd,
                       int64_t kind, bool /*zero_centered*/, int64_t reduction,
                       at::ScalarType param_dtype, bool want_dweight, bool want_dbias) {
    check_backward(grad_y, grad_h, saved, weight, mean, rstd, kind, reduction, param_dtype,
                   want_dweight);
    return backward_outputs(saved, param_dtype, want_dweight, want_dbias);
}

// ---- CUDA: the kernels through the C ABI --------------------------------------------------------

const void* ptr(const Tensor& t) { return t.numel() > 0 ? t.data_ptr() : nullptr; }
const void* ptr(const optional<Tensor>& t) { return t ? ptr(*t) : nullptr; }
void* out_ptr(Tensor& t) { return t.numel() > 0 ? t.data_ptr() : nullptr; }

// PyTorch's current stream on `device`, asked through c10's device-guard interface (so that
// this library needs none of PyTorch's CUDA libraries to link).
void* current_stream(const at::Device& device) {
    return c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(device).native_handle();
}

// A failed C ABI call as a Python exception: ValueError for an argument the library refused.
void check(int rc) {
    if (rc == FGN_OK) return;
    TORCH_CHECK_VALUE(rc != FGN_ERROR_ARGUMENT, "fusegrad: ", fgn_last_error());
    TORCH_CHECK(false, "fusegrad: ", fgn_last_error());
}

Forward forward_cuda(const Tensor& input, const optional<Tensor>& residual,
                     const optional<Tensor>& weight, const optional<Tensor>& bias, int64_t kind,
                     double eps, bool zero_centered, int64_t reduction, bool save_stats) {
    check_forward(input, residual, weight, bias, kind, eps, zero_centered, reduction);
    c10::DeviceGuard guard(input.device());
    auto [y, h, mean, rstd] = forward_outputs(input, residual.has_value(), kind, save_stats);
    const int64_t rows = input.numel() / input.size(-1);
    if (rows == 0) return {y, h, mean, rstd};
    check(fgn_norm_forward(static_cast<int>(kind), dtype_code(input.scalar_type()),
                           dtype_code(param_dtype(input, weight, bias)), rows, input.size(-1),
                           static_cast<float>(eps), zero_centered, input.data_ptr(), ptr(residual),
                           out_ptr(h), ptr(weight), ptr(bias), y.data_ptr(),
                           static_cast<float*>(out_ptr(mean)), static_cast<float*>(out_ptr(rstd)),
                           input.device().index(), current_stream(input.device())));
    return {y, h, mean, rstd};
}

Backward backward_cuda(const Tensor& grad_y, const optional<Tensor>& grad_h, const Tensor& saved,
                       const optional<Tensor>& weight, const Tensor& mean, const Tensor& rstd,
                       int64_t kind, bool zero_centered, int64_t reduction,
                       at::ScalarType param_dtype, bool want_dweight, bool want_dbias) {
    check_backward(grad_y, grad_h, saved, weight, mean, rstd, kind, reduction, param_dtype,
                   want_dweight);
    c10::DeviceGuard guard(saved.device());
    auto [dx, dw, db] = backward_outputs(saved, param_dtype, want_dweight, want_dbias);
    const int k = static_cast<int>(kind), x_t = dtype_code(saved.scalar_type()),
              w_t = dtype_code(param_dtype), red = static_cast<int>(reduction);
    const int64_t cols = saved.size(-1), rows = saved.numel() / cols;
    const auto* m = static_cast<const float*>(ptr(mean));
    const auto* r = static_cast<const float*>(ptr(rstd));
    const int device = saved.device().index();
    size_t bytes = 0;
    check(fgn_norm_backward_workspace_bytes(k, x_t, w_t, rows, cols, zero_centered, red,
                                            ptr(saved), ptr(grad_y), ptr(grad_h), ptr(weight), m,
                                            r, out_ptr(dx), out_ptr(dw), out_ptr(db), device,
                                            &bytes));
    Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, saved.options().dtype(at::kByte));
    check(fgn_norm_backward(k, x_t, w_t, rows, cols, zero_centered, red, ptr(saved), ptr(grad_y),
                            ptr(grad_h), ptr(weight), m, r, out_ptr(dx), out_ptr(dw), out_ptr(db),
                            out_ptr(workspace), bytes, device, current_stream(saved.device())));
    return {dx, dw, db};
}

// ---- autograd: norm_forward's derivative is norm_backward ---------------------------------------

// What norm_forward's backward needs besides tensors, packed into one int64 of the context.
struct Settings {
    int64_t kind, reduction;
    bool zero_centered, residual, want_dweight, want_dbias;
    at::ScalarType param_dtype;

    int64_t pack() const {
        return kind | reduction << 1 | int64_t(zero_centered) << 3 | int64_t(residual) << 4 |
               int64_t(want_dweight) << 5 | int64_t(want_dbias) << 6 |
               int64_t(static_cast<int8_t>(param_dtype)) << 8;
    }
    static Settings unpack(int64_t v) {
        return {v & 1,         v >> 1 & 3,    bool(v >> 3 & 1), bool(v >> 4 & 1),
                bool(v >> 5 & 1), bool(v >> 6 & 1), static_cast<at::ScalarType>(v >> 8 & 0xff)};
    }
};

class NormFunction : public torch::autograd::Function<NormFunction> {
public:
    static torch::autograd::variable_list forward(
            torch::autograd::AutogradContext* ctx, const Tensor& input,
            const optional<Tensor>& residual, const optional<Tensor>& weight,
            const optional<Tensor>& bias, int64_t kind, double eps, bool zero_centered,
            int64_t reduction, bool save_stats) {
        static const auto op = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("fusegrad::norm_forward", "")
                                       .typed<decltype(forward_cuda)>();
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        auto [y, h, mean, rstd] = op.call(input, residual, weight, bias, kind, eps,
                                          zero_centered, reduction, save_stats);
        // The backward reads the normalised tensor: h when the residual add was fused.
        ctx->save_for_backward({residual ? h : input, weight.value_or(Tensor()), mean, rstd});
        // The settings in one integer (one lookup of the context's map each way).
        ctx->saved_data["settings"] = Settings{kind, reduction, zero_centered, residual.has_value(),
                                               weight && weight->requires_grad(),
                                               bias && bias->requires_grad(),
                                               param_dtype(input, weight, bias)}
                                              .pack();
        ctx->mark_non_differentiable({mean, rstd});
        // An unused output's gradient stays undefined (no zeros made and filled for it): the
        // backward skips the kernels when only h was used, and passes no zero dh.
        ctx->set_materialize_grads(false);
        return {y, h, mean, rstd};
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        static const auto op = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("fusegrad::norm_backward", "")
                                       .typed<decltype(backward_cuda)>();
        const auto saved = ctx->get_saved_variables();
        const Settings set = Settings::unpack(ctx->saved_data["settings"].toInt());
        const bool residual = set.residual, want_dw = set.want_dweight, want_db = set.want_dbias;
        const int64_t kind = set.kind;
        optional<Tensor> grad_h;
        if (residual && grads[1].defined()) grad_h = grads[1].contiguous();
        const Tensor none;
        if (!grads[0].defined())  // only h was used: its gradient passes to input and residual
            return {grad_h.value_or(none), grad_h.value_or(none), none, none, none, none, none,
                    none, none};
        TORCH_CHECK(saved[0].sym_numel() == 0 || saved[3].sym_numel() > 0, function_name(kind),
                    ": the forward ran with save_stats=False, so it kept no statistics and cannot "
                    "be differentiated");
        const optional<Tensor> weight =
                saved[1].defined() ? optional<Tensor>(saved[1]) : std::nullopt;
        // Below autograd unless a graph of the backward is being built (create_graph), where the
        // dispatcher's autograd fallback then says that norm_backward has no derivative.
        std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
        if (!at::GradMode::is_enabled()) below_autograd.emplace();
        auto [dx, dw, db] = op.call(grads[0].contiguous(), grad_h, saved[0], weight, saved[2],
                                    saved[3], kind, set.zero_centered, set.reduction,
                                    set.param_dtype, want_dw,
                                    want_db);
        return {dx, residual ? dx : none, want_dw ? dw : none, want_db ? db : none, none, none,
                none, none, none};
    }
};

Forward forward_autograd(const Tensor& input, const optional<Tensor>& residual,
                         const optional<Tensor>& weight, const optional<Tensor>& bias,
                         int64_t kind, double eps, bool zero_centered, int64_t reduction,
                         bool save_stats) {
    auto out = NormFunction::apply(input, residual, weight, bias, kind, eps, zero_centered,
                                   reduction, save_stats);
    return {out[0], out[1], out[2], out[3]};
}

}  // namespace

// needs_fixed_stride_order: Inductor keeps the strides the ops were traced with (they need
// contiguous tensors).
TORCH_LIBRARY(fusegrad, m) {
    m.def("norm_forward(Tensor input, Tensor? residual, Tensor? weight, Tensor? bias, int kind, "
          "float eps, bool zero_centered, int reduction, bool save_stats) "
          "-> (Tensor, Tensor, Tensor, Tensor)",
          {at::Tag::needs_fixed_stride_order});
    m.def("norm_backward(Tensor grad_y, Tensor? grad_h, Tensor saved, Tensor? weight, "
          "Tensor mean, Tensor rstd, int kind, bool zero_centered, int reduction, "
          "ScalarType param_dtype, bool want_dweight, bool want_dbias) "
          "-> (Tensor, Tensor, Tensor)",
          {at::Tag::needs_fixed_stride_order});
}

TORCH_LIBRARY_IMPL(fusegrad, CUDA, m) {
    m.impl("norm_forward", forward_cuda);
    m.impl("norm_backward", backward_cuda);
}

// CPU tensors get the checks' message ("input is on cpu: ... CUDA tensors only"), not the
// dispatcher's list of backends.
TORCH_LIBRARY_IMPL(fusegrad, CPU, m) {
    m.impl("norm_forward", forward_cuda);
    m.impl("norm_backward", backward_cuda);
}

TORCH_LIBRARY_IMPL(fusegrad, Meta, m) {
    m.impl("norm_forward", forward_meta);
    m.impl("norm_backward", backward_meta);
}

// norm_backward has no derivative: differentiating it (create_graph) is an error, not the
// dispatcher's default of a warning and a gradient left out.
TORCH_LIBRARY_IMPL(fusegrad, Autograd, m) {
    m.impl("norm_forward", forward_autograd);
    m.impl("norm_backward", torch::autograd::autogradNotImplementedFallback());
}
