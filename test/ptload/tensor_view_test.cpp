// tensor_view_test.cpp — extent checks and float32 conversion of TensorView, on built storages.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "crucible/core/ScalarType.h"
#include "crucible/ptload/TensorView.h"

namespace {
using namespace crucible::ptload;
namespace dt = crucible::dtype;

template <class T>
std::shared_ptr<const TensorStorage> storage_of(std::int8_t dtype, std::vector<T> values) {
  auto held = std::make_shared<std::vector<T>>(std::move(values));
  auto s = std::make_shared<TensorStorage>();
  s->key = "0";
  s->dtype = dtype;
  s->numel = held->size();
  s->bytes = std::as_bytes(std::span<const T>(*held));
  s->owner = held;
  return s;
}

TEST(TensorView, HalfConvertsExactlyIncludingSubnormals) {
  const std::vector<std::uint16_t> h = {0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF,
                                        0x7C00, 0xFC00, 0x8000, 0xC000};
  auto v = TensorView::make(storage_of(dt::kFloat16, h), 0, {9}, {1}, false);
  ASSERT_TRUE(v.ok()) << v.status();
  const auto f = v->materialize_f32();
  EXPECT_EQ(f[0], std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f[1], std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f[2], std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(f[3], 1.0f);
  EXPECT_EQ(f[4], 65504.0f);
  EXPECT_EQ(f[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[6], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(f[7]) && f[7] == 0.0f);
  EXPECT_EQ(f[8], -2.0f);
}

TEST(TensorView, StridedOffsetViewMaterializesRowMajor) {
  std::vector<std::int32_t> vals(24);
  for (int i = 0; i < 24; ++i) vals[i] = i;
  // base is 2x3x4 contiguous; the view [:, 1:, ::2] has offset 4, strides (12, 4, 2).
  auto v = TensorView::make(storage_of(dt::kInt32, vals), 4, {2, 2, 2}, {12, 4, 2}, false);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->is_contiguous());
  EXPECT_EQ(v->materialize_f32(), (std::vector<float>{4, 6, 8, 10, 16, 18, 20, 22}));
  // A size-1 dim may carry any stride (torch does not normalise it): no overflow, no effect.
  auto one = TensorView::make(storage_of(dt::kInt32, vals), 0, {1, 3}, {INT64_MAX, 1}, false);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->is_contiguous());
  EXPECT_EQ(one->materialize_f32(), (std::vector<float>{0, 1, 2}));
}

TEST(TensorView, ExpandedViewsAreBoundedByTheirStorage) {
  // A stride of 0 reads one element many times: torch.zeros(1).expand(...) saved as is.
  auto small = TensorView::make(storage_of(dt::kFloat32, std::vector<float>{2.5f}), 0, {3, 4},
                                {0, 0}, false);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->materialize_f32(), std::vector<float>(12, 2.5f));
  // Up to max(storage elements, kMaxExpandedNumel) elements; beyond, refused before anything
  // is allocated, saying what to do.
  auto at_cap = TensorView::make(storage_of(dt::kFloat32, std::vector<float>{1.0f}), 0,
                                 {TensorView::kMaxExpandedNumel}, {0}, false);
  ASSERT_TRUE(at_cap.ok()) << at_cap.status();
  for (const std::vector<std::int64_t>& sizes : std::vector<std::vector<std::int64_t>>{
           {TensorView::kMaxExpandedNumel + 1},
           {std::int64_t{1} << 27},
           {(std::int64_t{1} << 31) - 1, (std::int64_t{1} << 31) - 1}}) {
    auto big = TensorView::make(storage_of(dt::kFloat32, std::vector<float>{1.0f}), 0, sizes,
                                std::vector<std::int64_t>(sizes.size(), 0), false);
    ASSERT_FALSE(big.ok());
    EXPECT_NE(std::string(big.status().message()).find("expanded or overlapping view"),
              std::string::npos)
        << big.status();
    EXPECT_NE(std::string(big.status().message()).find(".contiguous()"), std::string::npos);
  }
  // A view of no more elements than its storage holds is not capped, whatever its strides.
  std::vector<float> vals(64, 1.0f);
  auto same = TensorView::make(storage_of(dt::kFloat32, vals), 0, {8, 8}, {0, 1}, false);
  EXPECT_TRUE(same.ok()) << same.status();
}

TEST(TensorView, RefusesViewsOutsideTheStorage) {
  auto s = storage_of(dt::kFloat32, std::vector<float>(10));
  auto err = [&](std::int64_t off, std::vector<std::int64_t> sz, std::vector<std::int64_t> st) {
    auto v = TensorView::make(s, off, std::move(sz), std::move(st), false);
    return v.ok() ? std::string("accepted") : std::string(v.status().message());
  };
  EXPECT_NE(err(0, {11}, {1}).find("reaches element 10 but the storage has 10"), std::string::npos);
  EXPECT_NE(err(9, {2}, {1}).find("reaches element 10"), std::string::npos);
  EXPECT_NE(err(-1, {1}, {1}).find("negative storage offset"), std::string::npos);
  EXPECT_NE(err(0, {2}, {-1}).find("negative stride"), std::string::npos);
  EXPECT_NE(err(0, {-2}, {1}).find("negative size"), std::string::npos);
  EXPECT_NE(err(0, {3, 3}, {INT64_MAX / 2, INT64_MAX / 2}).find("overflows 64 bits"),
            std::string::npos);
  EXPECT_NE(err(0, {1LL << 32, 1LL << 32}, {0, 0}).find("product of the sizes overflows"),
            std::string::npos);
  EXPECT_NE(err(0, {2}, {1, 1}).find("1 sizes but 2 strides"), std::string::npos);
  EXPECT_NE(err(11, {0}, {1}).find("past the storage"), std::string::npos);
  EXPECT_EQ(err(10, {0, 4}, {4, 1}), "accepted") << "an empty slice at the very end is valid";
  EXPECT_EQ(err(0, {1000000}, {0}), "accepted") << "stride 0 (expand) reads one element";
}

TEST(TensorView, UnsupportedDtypeIsRefusedByName) {
  auto v = TensorView::make(storage_of(dt::kComplex64, std::vector<float>(4)), 0, {2}, {1}, false);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("complex64"), std::string::npos);
}

}  // namespace
