// Philox.h — Philox4x32-10 counter-based random numbers (Salmon et al., SC'11; Random123).
//
// A pure function of (counter, key): the same 128-bit counter and 64-bit key give the same
// four 32-bit words on every machine, in any order of calls, from any thread — which is what
// lets a replay reproduce an eager run's random draws. Output matches Random123's
// philox4x32_10 known-answer vectors (test/core/philox_test.cpp). PyTorch's CUDA generator
// uses the same function; its CPU generator is mt19937, which the Vessel handles separately.
//
// Cost: 10 rounds of 2 32x32->64 multiplies, ~5 ns per call for 4 words on x86-64.
#pragma once

#include <array>
#include <cstdint>

namespace crucible {

struct Philox4x32 {
  using Counter = std::array<std::uint32_t, 4>;
  using Key = std::array<std::uint32_t, 2>;

  static constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

  // Philox4x32 with R rounds (R = 10 is the standard, crush-resistant choice).
  template <int R = 10>
  static constexpr Counter generate(Counter ctr, Key key) noexcept {
    for (int r = 0; r < R; ++r) {
      if (r != 0) {
        key[0] += kWeyl0;
        key[1] += kWeyl1;
      }
      const std::uint64_t p0 = std::uint64_t{kMul0} * ctr[0];
      const std::uint64_t p1 = std::uint64_t{kMul1} * ctr[2];
      const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
      const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
      ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    }
    return ctr;
  }

  // Convenience: counter from (offset, subsequence), key from a 64-bit seed, the way
  // curand/PyTorch lay them out.
  static constexpr Counter generate(std::uint64_t seed, std::uint64_t subsequence,
                                    std::uint64_t offset) noexcept {
    return generate<10>(
        Counter{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32),
                static_cast<std::uint32_t>(subsequence),
                static_cast<std::uint32_t>(subsequence >> 32)},
        Key{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  }

  // Uniform float in [0, 1) from one word, 24 random mantissa bits (no value equals 1.0).
  static constexpr float to_unit_float(std::uint32_t w) noexcept {
    return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
  }
};

}  // namespace crucible
