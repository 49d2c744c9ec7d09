// scalar_type_test.cpp — the dtype table against PyTorch's element sizes and names, unknown
// ordinals as error values, device and layout names.
#include "crucible/core/ScalarType.h"

#include <gtest/gtest.h>

namespace {
using namespace crucible;

TEST(ScalarType, CommonDtypesHavePyTorchSizesAndNames) {
  struct Row { std::int8_t ord; const char* name; std::uint32_t bytes; DtypeKind kind; };
  // Sizes as torch.tensor([], dtype=...).element_size() reports them.
  const Row rows[] = {
      {0, "uint8", 1, DtypeKind::UnsignedInt}, {1, "int8", 1, DtypeKind::SignedInt},
      {2, "int16", 2, DtypeKind::SignedInt},   {3, "int32", 4, DtypeKind::SignedInt},
      {4, "int64", 8, DtypeKind::SignedInt},   {5, "float16", 2, DtypeKind::Float},
      {6, "float32", 4, DtypeKind::Float},     {7, "float64", 8, DtypeKind::Float},
      {8, "complex32", 4, DtypeKind::Complex}, {9, "complex64", 8, DtypeKind::Complex},
      {10, "complex128", 16, DtypeKind::Complex}, {11, "bool", 1, DtypeKind::Bool},
      {15, "bfloat16", 2, DtypeKind::Float},   {23, "float8_e5m2", 1, DtypeKind::Opaque},
      {29, "uint64", 8, DtypeKind::UnsignedInt},
  };
  for (const Row& r : rows) {
    const auto& info = scalar_type_info(r.ord);
    EXPECT_EQ(info.name, r.name);
    EXPECT_EQ(info.kind, r.kind) << r.name;
    auto sz = element_size(r.ord);
    ASSERT_TRUE(sz.ok()) << sz.status();
    EXPECT_EQ(*sz, r.bytes) << r.name;
  }
}

TEST(ScalarType, EveryKnownOrdinalIsNamedAndSized) {
  for (int i = 0; i < kNumKnownScalarTypes; ++i) {
    const auto& info = scalar_type_info(static_cast<std::int8_t>(i));
    EXPECT_EQ(info.ordinal, i);
    EXPECT_FALSE(info.name.empty());
    EXPECT_NE(info.kind, DtypeKind::Unknown);
    EXPECT_TRUE(element_size(static_cast<std::int8_t>(i)).ok());
  }
}

TEST(ScalarType, UnknownOrdinalIsAnErrorValueNotACrash) {
  for (std::int8_t ord : {std::int8_t{-1}, std::int8_t{46}, std::int8_t{127}, std::int8_t{-128}}) {
    const auto& info = scalar_type_info(ord);
    EXPECT_EQ(info.kind, DtypeKind::Unknown);
    EXPECT_EQ(info.name, "unknown");
    auto sz = element_size(ord);
    ASSERT_FALSE(sz.ok());
    EXPECT_NE(sz.status().message().find("unknown to this build"), std::string_view::npos);
  }
}

TEST(ScalarType, NamesAndAliasesRoundTrip) {
  EXPECT_EQ(*scalar_type_from_name("float32"), dtype::kFloat32);
  EXPECT_EQ(*scalar_type_from_name("torch.float"), dtype::kFloat32);
  EXPECT_EQ(*scalar_type_from_name("long"), dtype::kInt64);
  EXPECT_EQ(*scalar_type_from_name("bfloat16"), dtype::kBFloat16);
  for (int i = 0; i < kNumKnownScalarTypes; ++i) {
    auto ord = scalar_type_from_name(scalar_type_info(static_cast<std::int8_t>(i)).name);
    ASSERT_TRUE(ord.ok());
    EXPECT_EQ(*ord, i);
  }
  auto bad = scalar_type_from_name("float33");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'float33' is not a PyTorch dtype name"),
            std::string_view::npos);
}

TEST(DeviceAndLayout, NamesCoverEveryValueAndUnknownIsNamed) {
  EXPECT_EQ(device_kind_name(DeviceKind::CPU), "cpu");
  EXPECT_EQ(device_kind_name(DeviceKind::CUDA), "cuda");
  EXPECT_EQ(device_kind_name(DeviceKind::Meta), "meta");
  EXPECT_EQ(device_kind_name(DeviceKind::PrivateUse1), "privateuseone");
  EXPECT_EQ(device_kind_name(static_cast<DeviceKind>(200)), "unknown");
  EXPECT_EQ(layout_from_ordinal(0), LayoutKind::Strided);
  EXPECT_EQ(layout_kind_name(layout_from_ordinal(2)), "sparse_csr");
  EXPECT_EQ(layout_from_ordinal(99), LayoutKind::Unknown);
  EXPECT_EQ(layout_from_ordinal(-3), LayoutKind::Unknown);
}
}  // namespace
