// StrongId.h — typed integer IDs: an OpIndex cannot be passed where a TensorSlot is expected.
//
// A StrongId is a trivially copyable wrapper of one unsigned integer (4 or 8 bytes, no padding)
// so it can live in fixed-size POD records. The all-ones value is reserved as "none".
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>

namespace crucible {

template <class Tag, class Rep = std::uint32_t>
struct StrongId {
  static_assert(std::is_unsigned_v<Rep>, "StrongId wraps an unsigned integer");
  using rep_type = Rep;
  static constexpr Rep kNone = std::numeric_limits<Rep>::max();

  Rep value = kNone;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : value(v) {}
  static constexpr StrongId none() { return StrongId{}; }

  [[nodiscard]] constexpr bool is_valid() const { return value != kNone; }
  [[nodiscard]] constexpr Rep raw() const { return value; }
  constexpr auto operator<=>(const StrongId&) const = default;
};

// IDs used across stages. Each tag is an empty struct; the name is the documentation.
using OpIndex = StrongId<struct OpIndexTag>;            // position of an op in a trace
using TensorSlot = StrongId<struct TensorSlotTag>;      // one tensor record in a trace
using StorageId = StrongId<struct StorageIdTag, std::uint64_t>;  // identity of a storage
using SchemaHash = StrongId<struct SchemaHashTag, std::uint64_t>; // qualified name + overload

static_assert(sizeof(OpIndex) == 4 && std::is_trivially_copyable_v<OpIndex>);
static_assert(sizeof(SchemaHash) == 8 && std::is_trivially_copyable_v<SchemaHash>);

}  // namespace crucible

template <class Tag, class Rep>
struct std::hash<crucible::StrongId<Tag, Rep>> {
  std::size_t operator()(crucible::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>{}(id.value);
  }
};
