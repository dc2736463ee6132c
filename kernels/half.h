// kernels/half.h: bf16 and f16 <-> float conversions, round-to-nearest-even, written with integer
// bit operations (and exact float scaling for f16's subnormals) so the host and the device compute
// exactly the same values. Storage of both is a plain uint16_t; fusegrad does arithmetic in float
// and converts at loads and stores.
#pragma once

#include <cstdint>
#include <cstring>

#include "philox.h"  // FG_HOST_DEVICE

namespace fg::half {

FG_HOST_DEVICE std::uint32_t float_bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
}
FG_HOST_DEVICE float bits_float(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

// bf16 is the top half of a float: round the low 16 bits to nearest, ties to even.
FG_HOST_DEVICE std::uint16_t float_to_bf16(float f) {
    std::uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
}
FG_HOST_DEVICE float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

// f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
FG_HOST_DEVICE float f16_to_float(std::uint16_t h) {
    std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
    if (exponent == 0) {
        if (mantissa == 0) return bits_float(sign);  // signed zero
        // Subnormal: value = mantissa * 2^-24, exact in float.
        float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
        return bits_float(sign | float_bits(magnitude));
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

FG_HOST_DEVICE std::uint16_t float_to_f16(float f) {
    std::uint32_t u = float_bits(f);
    std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    std::uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude >= 0x7f800000u)  // inf stays inf, NaN becomes a quiet NaN
        return sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
    if (magnitude < 0x38800000u) {
        // Below the smallest normal f16 (2^-14): count units of 2^-24, rounding to nearest even.
        float units = bits_float(magnitude) * 16777216.0f;  // exact: a power-of-two scale
        std::uint32_t whole = static_cast<std::uint32_t>(units);
        float rest = units - static_cast<float>(whole);
        if (rest > 0.5f || (rest == 0.5f && (whole & 1u))) ++whole;
        return sign | static_cast<std::uint16_t>(whole);
    }
    // Normal: re-bias the exponent and round the 13 dropped mantissa bits to nearest even.
    std::uint32_t odd = (magnitude >> 13) & 1u;
    magnitude += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding increment
    return sign | static_cast<std::uint16_t>(magnitude >> 13);
}

}  // namespace fg::half
