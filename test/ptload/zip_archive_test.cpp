// zip_archive_test.cpp — the ZIP reader and StateDict::from_bytes on archives built in memory.
#include <gtest/gtest.h>

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

}  // namespace
