// zip_archive_test.cpp — the ZIP reader and StateDict::from_bytes on archives built in memory.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>

#include "crucible/ptload/StateDict.h"
#include "crucible/ptload/ZipArchive.h"
#include "zip_writer.h"

namespace {
using namespace crucible::ptload;
using test::make_zip;
using test::ZipItem;

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(ZipArchive, StoredAndDeflatedEntriesWithAComment) {
  const std::string big(100000, 'z');
  const std::string z = make_zip({{"a/x", "hello"}, {"a/y", big, true}}, "a trailing comment");
  auto a = ZipArchive::parse(bytes_of(z));
  ASSERT_TRUE(a.ok()) << a.status();
  const ZipEntry* x = a->find("a/x");
  const ZipEntry* y = a->find("a/y");
  ASSERT_TRUE(x && y);
  EXPECT_EQ(std::memcmp(a->stored_view(*x).data(), "hello", 5), 0);
  EXPECT_TRUE(a->check_crc(*x, a->stored_view(*x)).ok());
  EXPECT_LT(y->compressed_size, 1000u) << "100 KB of one byte deflates to a few hundred bytes";
  auto out = a->extract(*y);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out->data()), out->size()), big);
  EXPECT_EQ(a->find("a/z"), nullptr);
}

TEST(ZipArchive, RefusesWhatIsNotAWellFormedArchive) {
  auto err = [](const std::string& s) {
    auto a = ZipArchive::parse(bytes_of(s));
    return a.ok() ? std::string("accepted") : std::string(a.status().message());
  };
  EXPECT_NE(err("").find("too short"), std::string::npos);
  std::string z = make_zip({{"a/x", "hello"}}, "c");
  EXPECT_NE(err(z + "x").find("no zip end-of-central-directory"), std::string::npos)
      << "the comment length must reach the end of the file exactly";
  // The end record's sentinels say ZIP64, but there is no locator.
  std::string z64 = make_zip({{"a/x", "hello"}});
  std::memset(z64.data() + z64.size() - 22 + 8, 0xFF, 4);
  EXPECT_NE(err(z64).find("no ZIP64 locator"), std::string::npos);
  // A corrupted stored byte fails the checksum, with the data offset in the message.
  std::string c = make_zip({{"a/x", "hello"}});
  c[30 + 3] = 'j';
  auto a = ZipArchive::parse(bytes_of(c));
  ASSERT_TRUE(a.ok());
  const crucible::Status s = a->check_crc(a->entries()[0], a->stored_view(a->entries()[0]));
  EXPECT_NE(s.message().find("fails its checksum"), std::string::npos);
  EXPECT_NE(s.message().find("offset 33"), std::string::npos) << s.message();
}

TEST(StateDictFromBytes, LoadsAHandMadeArchiveAndOutlivesIt) {
  const std::string pkl = "\x80\x02}(" + test::uni("w") + test::tensor_f32("0", 4, 1, 3) + "u.";
  auto bytes = std::make_shared<std::string>(test::make_pt(pkl, {{1, 2, 3, 4}}));
  TensorView kept = [&] {
    auto sd = StateDict::from_bytes(bytes_of(*bytes), bytes);
    EXPECT_TRUE(sd.ok()) << sd.status();
    EXPECT_EQ(sd->tensors().size(), 1u);
    EXPECT_EQ(sd->tensors()[0].name, "w");
    return sd->tensors()[0].tensor;
  }();
  bytes.reset();  // the view's storage owner still holds the archive
  EXPECT_EQ(kept.materialize_f32(), (std::vector<float>{2, 3, 4}));
}

TEST(StateDictFromBytes, NotAZipAndLegacyAreRefusedDistinctly) {
  auto legacy = StateDict::from_bytes(bytes_of(std::string("\x80\x02\x8a\x0a", 4)), nullptr);
  ASSERT_FALSE(legacy.ok());
  EXPECT_NE(legacy.status().message().find("legacy"), std::string::npos);
  EXPECT_NE(legacy.status().message().find("re-save it with torch.save"), std::string::npos);
  auto junk = StateDict::from_bytes(bytes_of("hello world"), nullptr);
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("not a torch.save zip archive"), std::string::npos);
}

// Peak resident memory of this process so far, in bytes (ctest runs each test in its own one).
std::uint64_t peak_rss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

std::string refusal(const std::string& archive, const LoadOptions& options = {}) {
  auto sd = StateDict::from_bytes(bytes_of(archive), nullptr, options);
  return sd.ok() ? std::string("accepted") : std::string(sd.status().message());
}

// About 1 MB that inflates to a 1 GiB data.pkl of zeros (made without holding 1 GiB).
const std::string& pickle_bomb() {
  static const std::string z =
      make_zip({{"a/data.pkl", "", false, std::uint64_t{1} << 30}, {"a/version", "3\n"}});
  return z;
}

