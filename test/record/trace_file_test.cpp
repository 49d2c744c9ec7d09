// trace_file_test.cpp — .crtrace round trip, and the reader's refusals of bad bytes.
#include "crucible/record/TraceFile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "test_util.h"

namespace {
using namespace crucible::record;

Trace sample_trace() {
  auto r = *Recorder::create();
  OpBuilder b;
  const auto mm = r->intern_schema("aten::mm");
  const auto relu = r->intern_schema("aten::relu");
  (void)r->intern_module("encoder.layer0").value();
  for (std::uint64_t i = 0; i < 50; ++i)
    test_util::commit_synthetic(*r, b, i % 2 ? mm : relu, i, static_cast<Phase>(i % 3));
  b.reset();  // a 0-d tensor, a 9-d tensor (dims spill into 3 cells), a list and a string
  TensorMeta m;
  m.dtype = 15;
  b.add_tensor(m, {}, {});
  const std::int64_t sz[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, st[9] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  b.add_tensor(m, sz, st);
  b.end_inputs();
  b.add_scalar(ScalarKind::ListBegin, 2, 0, 2);
  b.add_int(2, 4);
  b.add_int(2, 5);
  b.add_string(3, "mean");
  b.add_scalar(ScalarKind::None, 4, 0);
  r->commit(r->thread_log(), b.entry(mm, Phase::Forward, op_flag::kMutable), b.cells(), b.scalars());
  r->classify_external(1, ExternalKind::Parameter);
  r->classify_external(2, ExternalKind::Input);
  return r->snapshot();
}

TEST(TraceFile, RoundTripIsLossless) {
  const Trace t = sample_trace();
  auto back = decode_trace(encode_trace(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == t);
  ASSERT_EQ(back->num_ops(), 51u);
  const auto big = back->op_tensor_begin[50] + 1;
  EXPECT_EQ(back->sizes(big)[8], 9);
  EXPECT_EQ(back->strides(big)[0], 9);
  EXPECT_EQ(back->scalars_of(50)[0].aux, 2u);
  EXPECT_EQ(back->module_paths.at(1), "encoder.layer0");
  EXPECT_EQ(back->externals.at(2), ExternalKind::Input);
}

TEST(TraceFile, SaveAndLoadThroughAFile) {
  const Trace t = sample_trace();
  const std::string path = ::testing::TempDir() + "/roundtrip.crtrace";
  ASSERT_TRUE(save_trace(t, path).ok());
  auto back = load_trace(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == t);
  std::remove(path.c_str());
}

TEST(TraceFile, MissingFileSaysSo) {
  auto r = load_trace("/nonexistent/dir/x.crtrace");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot open /nonexistent/dir/x.crtrace"), absl::string_view::npos);
}

TEST(TraceFile, EveryTruncationIsAClearError) {
  const auto bytes = encode_trace(sample_trace());
  for (std::size_t n = 0; n < bytes.size(); n += (n < 200 ? 1 : 37)) {
    auto r = decode_trace(std::span<const std::byte>(bytes.data(), n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_NE(r.status().message().find("crtrace:"), absl::string_view::npos);
  }
}

TEST(TraceFile, BadMagicAndNewerVersionAreNamed) {
  auto bytes = encode_trace(sample_trace());
  auto v = bytes;
  v[8] = std::byte{2};
  auto r = decode_trace(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("format version 2"), absl::string_view::npos);
  bytes[0] = std::byte{'X'};
  r = decode_trace(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a .crtrace file"), absl::string_view::npos);
}

TEST(TraceFile, InconsistentCountsAreCaught) {
  Trace t = sample_trace();
  t.ops[3].n_meta_cells += 1;  // disagrees with its tensors
  auto r = decode_trace(encode_trace(t));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("meta cell count"), absl::string_view::npos);
  Trace u = sample_trace();
  u.ops[0].module_id = 77;
  r = decode_trace(encode_trace(u));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("module id"), absl::string_view::npos);
}

// Module paths past the reader's bounds (kMaxModulePathBytes, kMaxModuleLevels) are refused
// with the bound named; paths at the bounds load.
TEST(TraceFile, ModulePathsPastTheBoundsAreRefused) {
  auto with_path = [](std::string path) {
    Trace t = sample_trace();
    t.module_paths.push_back(std::move(path));
    return decode_trace(encode_trace(t));
  };
  std::string deep = "m";
  for (std::size_t i = 1; i < kMaxModuleLevels; ++i) deep += ".x";
  EXPECT_TRUE(with_path(deep).ok()) << "256 levels load";
  auto r = with_path(deep + ".x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("257 levels deep"), absl::string_view::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("256 levels"), absl::string_view::npos);
  EXPECT_TRUE(with_path(std::string(kMaxModulePathBytes, 'a')).ok());
  r = with_path(std::string(kMaxModulePathBytes + 1, 'a'));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("65537 bytes"), absl::string_view::npos)
      << r.status().message();
  // Saving refuses what loading would, before writing anything.
  Trace t = sample_trace();
  t.module_paths.push_back(deep + ".x");
  const std::string path = ::testing::TempDir() + "/deep.crtrace";
  const crucible::Status st = save_trace(t, path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not written to"), absl::string_view::npos) << st.message();
  EXPECT_FALSE(load_trace(path).ok()) << "no file was written";
}

TEST(TraceFile, RandomByteFlipsNeverCrash) {
  const auto good = encode_trace(sample_trace());
  std::mt19937_64 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= std::byte(1u << (rng() % 8));
    auto r = decode_trace(bytes);  // ASan/UBSan builds turn any out-of-bounds read into a failure
    if (!r.ok()) ++rejected;
    else {  // accepted: it must be internally consistent enough to walk every op
      for (std::size_t op = 0; op < r->num_ops(); ++op) {
        for (const auto& m : r->inputs(op)) (void)r->sizes(r->tensor_index(&m));
        (void)r->scalars_of(op);
      }
    }
  }
  EXPECT_GT(rejected, 0);
}
}  // namespace
