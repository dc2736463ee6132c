// kernels/philox.h: the Philox4x32-10 counter-based generator (Salmon et al., SC'11), usable from
// host C++ and from CUDA device code. A (seed, counter) pair maps to four 32-bit words with no
// state in between, so element i of a random tensor is a pure function of (seed, offset + i) and
// the CPU and the GPU produce the same numbers. Also the three distributions fusegrad draws:
// uniform [0, 1), standard normal (Box-Muller, computed in double so both sides round alike), and
// the keep/drop decisions of dropout (four per call).
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define FG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FG_HOST_DEVICE inline
#endif

namespace fg::philox {

struct Words {
    std::uint32_t w[4];
};

FG_HOST_DEVICE void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                              std::uint32_t& lo) {
    std::uint64_t product = static_cast<std::uint64_t>(a) * b;
    hi = static_cast<std::uint32_t>(product >> 32);
    lo = static_cast<std::uint32_t>(product);
}

// Ten rounds of the Philox4x32 bijection on counter (c0..c3) under key (k0, k1).
FG_HOST_DEVICE Words philox4x32_10(std::uint64_t seed, std::uint64_t counter) {
    const std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
    const std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
    std::uint32_t c0 = static_cast<std::uint32_t>(counter);
    std::uint32_t c1 = static_cast<std::uint32_t>(counter >> 32);
    std::uint32_t c2 = 0, c3 = 0;
    std::uint32_t k0 = static_cast<std::uint32_t>(seed);
    std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        std::uint32_t hi0, lo0, hi1, lo1;
        mul_hi_lo(kMul0, c0, hi0, lo0);
        mul_hi_lo(kMul1, c2, hi1, lo1);
        std::uint32_t n0 = hi1 ^ c1 ^ k0;
        std::uint32_t n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += kWeyl0;
        k1 += kWeyl1;
    }
    return Words{{c0, c1, c2, c3}};
}

// 24 random bits scaled by 2^-24: exactly representable in float, so identical everywhere.
FG_HOST_DEVICE float uniform(std::uint64_t seed, std::uint64_t counter) {
    Words r = philox4x32_10(seed, counter);
    return static_cast<float>(r.w[0] >> 8) * (1.0f / 16777216.0f);
}

// Box-Muller on two 24-bit uniforms, u1 in (0, 1] so the log is finite. Computed in double and
// rounded once to float: host libm and CUDA's double functions agree to far below a float ulp.
FG_HOST_DEVICE float normal(std::uint64_t seed, std::uint64_t counter) {
    Words r = philox4x32_10(seed, counter);
    double u1 = (static_cast<double>(r.w[0] >> 8) + 1.0) * (1.0 / 16777216.0);
    double u2 = static_cast<double>(r.w[1] >> 8) * (1.0 / 16777216.0);
    const double kTwoPi = 6.283185307179586476925286766559;
    return static_cast<float>(sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2));
}

// mean + stddev * z as one fused multiply-add on both sides: nvcc would contract it to an FMA on
// the device and the host would not, and the last bit would differ.
FG_HOST_DEVICE float normal(std::uint64_t seed, std::uint64_t counter, float mean, float stddev) {
    return fmaf(stddev, normal(seed, counter), mean);
}

// Dropout's decisions: element counter c is kept with probability 1 - p. They come four to a
// Philox call: c uses word c % 4 of the block for counter c / 4, so a kernel that handles four
// consecutive counters starting at a multiple of 4 makes one call instead of four.
FG_HOST_DEVICE bool keep_word(std::uint32_t word, float p) {
    return static_cast<float>(word >> 8) * (1.0f / 16777216.0f) >= p;
}
FG_HOST_DEVICE bool keep(std::uint64_t seed, std::uint64_t counter, float p) {
    return keep_word(philox4x32_10(seed, counter >> 2).w[counter & 3], p);
}
// The decisions for counters first .. first + 3: one Philox call when first is a multiple of 4.
FG_HOST_DEVICE void keep4(std::uint64_t seed, std::uint64_t first, float p, bool (&kept)[4]) {
    if ((first & 3) == 0) {
        Words r = philox4x32_10(seed, first >> 2);
        for (int e = 0; e < 4; ++e) kept[e] = keep_word(r.w[e], p);
    } else {
        for (int e = 0; e < 4; ++e) kept[e] = keep(seed, first + e, p);
    }
}

}  // namespace fg::philox
