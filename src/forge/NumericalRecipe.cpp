// NumericalRecipe.cpp — recipe interning, the named registry and the canonical recipe text.
#include "crucible/forge/NumericalRecipe.h"

#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/ScalarType.h"

namespace crucible::forge {
namespace {

using R = NumericalRecipe;
constexpr std::int8_t kF32 = dtype::kFloat32, kF16 = dtype::kFloat16, kBF16 = dtype::kBFloat16;

// The recipes kernels are pinned to. Rules name them (rules/*.toml); plan texts print
// recipe_text(), never the name, so renaming an entry leaves plan digests unchanged.
//   f32_ordered              CPU/GPU default: sequential reduction per output, FMA contraction
//                            allowed (same machine + config = same bits, not the reference's bits)
//   f32_unordered            atomics / split-K: may differ run to run
//   f32_strict               bit-exact with the reference: sequential, no FMA contraction
//   f32_pairwise             pairwise-tree reductions (sum/mean/norm statistics): error O(log n)
//   f32_blocked8             AVX2 GEMM/conv: 8 partial sums per 256-bit lane, reduced at the end
//   bf16_f32acc              bf16 in/out, f32 arithmetic (pointwise chains after a bf16 GEMM)
//   bf16_f32acc_tc           tensor cores, bf16 operands, f32 accumulators, 64-wide k blocks
//   f16_f32acc_tc            the same with f16 operands
//   bf16_f32acc_bitexact_tc  tensor cores with a fixed tiling and no split-K: bit-exact runs
constexpr std::array<NamedRecipe, 9> kRegistry{{
    {"f32_ordered", R{kF32, kF32, ReductionAlgo::Sequential, RoundingMode::NearestEven,
                      ScalePolicy::None, Determinism::Ordered, 0, R::kAllowFma, 0}},
    {"f32_unordered", R{kF32, kF32, ReductionAlgo::Unordered, RoundingMode::NearestEven,
                        ScalePolicy::None, Determinism::Unordered, 0, R::kAllowFma, 0}},
    {"f32_strict", R{kF32, kF32, ReductionAlgo::Sequential, RoundingMode::NearestEven,
                     ScalePolicy::None, Determinism::BitexactStrict, 0, 0, 0}},
    {"f32_pairwise", R{kF32, kF32, ReductionAlgo::PairwiseTree, RoundingMode::NearestEven,
                       ScalePolicy::None, Determinism::Ordered, 0, R::kAllowFma, 0}},
    {"f32_blocked8", R{kF32, kF32, ReductionAlgo::Blocked, RoundingMode::NearestEven,
                       ScalePolicy::None, Determinism::Ordered, 8, R::kAllowFma, 0}},
    {"bf16_f32acc", R{kF32, kBF16, ReductionAlgo::Sequential, RoundingMode::NearestEven,
                      ScalePolicy::None, Determinism::Ordered, 0, R::kAllowFma, 0}},
    {"bf16_f32acc_tc", R{kF32, kBF16, ReductionAlgo::Blocked, RoundingMode::NearestEven,
                         ScalePolicy::None, Determinism::Ordered, 64, R::kAllowFma, 0}},
    {"f16_f32acc_tc", R{kF32, kF16, ReductionAlgo::Blocked, RoundingMode::NearestEven,
                        ScalePolicy::None, Determinism::Ordered, 64, R::kAllowFma, 0}},
    {"bf16_f32acc_bitexact_tc", R{kF32, kBF16, ReductionAlgo::Blocked, RoundingMode::NearestEven,
                                  ScalePolicy::None, Determinism::BitexactTc, 64, R::kAllowFma, 0}},
}};
static_assert(kRegistry.size() == 9, "the recipe registry is a data table: update the count");

// Intern key: the 16 bytes of the record (no padding: pinned by the static_assert in the header
// and by the field sizes 1+1+1+1+1+1+2+4+4).
using Key = std::array<unsigned char, sizeof(NumericalRecipe)>;
static_assert(sizeof(std::int8_t) * 2 + 4 + sizeof(std::uint16_t) + 2 * sizeof(std::uint32_t) ==
                  sizeof(NumericalRecipe),
              "NumericalRecipe has no padding bytes: its bytes are its intern key");
Key key_of(const NumericalRecipe& r) {
  Key k;
  std::memcpy(k.data(), &r, sizeof r);
  return k;
}

// Note [Recipe interning]: a mutex-guarded map over a std::deque, which never moves its
// elements, so a returned pointer stays valid for the life of the process. Interning is rare
// (rule loading, lowering: one call per kernel), so one lock is cheaper than being clever.
struct InternTable {
  std::mutex mu;
  std::deque<NumericalRecipe> store;
  absl::flat_hash_map<Key, const NumericalRecipe*> index;
};
InternTable& table() {
  static InternTable* t = new InternTable();  // never destroyed: pointers outlive static dtors
  return *t;
}

std::string dtype_short(std::int8_t d) {
  switch (d) {
    case dtype::kFloat32:
      return "f32";
    case dtype::kFloat16:
      return "f16";
    case dtype::kBFloat16:
      return "bf16";
    case dtype::kFloat64:
      return "f64";
    default:
      return std::string(scalar_type_info(d).name);
  }
}

}  // namespace

const NumericalRecipe* intern_recipe(const NumericalRecipe& r) {
  InternTable& t = table();
  const Key k = key_of(r);
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.index.find(k);
  if (it != t.index.end()) return it->second;
  t.store.push_back(r);
  const NumericalRecipe* p = &t.store.back();
  t.index.emplace(k, p);
  return p;
}

const NumericalRecipe* recipe_by_name(std::string_view name) {
  for (const NamedRecipe& n : kRegistry)
    if (n.name == name) return intern_recipe(n.recipe);
  return nullptr;
}

std::string_view recipe_name(const NumericalRecipe* r) {
  if (r == nullptr) return {};
  for (const NamedRecipe& n : kRegistry)
    if (n.recipe == *r) return n.name;
  return {};
}

std::span<const NamedRecipe> recipe_registry() noexcept { return kRegistry; }

std::string recipe_text(const NumericalRecipe& r) {
  std::string s = "acc=" + dtype_short(r.accum_dtype) + " io=" + dtype_short(r.io_dtype);
  // Names indexed by the frozen enum ordinals; an ordinal past a table prints as its number.
  auto field = [&s](const char* key, unsigned v, std::span<const char* const> names) {
    s += ' ';
    s += key;
    s += '=';
    s += v < names.size() ? std::string(names[v]) : std::to_string(v);
  };
  static constexpr const char* kRed[] = {"unordered", "seq", "pairwise", "blocked"};
  static constexpr const char* kRound[] = {"rne", "rtz", "stochastic"};
  static constexpr const char* kScale[] = {"none", "tensor", "channel", "block"};
  static constexpr const char* kDet[] = {"unordered", "ordered", "bitexact_tc", "bitexact_strict"};
  field("red", static_cast<unsigned>(r.reduction), kRed);
  field("round", static_cast<unsigned>(r.rounding), kRound);
  field("scale", static_cast<unsigned>(r.scale), kScale);
  field("det", static_cast<unsigned>(r.determinism), kDet);
  // Fields beyond the header's five are printed only when set, so the common text stays short;
  // every field still reaches the text, so two different recipes never print the same.
  if (r.block != 0) s += " block=" + std::to_string(r.block);
  if (r.flags & NumericalRecipe::kAllowFma) s += " fma";
  const std::uint32_t other = r.flags & ~NumericalRecipe::kAllowFma;
  if (other != 0) s += " flags=" + std::to_string(other);
  if (r.reserved != 0) s += " reserved=" + std::to_string(r.reserved);
  return s;
}

}  // namespace crucible::forge
