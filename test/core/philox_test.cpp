// philox_test.cpp — Philox4x32-10 against Random123's published known-answer vectors
// (kat_vectors: philox4x32 10 rounds), plus counter/key sensitivity.
#include "crucible/core/Philox.h"

#include <gtest/gtest.h>

namespace {
using crucible::Philox4x32;
using C = Philox4x32::Counter;
using K = Philox4x32::Key;

TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(Philox4x32::generate<10>(C{0, 0, 0, 0}, K{0, 0}),
            (C{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32::generate<10>(C{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                     K{0xffffffffu, 0xffffffffu}),
            (C{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(Philox4x32::generate<10>(C{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                     K{0xa4093822u, 0x299f31d0u}),
            (C{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, UsableAtCompileTime) {
  constexpr C c = Philox4x32::generate<10>(C{0, 0, 0, 0}, K{0, 0});
  static_assert(c[0] == 0x6627e8d5u);
}

TEST(Philox, SeedSubsequenceOffsetLayout) {
  // generate(seed, subseq, offset) is the 4x32 function with the documented word layout.
  EXPECT_EQ(Philox4x32::generate(0x299f31d0a4093822ull, 0x0370734413198a2eull,
                                 0x85a308d3243f6a88ull),
            (C{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, EveryCounterBitChangesAboutHalfTheOutput) {
  const C base = Philox4x32::generate<10>(C{1, 2, 3, 4}, K{5, 6});
  for (int bit = 0; bit < 128; ++bit) {
    C ctr{1, 2, 3, 4};
    ctr[bit / 32] ^= 1u << (bit % 32);
    const C out = Philox4x32::generate<10>(ctr, K{5, 6});
    int flipped = 0;
    for (int w = 0; w < 4; ++w) flipped += __builtin_popcount(out[w] ^ base[w]);
    EXPECT_GT(flipped, 30) << "bit " << bit;
    EXPECT_LT(flipped, 98) << "bit " << bit;
  }
}

TEST(Philox, UnitFloatIsInHalfOpenInterval) {
  EXPECT_EQ(Philox4x32::to_unit_float(0), 0.0f);
  EXPECT_LT(Philox4x32::to_unit_float(0xffffffffu), 1.0f);
  double sum = 0;
  for (std::uint32_t i = 0; i < 25000; ++i) {
    for (std::uint32_t w : Philox4x32::generate(42, 0, i)) sum += Philox4x32::to_unit_float(w);
  }
  EXPECT_NEAR(sum / 100000.0, 0.5, 0.005);
}
}  // namespace
