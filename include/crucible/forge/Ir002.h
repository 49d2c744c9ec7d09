// Ir002.h — Forge's second IR: kernels instantiated from templates, each pinned to a recipe.
//
// Lowering turns each fusion group of IR001 into one KernelNode; every IR001 edge (a value read
// by a node) ends up either Fused (producer and consumer in the same group: never materialized)
// or Materialized (written to memory by one group and read by another, or external).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/forge/NumericalRecipe.h"

namespace crucible::forge {

// Frozen ordinals (printed in plan texts).
enum class KernelTemplate : std::uint8_t {
  GemmEpilogue = 0, ConvEpilogue = 1, PointwiseChain = 2, Reduce = 3, Norm = 4, Softmax = 5,
  Embedding = 6, Optimizer = 7, Collective = 8, Opaque = 9, View = 10, kCount = 11,
};
std::string_view kernel_template_name(KernelTemplate t) noexcept;  // "gemm_epilogue", ...
bool kernel_template_from_name(std::string_view name, KernelTemplate* out) noexcept;

struct FusionGroup {
  std::uint32_t id = 0;
  std::string rule;                   // rule id that formed it ("" for a budget fallback)
  KernelTemplate kernel = KernelTemplate::Opaque;
  const NumericalRecipe* recipe = nullptr;
  std::vector<std::uint32_t> nodes;   // IR001 node ids, execution order
  std::uint8_t numerics = 0;          // forge::Numerics
};

enum class EdgeState : std::uint8_t { Fused = 0, Materialized = 1 };
struct Edge {
  std::uint32_t value = 0;            // IR001 value id
  std::uint32_t from_group = UINT32_MAX;  // UINT32_MAX: external
  std::uint32_t to_group = 0;
  EdgeState state = EdgeState::Materialized;
};

struct KernelNode {
  std::uint32_t group = 0;
  KernelTemplate kernel = KernelTemplate::Opaque;
  const NumericalRecipe* recipe = nullptr;
  std::vector<std::uint32_t> inputs;   // materialized values read
  std::vector<std::uint32_t> outputs;  // materialized values written
  std::int64_t flops = 0, bytes = 0;   // sums over the group's nodes, materialized bytes only
};

struct Ir002 {
  std::vector<FusionGroup> groups;
  std::vector<Edge> edges;
  std::vector<KernelNode> kernels;     // one per group, group order
};

}  // namespace crucible::forge
