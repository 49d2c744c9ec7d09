// zip_archive_test.cpp — the ZIP reader and StateDict::from_bytes on archives built in memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "crucible/ptload/StateDict.h"
#include "crucible/ptload/ZipArchive.h"
#include "peak_rss.h"
#include "zip_writer.h"

namespace {
using namespace crucible::ptload;
using test::make_zip;
using test::peak_rss;
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

// torch.save under torch.serialization.set_crc32_options(False) writes 0 in every CRC-32 field.
TEST(ZeroCrc, AnArchiveWithoutChecksumsIsRefusedSayingWhyAndLoadsWhenAllowed) {
  const std::string pkl = "\x80\x02}(" + test::uni("w") + test::tensor_f32("0", 4, 1, 3) + "u.";
  const std::string data(reinterpret_cast<const char*>(std::vector<float>{1, 2, 3, 4}.data()), 16);
  auto archive = [&](bool zero_pickle_crc) {
    return make_zip({{"a/data.pkl", pkl, false, 0, zero_pickle_crc},
                     {"a/data/0", data, false, 0, true},
                     {"a/version", "3\n", false, 0, true}});
  };
  const std::string none = archive(true);
  const std::string msg = refusal(none);
  EXPECT_NE(msg.find("pt zip: entry 'a/"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot be verified: every CRC-32 field of this archive is 0, as torch.save "
                     "writes under torch.serialization.set_crc32_options(False)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("at byte offset "), std::string::npos) << msg;
  EXPECT_NE(msg.find("re-save it with torch.serialization.set_crc32_options(True), or, if you "
                     "trust this copy, load it unverified with LoadOptions::allow_zero_crc "
                     "(crucible pt: --allow-zero-crc)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("fails its checksum"), std::string::npos) << "not reported as damage";

  LoadOptions allow;
  allow.allow_zero_crc = true;
  auto sd = StateDict::from_bytes(bytes_of(none), nullptr, allow);
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_TRUE(sd->crc_unverified());
  EXPECT_EQ(sd->tensors()[0].tensor.materialize_f32(), (std::vector<float>{2, 3, 4}));

  // One real checksum among the zeros: the zeros are mismatches, allowed or not.
  const std::string mixed = archive(false);
  for (const LoadOptions& o : {LoadOptions{}, allow}) {
    const std::string m = refusal(mixed, o);
    EXPECT_NE(m.find("fails its checksum: CRC-32 0x"), std::string::npos) << m;
    EXPECT_NE(m.find("directory says 0x00000000"), std::string::npos) << m;
  }
  // A file with checksums is verified whatever the option says.
  auto checked = StateDict::from_bytes(bytes_of(make_zip({{"a/data.pkl", pkl},
                                                          {"a/data/0", data},
                                                          {"a/version", "3\n"}})),
                                       nullptr, allow);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_FALSE(checked->crc_unverified());
}

// One tensor listed 10,000 times (a tuple of BINGETs, 2 bytes each): the list of names and views
// costs far more than the pickle's objects, and is charged to what the tree left of the budget.
TEST(StateDictMemory, TheTensorListIsChargedToTheBudget) {
  std::string pkl = "\x80\x02(" + test::tensor_f32("0", 4, 0, 4) + std::string("q\x00", 2);
  for (int i = 1; i < 10000; ++i) pkl += std::string("h\x00", 2);
  pkl += "t.";
  const std::string z = test::make_pt(pkl, {{1, 2, 3, 4}});
  auto sd = StateDict::from_bytes(bytes_of(z), nullptr);
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_EQ(sd->tensors().size(), 10000u);
  EXPECT_EQ(sd->tensors()[9999].name, "9999");
  LoadOptions tight;
  tight.max_pickle_memory = 1u << 20;
  const std::string msg = refusal(z, tight);
  EXPECT_NE(msg.find("pt: listing the tensors would take unpickling memory over the limit of "
                     "1048576 bytes ("),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" tensors listed so far"), std::string::npos) << msg;
  EXPECT_NE(msg.find("raise LoadOptions::max_pickle_memory (crucible pt: --max-pickle-memory N)"),
            std::string::npos)
      << msg;
}

}  // namespace
