// NumericalRecipe.h — how a kernel computes: accumulator dtype, reduction order, rounding, scaling
// and the determinism it promises. 16 bytes, interned: equal recipes are one pointer, and a
// registry names the ones kernels are pinned to ("f32_ordered", ...).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "crucible/core/Status.h"

namespace crucible::forge {

enum class ReductionAlgo : std::uint8_t { Unordered = 0, Sequential = 1, PairwiseTree = 2, Blocked = 3 };
enum class RoundingMode : std::uint8_t { NearestEven = 0, TowardZero = 1, Stochastic = 2 };
enum class ScalePolicy : std::uint8_t { None = 0, PerTensor = 1, PerChannel = 2, PerBlock = 3 };
// What repeated runs promise: UNORDERED (may differ run to run), ORDERED (same on the same
// machine and config), BITEXACT_TC (bit-exact across runs with tensor cores, fixed tiling),
// BITEXACT_STRICT (bit-exact with the reference implementation).
enum class Determinism : std::uint8_t { Unordered = 0, Ordered = 1, BitexactTc = 2, BitexactStrict = 3 };

struct NumericalRecipe {
  std::int8_t accum_dtype = 6;       // c10 ordinal (6 = float32)
  std::int8_t io_dtype = 6;
  ReductionAlgo reduction = ReductionAlgo::Sequential;
  RoundingMode rounding = RoundingMode::NearestEven;
  ScalePolicy scale = ScalePolicy::None;
  Determinism determinism = Determinism::Ordered;
  std::uint16_t block = 0;           // reduction block size for Blocked (0 otherwise)
  std::uint32_t flags = 0;           // kAllowFma, ...
  std::uint32_t reserved = 0;
  bool operator==(const NumericalRecipe&) const = default;
  static constexpr std::uint32_t kAllowFma = 1;
};
static_assert(sizeof(NumericalRecipe) == 16, "a recipe is a 16-byte record");

// Interned recipes: intern() returns the one pointer for equal recipes (thread-safe).
const NumericalRecipe* intern_recipe(const NumericalRecipe& r);
// Named registry: "f32_ordered", "f32_unordered", "f32_strict", "bf16_f32acc_tc", ...
const NumericalRecipe* recipe_by_name(std::string_view name);  // nullptr if unknown
std::string_view recipe_name(const NumericalRecipe* r);         // "" if not a named one
struct NamedRecipe {
  std::string_view name;
  NumericalRecipe recipe;
};
std::span<const NamedRecipe> recipe_registry() noexcept;
// Canonical text for plans and digests: "acc=f32 io=f32 red=seq round=rne scale=none det=ordered".
std::string recipe_text(const NumericalRecipe& r);

}  // namespace crucible::forge
