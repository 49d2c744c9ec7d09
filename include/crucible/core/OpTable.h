// OpTable.h — the one op taxonomy: which CKernel an ATen op is, and the few facts about single
// ops that the graph, Forge and the execution plan ask (instead of name lists of their own).
//
// The table (OpTable.cpp, Note [Op table]) is data with a static_assert'ed row count. Every
// OPAQUE row carries the reason it is opaque; an op missing from the table is classified OPAQUE
// with the reason "not in the op table" — reported, never guessed.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "crucible/core/CKernel.h"

namespace crucible {

// Facts about one op beyond its kind, a bit set per row (OpTableEntry::traits).
namespace op_trait {
// A copy (clone, contiguous): each output element is the input element at the same position, as
// for the elementwise kinds (CKernelInfo::elementwise).
inline constexpr std::uint8_t kCopy = 1;
// A view op that leaves the element order alone when its output has its input's shape (view,
// expand, alias, ...): such a view is the input itself.
inline constexpr std::uint8_t kShapePreservingView = 2;
// May return its input itself (to() to the same dtype, contiguous() of a contiguous tensor).
inline constexpr std::uint8_t kMayReturnInput = 4;
// Reads its inputs to the host and writes no tensor (item(), _local_scalar_dense, equal): it may
// run earlier, as long as no call between writes what it reads.
inline constexpr std::uint8_t kHostRead = 8;
}  // namespace op_trait

// Classification of one ATen op by its qualified name ("aten::addmm" or "aten::add.Tensor": the
// overload is looked up first, then the base name).
struct OpClass {
  CKernel kind = CKernel::Opaque;
  std::string_view reason;  // non-empty exactly when kind == Opaque
  std::uint8_t traits = 0;  // op_trait bits
};
OpClass classify_op(std::string_view qualified_name) noexcept;
// The reason classify_op gives an op the table does not have.
inline constexpr std::string_view kNotInOpTable = "not in the op table";

// "add_" from "aten::add_.Tensor": the op name without namespace and overload.
std::string_view op_base_name(std::string_view qualified_name) noexcept;
// Whether the op writes its first argument in place: its base name ends in '_' ("add_",
// "_foreach_add_"); a dunder is in place only as "__i...__" ("__iand__", not "__and__").
bool is_in_place_op(std::string_view qualified_name) noexcept;

// Whether an op writes a fresh output whose every element depends only on the inputs' elements
// at the same position (an elementwise kind, or a copy), and is not in place ("add_"): such an
// op may write its output into the memory of an input laid out alike that dies at it.
bool is_elementwise_functional(std::string_view qualified_name) noexcept;

// Every entry of the op table, for tests and reports.
struct OpTableEntry {
  std::string_view name;
  CKernel kind;
  std::string_view reason;  // OPAQUE only
  std::uint8_t traits = 0;  // op_trait bits
};
std::span<const OpTableEntry> op_table() noexcept;

}  // namespace crucible
