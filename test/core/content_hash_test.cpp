// content_hash_test.cpp — XXH3-128 known answers (from xxhsum 0.8.1 -H2/-H3) and the
// streaming API's stability properties.
#include "crucible/core/ContentHash.h"

#include <gtest/gtest.h>

#include <set>

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
