// VerifyPlan.cpp — the execution plan's invariants (VerifyPlan.h), checked table by table.
#include "crucible/exec/VerifyPlan.h"

#include <string>
#include <vector>

#include "crucible/core/ScalarType.h"
#include "crucible/graph/ArenaPlacement.h"
#include "crucible/graph/FirstFit.h"

namespace crucible::exec {
namespace {

constexpr std::string_view kFix = "the plan is corrupt: build it again from the step (build_plan)";

std::string slot_text(const ExecutionPlan& p, std::uint32_t s) {
  return "slot " + std::to_string(s) + " (" + slot_kind_name(p.slots[s].kind) + ", storage " +
         std::to_string(p.slots[s].storage) + ")";
}
std::string call_text(const ExecutionPlan& p, std::uint32_t c) {
  const Call& call = p.calls[c];
  return "call " + std::to_string(c) + " (" +
         (call.op < p.op_names.size() ? p.op_names[call.op] : std::string("?")) + ")";
}
bool in_range(std::uint64_t begin, std::uint64_t count, std::uint64_t size) {
  return begin <= size && count <= size - begin;
}

// The first and one-past-last byte a tensor's elements touch, relative to its slot, or an
// error. Elements are at offset + sum(i_d * stride_d) for 0 <= i_d < size_d.
Status tensor_extent(const ExecutionPlan& p, std::uint32_t ti, std::uint64_t* lo,
                     std::uint64_t* hi) {
  const TensorRef& t = p.tensors[ti];
  auto es = element_size(t.dtype);
  auto what = [&] {  // made only for an error: a plan's verification visits every tensor
    return "tensor " + std::to_string(ti) + " (value " + std::to_string(t.value) + ")";
  };
  if (!es.ok())
    return invalid_input(what() + " has dtype " + std::to_string(t.dtype) + ", of no known size",
                         kFix);
  if (!in_range(t.dims, 2 * std::uint64_t{t.ndim}, p.dims.size()))
    return invalid_input(what() + "'s sizes and strides lie past the dims table", kFix);
  std::int64_t low = t.offset, high = t.offset;  // elements
  bool empty = false;
  constexpr std::int64_t kLimit = std::int64_t{1} << 61;
  for (std::uint16_t d = 0; d < t.ndim; ++d) {
    const std::int64_t size = p.dims[t.dims + d], stride = p.dims[t.dims + t.ndim + d];
    if (size < 0 || size > kLimit || stride > kLimit || stride < -kLimit)
      return invalid_input(what() + " has dim " + std::to_string(d) + " of size " +
                               std::to_string(size) + " and stride " + std::to_string(stride),
                           kFix);
    if (size == 0) empty = true;
    std::int64_t reach = 0;
    if (size > 0 && __builtin_mul_overflow(size - 1, stride, &reach))
      return invalid_input(what() + "'s extent overflows", kFix);
    (reach < 0 ? low : high) += reach;
    if (low < -kLimit || high > kLimit) return invalid_input(what() + "'s extent overflows", kFix);
  }
  if (empty) {
    *lo = *hi = 0;
    return ok_status();
  }
  if (low < 0)
    return invalid_input(
        what() + " reaches " + std::to_string(-low) + " elements before its slot's start", kFix);
  *lo = static_cast<std::uint64_t>(low) * *es;
  *hi = (static_cast<std::uint64_t>(high) + 1) * *es;
  return ok_status();
}

}  // namespace

Status verify_plan(const ExecutionPlan& p) {
  const auto ncalls = static_cast<std::uint32_t>(p.calls.size());
  if (p.alignment == 0 || (p.alignment & (p.alignment - 1)) != 0)
    return invalid_input(
        "the plan's alignment " + std::to_string(p.alignment) + " is not a power of two", kFix);
  if (p.arena_bytes >= graph::kMaxPlacedBytes)
    return invalid_input("the arena is " + std::to_string(p.arena_bytes) + " bytes, past 2^62",
                         kFix);

  // Kernels cover the calls in order.
  std::uint32_t next_call = 0;
  for (std::size_t k = 0; k < p.kernels.size(); ++k) {
    const Kernel& kn = p.kernels[k];
    if (kn.call_begin != next_call || !in_range(kn.call_begin, kn.call_count, ncalls))
      return invalid_input("kernel " + std::to_string(k) + " runs calls [" +
                               std::to_string(kn.call_begin) + ", +" +
                               std::to_string(kn.call_count) + ") where call " +
                               std::to_string(next_call) + " comes next",
                           "kernels run every call once, in order");
    next_call += kn.call_count;
  }
  if (next_call != ncalls)
    return invalid_input("the kernels run " + std::to_string(next_call) + " of the plan's " +
                             std::to_string(ncalls) + " calls",
                         "kernels run every call once, in order");

  // Slots: kinds, alignment, bounds; bindings. Overlap is checked over whole kernels (Note
  // [Kernel lifetimes]).
  const auto spans = kernel_spans(p);
  const auto nslots = static_cast<std::uint32_t>(p.slots.size());
  std::vector<graph::Lifetime> lifetimes;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint32_t> placed_slot;
  for (std::uint32_t s = 0; s < nslots; ++s) {
    const Slot& sl = p.slots[s];
    if (static_cast<std::uint8_t>(sl.kind) > static_cast<std::uint8_t>(SlotKind::Constant))
      return invalid_input(
          "slot " + std::to_string(s) + " has kind " + std::to_string(static_cast<int>(sl.kind)),
          kFix);
    if (sl.first > sl.last || (ncalls > 0 && sl.last >= ncalls))
      return invalid_input(slot_text(p, s) + " lives over calls [" + std::to_string(sl.first) +
                               ", " + std::to_string(sl.last) + "] of " + std::to_string(ncalls),
                           kFix);
    const bool in_arena = sl.kind == SlotKind::Arena || sl.kind == SlotKind::Constant;
    if (in_arena) {
      if (sl.bytes == 0 || sl.offset % p.alignment != 0 || sl.bytes % p.alignment != 0)
        return invalid_input(slot_text(p, s) + " at offset " + std::to_string(sl.offset) + " of " +
                                 std::to_string(sl.bytes) + " bytes is empty or not aligned to " +
                                 std::to_string(p.alignment),
                             kFix);
      if (sl.offset > p.arena_bytes || sl.bytes > p.arena_bytes - sl.offset)
        return invalid_input(slot_text(p, s) + " at offset " + std::to_string(sl.offset) + " of " +
                                 std::to_string(sl.bytes) + " bytes ends past the arena's " +
                                 std::to_string(p.arena_bytes) + " bytes",
                             kFix);
      // A Constant is written before the run: it is live from the first call.
      lifetimes.push_back({sl.bytes,
                           sl.kind == SlotKind::Constant ? 0
                           : sl.first < spans.size()     ? spans[sl.first].first
                                                         : sl.first,
                           sl.last < spans.size() ? spans[sl.last].second : sl.last});
      offsets.push_back(sl.offset);
      placed_slot.push_back(s);
      if (sl.kind == SlotKind::Constant && !element_size(sl.dtype).ok())
        return invalid_input(
            slot_text(p, s) + " holds a number of dtype " + std::to_string(sl.dtype), kFix);
    }
    const std::vector<std::uint32_t>* table = sl.kind == SlotKind::Input    ? &p.inputs
                                              : sl.kind == SlotKind::Output ? &p.outputs
                                                                            : nullptr;
    if (table != nullptr && (sl.binding >= table->size() || (*table)[sl.binding] != s))
      return invalid_input(slot_text(p, s) + " has binding " + std::to_string(sl.binding) +
                               ", which does not name it",
                           kFix);
  }
  for (const auto* table : {&p.inputs, &p.outputs}) {
    const SlotKind want = table == &p.inputs ? SlotKind::Input : SlotKind::Output;
    for (std::size_t b = 0; b < table->size(); ++b) {
      const std::uint32_t s = (*table)[b];
      if (s >= nslots || p.slots[s].kind != want || p.slots[s].binding != b)
        return invalid_input(std::string(want == SlotKind::Input ? "input" : "output") +
                                 " binding " + std::to_string(b) + " names slot " +
                                 std::to_string(s) + ", not an " + slot_kind_name(want) +
                                 " slot bound there",
                             kFix);
    }
  }
  if (auto pair = graph::overlapping_pair(lifetimes, offsets))
    return invalid_input(slot_text(p, placed_slot[pair->first]) + " and " +
                             slot_text(p, placed_slot[pair->second]) +
                             " are live in one kernel and overlap in the arena",
                         "this is a planner bug: report it with the step");

  // Tensors inside their slots.
  for (std::uint32_t ti = 0; ti < p.tensors.size(); ++ti) {
    const TensorRef& t = p.tensors[ti];
    if (t.slot >= nslots)
      return invalid_input("tensor " + std::to_string(ti) + " names slot " +
                               std::to_string(t.slot) + " of " + std::to_string(nslots),
                           kFix);
    std::uint64_t lo = 0, hi = 0;
    if (Status st = tensor_extent(p, ti, &lo, &hi); !st.ok()) return st;
    if (hi > p.slots[t.slot].bytes)
      return invalid_input("tensor " + std::to_string(ti) + " (value " + std::to_string(t.value) +
                               ") reaches byte " + std::to_string(hi) + " of " +
                               slot_text(p, t.slot) + ", which has " +
                               std::to_string(p.slots[t.slot].bytes),
                           kFix);
  }
  for (std::uint32_t r : p.results)
    if (r >= p.tensors.size())
      return invalid_input("result tensor " + std::to_string(r) + " is out of range", kFix);

  // Calls: ranges, lifetimes, produced before read.
  std::vector<bool> written(nslots, false);
  for (std::uint32_t c = 0; c < ncalls; ++c) {
    const Call& call = p.calls[c];
    if (call.op >= p.op_names.size())
      return invalid_input("call " + std::to_string(c) + " names no op", kFix);
    if (call.out_begin != call.in_begin + call.in_count ||
        !in_range(call.in_begin, call.in_count, p.args.size()) ||
        !in_range(call.out_begin, call.out_count, p.args.size()) ||
        !in_range(call.scalar_begin, call.scalar_count, p.scalars.size()))
      return invalid_input(call_text(p, c) + "'s argument or scalar range is out of bounds", kFix);
    for (std::uint32_t a = call.in_begin; a < call.out_begin + call.out_count; ++a) {
      const std::uint32_t ti = p.args[a].tensor;
      if (ti >= p.tensors.size())
        return invalid_input(call_text(p, c) + " names tensor " + std::to_string(ti) + " of " +
                                 std::to_string(p.tensors.size()),
                             kFix);
      const std::uint32_t s = p.tensors[ti].slot;
      const Slot& sl = p.slots[s];
      const bool output = a >= call.out_begin;
      if (c < sl.first || c > sl.last)
        return invalid_input(call_text(p, c) + " touches " + slot_text(p, s) +
                                 " outside its lifetime [" + std::to_string(sl.first) + ", " +
                                 std::to_string(sl.last) + "]",
                             "a slot lives from its producing call to its last use");
      const bool ready = sl.kind == SlotKind::Input || sl.kind == SlotKind::Constant || written[s];
      if (!output && !ready)
        return invalid_input(
            call_text(p, c) + " reads " + slot_text(p, s) + " before any call writes it",
            "every input is produced by an earlier call or is an input or constant slot");
      if (output) {
        if (sl.kind == SlotKind::Constant)
          return invalid_input(call_text(p, c) + " writes the constant " + slot_text(p, s), kFix);
        if (sl.kind == SlotKind::Arena && !written[s] && c != sl.first)
          return invalid_input(
              call_text(p, c) + " writes " + slot_text(p, s) + " first, after its lifetime began",
              kFix);
        written[s] = true;
      }
    }
  }
  for (std::uint32_t s = 0; s < nslots; ++s)
    if (p.slots[s].kind == SlotKind::Arena && !written[s])
      return invalid_input(slot_text(p, s) + " is in the arena but no call writes it", kFix);

  // Patches.
  std::vector<bool> patched_scalar(p.scalars.size(), false), patched_slot(nslots, false);
  for (std::size_t i = 0; i < p.patches.size(); ++i) {
    const PatchPoint& pp = p.patches[i];
    const bool scalar = pp.kind == PatchKind::Scalar;
    if (!scalar && pp.kind != PatchKind::Constant)
      return invalid_input(
          "patch " + std::to_string(i) + " has kind " + std::to_string(static_cast<int>(pp.kind)),
          kFix);
    std::vector<bool>& seen = scalar ? patched_scalar : patched_slot;
    if (pp.index >= seen.size() || (!scalar && p.slots[pp.index].kind != SlotKind::Constant) ||
        seen[pp.index])
      return invalid_input("patch " + std::to_string(i) + " ('" + pp.name + "') names " +
                               (scalar ? "scalar " : "slot ") + std::to_string(pp.index) +
                               ": out of range, not a constant, or patched twice",
                           kFix);
    seen[pp.index] = true;
  }
  return ok_status();
}

}  // namespace crucible::exec
