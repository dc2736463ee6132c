// kernels/float_types.cuh: the floating storage types an arithmetic kernel is built for (float,
// __nv_bfloat16, __half), their conversions to and from float, and the host-side switch that
// picks the instantiation for a run-time ScalarType. Included from .cu files only.
//
// Every kernel built on these loads its inputs to float, computes in float and rounds once when
// it stores: a bf16 kernel differs from the f32 one only in its loads and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "elementwise.h"  // ScalarType

namespace fg::kernels {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}

// Calls f(T{}) with T the storage type of `type` (float, __nv_bfloat16 or __half); `what` names
// the launcher in the error for any other type (the ops check dtypes first, so that is a bug).
template <typename F>
void with_float_type(ScalarType type, const char* what, F&& f) {
    switch (type) {
        case ScalarType::f32: f(float{}); return;
        case ScalarType::bf16: f(__nv_bfloat16{}); return;
        case ScalarType::f16: f(__half{}); return;
        default:
            throw std::invalid_argument(std::string("internal error: ") + what +
                                        " takes f32, bf16 or f16 storage only");
    }
}

}  // namespace fg::kernels
