/* capi/fusegrad_norm.h: a plain C ABI over fusegrad's fused RMSNorm / LayerNorm kernels
 * (kernels/norm.h states their math), built as the shared library libfusegrad_norm.so.
 *
 * It exists for callers that must not link fusegrad's C++: the PyTorch package's operators
 * (capi/torch_ops.cpp, libfusegrad_torch.so) call it and allocate every buffer themselves. So nothing here allocates,
 * frees or synchronises: the caller passes device pointers, the CUDA stream to queue the kernels
 * on (a cudaStream_t as void*; NULL is the default stream) and, for the backward, a workspace of
 * the size fgn_norm_backward_workspace_bytes reports. The calls can be captured in a CUDA graph.
 *
 * Shapes: x, residual, h, y, dy, dh, dx are (rows, cols), contiguous, row after row; weight, bias,
 * dweight, dbias have cols values; mean and rstd are fp32, rows values each. Types: x and
 * everything of its shape are FGN_F32, FGN_BF16 or FGN_F16 (all the same); weight, bias, dweight,
 * dbias are FGN_F32 or x's type (f32 inputs take f32 weights only). No 16-byte alignment is
 * needed (unaligned pointers take the kernels' scalar path).
 *
 * Every fgn_norm_* function returns FGN_OK or an error code, and never throws or aborts; after an
 * error, fgn_last_error() holds the message on the calling thread: what was wrong and, for
 * arguments, which one. Argument errors are found before any CUDA call (so they need no GPU),
 * except the device index's and a backward's too small workspace.
 *
 * Devices: the kernels' launch settings (shared memory opt-ins, occupancy) are kept once per
 * process, so one process runs them on one CUDA device: the first `device` a call names. A later
 * call naming another device is refused (one process per GPU, as torch.distributed runs), and so is
 * a first device of another model than device 0. */
#ifndef FUSEGRAD_NORM_H
#define FUSEGRAD_NORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FGN_API __attribute__((visibility("default")))
#else
#define FGN_API
#endif

/* Raised whenever a function's signature or meaning changes; callers compare it with
 * fgn_abi_version() before their first call. */
#define FGN_ABI_VERSION 1

/* Return codes. */
#define FGN_OK 0
#define FGN_ERROR_ARGUMENT 1 /* a bad argument: nothing was launched */
#define FGN_ERROR_CUDA 2     /* a CUDA call failed (no device, out of resources, a sticky error) */
#define FGN_ERROR_INTERNAL 3 /* anything else */

/* kind */
#define FGN_RMS_NORM 0
#define FGN_LAYER_NORM 1

/* dtypes (the values of fg::kernels::ScalarType) */
#define FGN_F32 0
#define FGN_BF16 2
#define FGN_F16 3

/* how dw / db are summed across rows (fg::kernels::NormReduction, docs/norms.md section 4.5) */
#define FGN_REDUCTION_AUTO 0
#define FGN_REDUCTION_LOCKED 1 /* (a) lock-guarded partial rows */
#define FGN_REDUCTION_GRID 2   /* (b) a persistent grid's partial rows; deterministic */

FGN_API int fgn_abi_version(void);

/* The message of the last failed call on this thread ("" when none failed yet). */
FGN_API const char* fgn_last_error(void);

/* Forward: y = norm(x) (or of h = x + residual, with h written to h_out), scaled by weight (1 +
 * weight when zero_centered) and shifted by bias. weight, bias, residual are optional (NULL);
 * h_out is required with a residual. mean (LayerNorm) and rstd receive the per-row statistics the
 * backward needs; pass NULL for both when no backward follows. */
FGN_API int fgn_norm_forward(int kind, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                             float eps, int zero_centered, const void* x, const void* residual,
                             void* h_out, const void* weight, const void* bias, void* y,
                             float* mean, float* rstd, int device, void* stream);

/* Backward, given x (h when the residual add was fused), dy and the forward's statistics: writes
 * dx (plus dh, the gradient reaching h from its other uses, when dh is not NULL), and overwrites
 * dweight and dbias (each optional; dweight needs the weight) with their sums over the rows.
 * `workspace` holds at least the bytes fgn_norm_backward_workspace_bytes reports for the same
 * arguments (the pointers' alignment counts: ask with the pointers the backward will get). */
FGN_API int fgn_norm_backward_workspace_bytes(int kind, int x_dtype, int w_dtype, int64_t rows,
                                              int64_t cols, int zero_centered, int reduction,
                                              const void* x, const void* dy, const void* dh,
                                              const void* weight, const float* mean,
                                              const float* rstd, void* dx, void* dweight,
                                              void* dbias, int device, size_t* bytes);
FGN_API int fgn_norm_backward(int kind, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                              int zero_centered, int reduction, const void* x, const void* dy,
                              const void* dh, const void* weight, const float* mean,
                              const float* rstd, void* dx, void* dweight, void* dbias,
                              void* workspace, size_t workspace_bytes, int device, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEGRAD_NORM_H */
