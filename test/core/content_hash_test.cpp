// content_hash_test.cpp — XXH3-128 known answers (from xxhsum 0.8.1 -H2/-H3) and the
// streaming API's stability properties.
#include "crucible/core/ContentHash.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include <xxhash.h>  // libxxhash.so: the reference for the compiled-in XXH3

namespace {
using namespace crucible;

TEST(ContentHash, KnownAnswersMatchXxhsum) {
  EXPECT_EQ(content_hash("").hex(), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(content_hash("abc").hex(), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(content_hash("Crucible").hex(), "9d0c8cfa986ae3b76be151a5c11b1fd2");
  EXPECT_EQ(hash64(""), 0x2d06800538d394c2ull);
  EXPECT_EQ(hash64("aten::add.Tensor"), 0xbbc934900e4cb971ull);
}

TEST(ContentHash, StreamingEqualsOneShotForAnySplit) {
  const std::string msg = "the quick brown fox jumps over the lazy dog, 0123456789 times";
  const ContentHash whole = content_hash(msg);
  for (std::size_t cut = 0; cut <= msg.size(); ++cut) {
    ContentHasher h;
    h.update_bytes(msg.data(), cut).update_bytes(msg.data() + cut, msg.size() - cut);
    EXPECT_EQ(h.digest(), whole) << "split at " << cut;
  }
}

// Long inputs cross the point where the hasher switches from its buffer to XXH3's streaming
// state: the digest must not depend on where that happens, on the seed path, or on a digest
// taken part-way.
TEST(ContentHash, LongInputsAnyChunkingAnySeed) {
  std::string msg(1500, '\0');
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<char>((i * 131 + 7) % 251);
  for (std::uint64_t seed : {0ull, 42ull}) {
    const ContentHash whole = content_hash(msg, seed);
    for (std::size_t piece : {1, 3, 8, 100, 255, 256, 257, 700, 1500}) {
      ContentHasher h(seed);
      ContentHash partial;
      for (std::size_t at = 0; at < msg.size(); at += piece) {
        h.update_bytes(msg.data() + at, std::min(piece, msg.size() - at));
        if (at == 0) partial = h.digest();
      }
      EXPECT_EQ(h.digest(), whole) << "pieces of " << piece << ", seed " << seed;
      EXPECT_EQ(h.digest(), whole) << "a second digest is the same";
      EXPECT_EQ(partial, content_hash(std::string_view(msg).substr(0, std::min(piece, msg.size())), seed));
    }
  }
}

// ContentHash compiles XXH3 in with the build's target flags (Note [Inlined XXH3]); the
// shared library's own build (baseline x86-64) is an independent implementation of the same
// algorithm. Every length to 2 KiB (XXH3's short, mid and long paths, stripe and block
// boundaries), a 1 MiB input, with and without a seed, and through the streaming hasher.
TEST(ContentHash, AgreesWithTheSharedLibraryOnLongInputs) {
  std::string msg(std::size_t{1} << 20, '\0');
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (char& c : msg) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  auto lib = [](std::string_view s, std::uint64_t seed) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(s.data(), s.size(), seed);
    return ContentHash{h.low64, h.high64};
  };
  for (std::uint64_t seed : {0ull, 7ull}) {
    for (std::size_t n = 0; n <= 2048; ++n) {
      const std::string_view s(msg.data(), n);
      ASSERT_EQ(content_hash(s, seed), lib(s, seed)) << n << " bytes, seed " << seed;
    }
    EXPECT_EQ(content_hash(msg, seed), lib(msg, seed)) << "1 MiB, seed " << seed;
    ContentHasher h(seed);
    for (std::size_t at = 0; at < msg.size(); at += 1000)
      h.update_bytes(msg.data() + at, std::min<std::size_t>(1000, msg.size() - at));
    EXPECT_EQ(h.digest(), lib(msg, seed)) << "streamed in pieces of 1000, seed " << seed;
  }
}

// WordBatch and update_u64s feed what update_u64 per word would: across the batch's 64-word
// runs, and after and before other updates to the same hasher.
TEST(ContentHash, WordBatchFeedsTheSameBytesAsWordByWord) {
  for (std::size_t n : {0, 1, 63, 64, 65, 200, 1000}) {
    ContentHasher a, b, c;
    a.update_u32(5);
    b.update_u32(5);
    c.update_u32(5);
    std::vector<std::uint64_t> words(n);
    for (std::size_t i = 0; i < n; ++i) words[i] = i * 0x9E3779B97F4A7C15ull + (i << 56);
    for (std::uint64_t w : words) a.update_u64(w);
    {
      WordBatch batch(b);
      for (std::uint64_t w : words) batch.add(w);
    }
    c.update_u64s(words);
    a.update_string("end");
    b.update_string("end");
    c.update_string("end");
    EXPECT_EQ(b.digest(), a.digest()) << n << " words";
    EXPECT_EQ(c.digest(), a.digest()) << n << " words";
  }
}

TEST(ContentHash, IntegersAreFedLittleEndian) {
  ContentHasher h;
  h.update_u64(0x0807060504030201ull);
  const unsigned char le[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(h.digest(), content_hash(std::string_view(reinterpret_cast<const char*>(le), 8)));
}

TEST(ContentHash, StringsAreLengthPrefixed) {
  ContentHasher a, b;
  a.update_string("ab").update_string("c");
  b.update_string("a").update_string("bc");
  EXPECT_NE(a.digest(), b.digest());
}

TEST(ContentHash, CombineIsOrderSensitiveAndDeterministic) {
  const ContentHash x = content_hash("x"), y = content_hash("y");
  EXPECT_NE(combine(x, y), combine(y, x));
  EXPECT_EQ(combine(x, y), combine(content_hash("x"), content_hash("y")));
  ContentHasher h;
  h.update_hash(x).update_hash(y);
  EXPECT_EQ(h.digest(), combine(x, y)) << "combine is the streaming hash of both halves";
}

TEST(ContentHash, SeedChangesHashAndSignedZeroDiffers) {
  EXPECT_NE(content_hash("abc", 1), content_hash("abc", 0));
  ContentHasher p, n;
  p.update_f64(0.0);
  n.update_f64(-0.0);
  EXPECT_NE(p.digest(), n.digest());
}

TEST(ContentHash, NoCollisionsOnSmallIntegers) {
  std::set<ContentHash> seen;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    ContentHasher h;
    h.update_u64(i);
    EXPECT_TRUE(seen.insert(h.digest()).second);
  }
}
}  // namespace