TEST(InflationLimits, APickleBombIsRefusedBeforeItIsInflated) {
  const std::string& z = pickle_bomb();
  ASSERT_LT(z.size(), 1100000u);
  const std::uint64_t before = peak_rss();
  const std::string msg = refusal(z);
  EXPECT_NE(msg.find("pt zip: entry 'a/data.pkl' is 1073741824 bytes uncompressed, over the "
                     "limit of 67108864 bytes (from "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("at byte offset "), std::string::npos) << msg;
  EXPECT_NE(msg.find("decompression bomb; if you trust the file, raise "
                     "LoadOptions::max_pickle_bytes (crucible pt: --max-pickle-bytes N)"),
            std::string::npos)
      << msg;
  EXPECT_LT(peak_rss() - before, std::uint64_t{16} << 20) << "refused without inflating 1 GiB";

  // Past the size limit, the ratio limit still holds: about 1030:1 against 100:1.
  LoadOptions big_pickles;
  big_pickles.max_pickle_bytes = std::uint64_t{4} << 30;
  const std::string ratio = refusal(z, big_pickles);
  EXPECT_NE(ratio.find("pt zip: entry 'a/data.pkl' inflates "), std::string::npos) << ratio;
  EXPECT_NE(ratio.find(" bytes to 1073741824 ("), std::string::npos) << ratio;
  EXPECT_NE(ratio.find(":1), over the limit of 100:1 on the compression ratio"),
            std::string::npos)
      << ratio;
  EXPECT_NE(
      ratio.find("raise LoadOptions::max_inflate_ratio (crucible pt: --max-inflate-ratio N)"),
      std::string::npos)
      << ratio;
  EXPECT_LT(peak_rss() - before, std::uint64_t{16} << 20);
}

TEST(InflationLimits, AZeroFilledStorageIsHeldToTheRatioAndLoadsWhenItIsRaised) {
  // 2 MiB of float32 zeros deflates about 1000:1: over the default ratio, and over 1 MiB.
  constexpr int kNumel = 1 << 19;
  auto i4 = [](std::uint32_t v) {
    std::string o = "J";
    test::put32(o, v);
    return o;
  };
  const std::string pkl = "\x80\x02}(" + test::uni("w") +
                          test::global("torch._utils", "_rebuild_tensor_v2") + "((" +
                          test::uni("storage") + test::global("torch", "FloatStorage") +
                          test::uni("0") + test::uni("cpu") + i4(kNumel) + "tQ" + i4(0) +
                          i4(kNumel) + "\x85" + i4(1) + "\x85\x89" +
                          test::global("collections", "OrderedDict") + ")RtRu.";
  const std::string z = make_zip({{"a/data.pkl", pkl},
                                  {"a/data/0", "", false, std::uint64_t{kNumel} * 4},
                                  {"a/version", "3\n"}});
  const std::string msg = refusal(z);
  EXPECT_NE(msg.find("entry 'a/data/0' inflates "), std::string::npos) << msg;
  EXPECT_NE(msg.find("over the limit of 100:1"), std::string::npos) << msg;
  LoadOptions trusted;
  trusted.max_inflate_ratio = 5000;
  auto sd = StateDict::from_bytes(bytes_of(z), nullptr, trusted);
  ASSERT_TRUE(sd.ok()) << sd.status();
  ASSERT_EQ(sd->tensors().size(), 1u);
  EXPECT_EQ(sd->tensors()[0].tensor.numel(), kNumel);
  const auto values = sd->tensors()[0].tensor.materialize_f32();
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
}

TEST(InflationLimits, ARecordThatDeclaresMoreThanItHoldsCostsOnlyWhatItHolds) {
  // 64 KiB of incompressible bytes, deflated (about 64 KiB), declared as 60 MiB: under the
  // pickle limit and deflate's 1032:1, over the ratio limit unless raised. The buffer is
  // reserved, not filled, so memory stays low.
  std::string noise(1u << 16, '\0');
  std::uint32_t x = 2463534242u;
  for (char& c : noise) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    c = static_cast<char>(x);
  }
  std::string z = make_zip({{"a/data.pkl", noise, true}});
  constexpr std::uint32_t kDeclared = 60u << 20;
  const std::size_t cd = z.size() - 22 - (46 + 10);
  for (std::size_t at : {std::size_t{22}, cd + 24})
    for (int i = 0; i < 4; ++i) z[at + i] = static_cast<char>((kDeclared >> (8 * i)) & 0xFF);
  EXPECT_NE(refusal(z).find("(959:1), over the limit of 100:1"), std::string::npos);
  LoadOptions trusted;
  trusted.max_inflate_ratio = 1000;
  const std::uint64_t before = peak_rss();
  const std::string msg = refusal(z, trusted);
  EXPECT_NE(msg.find("inflates to 65536 bytes, directory says 62914560"), std::string::npos)
      << msg;
  EXPECT_LT(peak_rss() - before, std::uint64_t{16} << 20);
}

}  // namespace
