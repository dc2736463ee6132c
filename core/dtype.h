// core/dtype.h: element types and devices. f32 is the working dtype everywhere; f64 lives on the
// CPU (gradient checks); bf16 and f16 are stored as 16-bit words and converted to float for any
// arithmetic; i32 holds token ids and targets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fg {

enum class DType : int { f32 = 0, f64 = 1, bf16 = 2, f16 = 3, i32 = 4 };
enum class Device : int { cpu = 0, cuda = 1 };

inline std::size_t dtype_size(DType t) {
    switch (t) {
        case DType::f64: return 8;
        case DType::bf16:
        case DType::f16: return 2;
        default: return 4;
    }
}

inline const char* dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::f64: return "f64";
        case DType::bf16: return "bf16";
        case DType::f16: return "f16";
        default: return "i32";
    }
}

inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

inline bool is_floating(DType t) { return t != DType::i32; }

// C++ type -> DType, for typed access (data<float>(), from_vector<double>() ...).
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::i32; };

}  // namespace fg
