// capi/fusegrad_norm.cpp: the C ABI of capi/fusegrad_norm.h over kernels/norm.h. Each entry point
// checks its arguments (naming the one that is wrong; all but the device and the workspace size
// before any CUDA call), makes the caller's device current and the caller's stream fusegrad's
// stream for the call (StreamOverride, kernels/runtime.h), runs the launcher, and turns every
// exception into an error code plus the thread's last-error message. Nothing here allocates device
// memory or synchronises.
#include "capi/fusegrad_norm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/norm.h"
#include "kernels/runtime.h"

namespace {

using fg::kernels::NormKind;
using fg::kernels::NormReduction;
using fg::kernels::ScalarType;

// A bad argument: reported as FGN_ERROR_ARGUMENT.
struct ArgumentError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

thread_local std::string t_last_error;

template <typename... Parts>
[[noreturn]] void fail(const char* fn, const Parts&... parts) {
    std::ostringstream msg;
    msg << "[" << fn << "] ";
    (msg << ... << parts);
    throw ArgumentError(msg.str());
}

// Runs `body`, mapping what it throws to a return code and the thread's message.
template <typename Body>
int guarded(Body&& body) {
    try {
        body();
        return FGN_OK;
    } catch (const ArgumentError& e) {
        t_last_error = e.what();
        return FGN_ERROR_ARGUMENT;
    } catch (const fg::CudaError& e) {
        t_last_error = e.what();
        return FGN_ERROR_CUDA;
    } catch (const std::exception& e) {
        t_last_error = std::string("[fusegrad_norm] ") + e.what();
        return FGN_ERROR_INTERNAL;
    } catch (...) {
        t_last_error = "[fusegrad_norm] unknown exception";
        return FGN_ERROR_INTERNAL;
    }
}

const char* dtype_name(int t) {
    switch (t) {
        case FGN_F32:
            return "FGN_F32";
        case FGN_BF16:
            return "FGN_BF16";
        case FGN_F16:
            return "FGN_F16";
        default:
            return "an unknown dtype";
    }
}

// The checks forward and backward share: kind, dtypes, shape, zero-centring.
void check_common(const char* fn, int kind, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                  int zero_centered, const void* weight, int device) {
    if (kind != FGN_RMS_NORM && kind != FGN_LAYER_NORM)
        fail(fn, "kind must be FGN_RMS_NORM (0) or FGN_LAYER_NORM (1), got ", kind);
    if (x_dtype != FGN_F32 && x_dtype != FGN_BF16 && x_dtype != FGN_F16)
        fail(fn, "x_dtype must be FGN_F32 (0), FGN_BF16 (2) or FGN_F16 (3), got ", x_dtype);
    if (w_dtype != FGN_F32 && w_dtype != x_dtype)
        fail(fn, "w_dtype must be FGN_F32 or x_dtype (", dtype_name(x_dtype), "), got ", w_dtype,
             " (", dtype_name(w_dtype), ")");
    if (rows < 0) fail(fn, "rows must be >= 0, got ", rows);
    if (cols < 1 || cols > fg::kernels::kNormMaxCols)
        fail(fn, "cols must be in 1..2^30, got ", cols);
    if (zero_centered && !weight) fail(fn, "zero_centered needs a weight (weight is NULL)");
    if (device < 0) fail(fn, "device must be a CUDA device index >= 0, got ", device);
}

void require(const char* fn, const void* ptr, const char* name) {
    if (!ptr) fail(fn, name, " is NULL");
}

// The device the kernels run on in this process: the first one a call named (see the header).
std::atomic<int> g_device{-1};

// Makes `device` current for the call (restoring the caller's on exit), after checking that this
// process may run the kernels there.
class DeviceScope {
  public:
    DeviceScope(const char* fn, int device) {
        int count = 0;
        FG_CUDA_CHECK(cudaGetDeviceCount(&count));
        if (device >= count)
            fail(fn, "device is ", device, ", but this process sees ", count, " CUDA device",
                 count == 1 ? "" : "s");
        int first = -1;
        if (!g_device.compare_exchange_strong(first, device)) {
            if (first != device)
                fail(fn, "the norm kernels ran on CUDA device ", first,
                     " in this process and cannot also run on device ", device,
                     ": their launch settings are kept once per process (run one process per "
                     "GPU, as torch.distributed does)");
        } else if (device != 0) {
            // The launch plans read device 0's properties (kernels/runtime.h device_info).
            check_same_as_device0(fn, device);
        }
        FG_CUDA_CHECK(cudaGetDevice(&previous_));
        if (previous_ != device) FG_CUDA_CHECK(cudaSetDevice(device));
        restore_ = previous_ != device;
    }
    ~DeviceScope() {
        if (restore_) cudaSetDevice(previous_);  // never throws: a failure here changes nothing
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

  private:
    static void check_same_as_device0(const char* fn, int device) {
        cudaDeviceProp p{};
        FG_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
        const fg::kernels::DeviceInfo& d0 = fg::kernels::device_info();
        if (p.multiProcessorCount != d0.sm_count || p.major != d0.compute_major ||
            (int)p.sharedMemPerBlockOptin != d0.smem_per_block_optin) {
            g_device.store(-1);
            fail(fn, "device ", device, " (", p.name, ") is not the same model as device 0 (",
                 d0.name, "), whose properties the kernels' launch plans read");
        }
    }
    int previous_ = 0;
    bool restore_ = false;
};

fg::kernels::NormBackwardArgs backward_args(const char* fn, int kind, int x_dtype, int w_dtype,
                                            int64_t rows, int64_t cols, int zero_centered,
                                            int reduction, const void* x, const void* dy,
                                            const void* dh, const void* weight, const float* mean,
                                            const float* rstd, void* dx, void* dweight, void* dbias,
                                            int device) {
    check_common(fn, kind, x_dtype, w_dtype, rows, cols, zero_centered, weight, device);
    if (reduction < FGN_REDUCTION_AUTO || reduction > FGN_REDUCTION_GRID)
        fail(fn,
             "reduction must be FGN_REDUCTION_AUTO (0), FGN_REDUCTION_LOCKED (1) or "
             "FGN_REDUCTION_GRID (2), got ",
             reduction);
    if (dweight && !weight) fail(fn, "dweight is asked for but weight is NULL");
    if (rows > 0) {
        require(fn, x, "x");
        require(fn, dy, "dy");
        require(fn, dx, "dx");
        require(fn, rstd, "rstd");
        if (kind == FGN_LAYER_NORM) require(fn, mean, "mean (LayerNorm)");
    }
    fg::kernels::NormBackwardArgs a;
    a.kind = static_cast<NormKind>(kind);
    a.x_type = static_cast<ScalarType>(x_dtype);
    a.w_type = static_cast<ScalarType>(w_dtype);
    a.rows = rows;
    a.cols = cols;
    a.zero_centered = zero_centered != 0;
    a.reduction = static_cast<NormReduction>(reduction);
    a.x = x;
    a.dy = dy;
    a.dh = dh;
    a.weight = weight;
    a.mean = kind == FGN_LAYER_NORM ? mean : nullptr;
    a.rstd = rstd;
    a.dx = dx;
    a.dweight = dweight;
    a.dbias = dbias;
    return a;
}

}  // namespace

extern "C" {

int fgn_abi_version(void) {
    return FGN_ABI_VERSION;
}

const char* fgn_last_error(void) {
    return t_last_error.c_str();
}

int fgn_norm_forward(int kind, int x_dtype, int w_dtype, int64_t rows, int64_t cols, float eps,
                     int zero_centered, const void* x, const void* residual, void* h_out,
                     const void* weight, const void* bias, void* y, float* mean, float* rstd,
                     int device, void* stream) {
    return guarded([&] {
        const char* fn = "fgn_norm_forward";
        check_common(fn, kind, x_dtype, w_dtype, rows, cols, zero_centered, weight, device);
        if (!std::isfinite(eps) || eps <= 0.0f) fail(fn, "eps must be finite and > 0, got ", eps);
        if ((residual != nullptr) != (h_out != nullptr))
            fail(fn, residual ? "h_out is NULL: a residual needs h_out to receive x + residual"
                              : "h_out is given without a residual");
        if (kind == FGN_LAYER_NORM && (mean != nullptr) != (rstd != nullptr))
            fail(fn, "mean and rstd must both be given (for a backward) or both be NULL");
        if (rows == 0) return;
        require(fn, x, "x");
        require(fn, y, "y");
        fg::kernels::NormForwardArgs a;
        a.kind = static_cast<NormKind>(kind);
        a.x_type = static_cast<ScalarType>(x_dtype);
        a.w_type = static_cast<ScalarType>(w_dtype);
        a.rows = rows;
        a.cols = cols;
        a.eps = eps;
        a.zero_centered = zero_centered != 0;
        a.x = x;
        a.residual = residual;
        a.h_out = h_out;
        a.weight = weight;
        a.bias = bias;
        a.y = y;
        a.mean = kind == FGN_LAYER_NORM ? mean : nullptr;
        a.rstd = rstd;
        DeviceScope scope(fn, device);
        fg::kernels::StreamOverride on(static_cast<cudaStream_t>(stream));
        fg::kernels::norm_forward(a);
    });
}

int fgn_norm_backward_workspace_bytes(int kind, int x_dtype, int w_dtype, int64_t rows,
                                      int64_t cols, int zero_centered, int reduction, const void* x,
                                      const void* dy, const void* dh, const void* weight,
                                      const float* mean, const float* rstd, void* dx, void* dweight,
                                      void* dbias, int device, size_t* bytes) {
    return guarded([&] {
        const char* fn = "fgn_norm_backward_workspace_bytes";
        require(fn, bytes, "bytes");
        *bytes = 0;
        auto a = backward_args(fn, kind, x_dtype, w_dtype, rows, cols, zero_centered, reduction, x,
                               dy, dh, weight, mean, rstd, dx, dweight, dbias, device);
        if (rows == 0 || (!dweight && !dbias)) return;  // no partial rows: no workspace
        DeviceScope scope(fn, device);
        *bytes = fg::kernels::norm_backward_workspace_bytes(a);
    });
}

int fgn_norm_backward(int kind, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                      int zero_centered, int reduction, const void* x, const void* dy,
                      const void* dh, const void* weight, const float* mean, const float* rstd,
                      void* dx, void* dweight, void* dbias, void* workspace, size_t workspace_bytes,
                      int device, void* stream) {
    return guarded([&] {
        const char* fn = "fgn_norm_backward";
        auto a = backward_args(fn, kind, x_dtype, w_dtype, rows, cols, zero_centered, reduction, x,
                               dy, dh, weight, mean, rstd, dx, dweight, dbias, device);
        DeviceScope scope(fn, device);
        fg::kernels::StreamOverride on(static_cast<cudaStream_t>(stream));
        const std::size_t needed =
            rows > 0 && (dweight || dbias) ? fg::kernels::norm_backward_workspace_bytes(a) : 0;
        if (workspace_bytes < needed || (needed > 0 && !workspace))
            fail(fn, "workspace has ", workspace ? workspace_bytes : 0, " bytes, the call needs ",
                 needed, " (fgn_norm_backward_workspace_bytes)");
        a.workspace = workspace;
        fg::kernels::norm_backward(a);
    });
}

}  // extern "C"
