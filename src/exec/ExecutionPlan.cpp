// ExecutionPlan.cpp — slot kind names and the plan's one-line-per-entry description.
#include "crucible/exec/ExecutionPlan.h"

#include "crucible/graph/ArenaPlacement.h"

namespace crucible::exec {

const char* slot_kind_name(SlotKind k) noexcept {
  switch (k) {
    case SlotKind::Arena:
      return "arena";
    case SlotKind::Input:
      return "input";
    case SlotKind::Output:
      return "output";
    case SlotKind::Constant:
      return "constant";
  }
  return "unknown";
}

std::string describe(const ExecutionPlan& p) {
  std::string out = "execution plan: " + std::to_string(p.kernels.size()) + " kernels, " +
                    std::to_string(p.calls.size()) + " calls (" + std::to_string(p.elided_views) +
                    " views elided), " + std::to_string(p.slots.size()) + " slots, arena " +
                    std::to_string(p.arena_bytes) + " B aligned to " + std::to_string(p.alignment) +
                    "\n";
  for (std::size_t k = 0; k < p.kernels.size(); ++k) {
    const Kernel& kn = p.kernels[k];
    out += "kernel " + std::to_string(k) + " group " + std::to_string(kn.group) + " " +
           std::string(forge::kernel_template_name(kn.kernel)) + "\n";
    for (std::uint32_t c = kn.call_begin; c < kn.call_begin + kn.call_count && c < p.calls.size();
         ++c) {
      const Call& call = p.calls[c];
      out += "  call " + std::to_string(c) + " " +
             (call.op < p.op_names.size() ? p.op_names[call.op] : "?") + " (";
      for (std::uint32_t a = call.in_begin;
           a < call.out_begin + call.out_count && a < p.args.size(); ++a) {
        if (a == call.out_begin)
          out += ") -> (";
        else if (a != call.in_begin)
          out += ", ";
        out += "t" + std::to_string(p.args[a].tensor);
      }
      out += ")\n";
    }
  }
  for (std::size_t s = 0; s < p.slots.size(); ++s) {
    const Slot& sl = p.slots[s];
    out += "slot " + std::to_string(s) + " " + slot_kind_name(sl.kind) + " storage " +
           std::to_string(sl.storage) + " bytes " + std::to_string(sl.bytes) + " calls [" +
           std::to_string(sl.first) + ", " + std::to_string(sl.last) + "]";
    if (sl.kind == SlotKind::Arena || sl.kind == SlotKind::Constant)
      out += " offset " + std::to_string(sl.offset);
    if (sl.kind == SlotKind::Input || sl.kind == SlotKind::Output)
      out += " binding " + std::to_string(sl.binding);
    out += "\n";
  }
  return out;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> kernel_spans(const ExecutionPlan& plan) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> span(plan.calls.size());
  for (std::uint32_t c = 0; c < span.size(); ++c) span[c] = {c, c};
  for (const Kernel& k : plan.kernels) {
    if (k.call_count == 0) continue;
    for (std::uint32_t c = k.call_begin; c < k.call_begin + k.call_count && c < span.size(); ++c)
      span[c] = {k.call_begin, k.call_begin + k.call_count - 1};
  }
  return span;
}

MemoryUse plan_memory_use(const ExecutionPlan& plan) {
  return MemoryUse{kernel_spans(plan), {}, {}};
}

Status check_memory_use(const ExecutionPlan& plan, const MemoryUse& use) {
  const std::size_t ncalls = plan.calls.size(), nslots = plan.slots.size();
  if (use.spans.size() != ncalls || (!use.untouched.empty() && use.untouched.size() != nslots) ||
      (!use.library_only.empty() && use.library_only.size() != ncalls))
    return invalid_input("memory use: " + std::to_string(use.spans.size()) + " spans, " +
                             std::to_string(use.untouched.size()) + " untouched and " +
                             std::to_string(use.library_only.size()) + " library-only flags for " +
                             std::to_string(ncalls) + " calls and " + std::to_string(nslots) +
                             " slots",
                         "give one span and library-only flag per call and one untouched flag per "
                         "slot (or no flags)");
  for (std::uint32_t c = 0; c < ncalls; ++c)
    if (use.spans[c].first > c || use.spans[c].second < c || use.spans[c].second >= ncalls)
      return invalid_input("memory use: call " + std::to_string(c) + "'s span [" +
                               std::to_string(use.spans[c].first) + ", " +
                               std::to_string(use.spans[c].second) + "] does not hold it",
                           "a call's span holds the call");
  for (std::uint32_t s = 0; s < use.untouched.size(); ++s)
    if (use.untouched[s] && plan.slots[s].kind != SlotKind::Arena)
      return invalid_input("memory use: slot " + std::to_string(s) + " is " +
                               slot_kind_name(plan.slots[s].kind) +
                               " memory, and only an Arena slot can be left untouched",
                           "mark Arena slots only");
  return ok_status();
}

Result<ArenaLayout> place_arena(const ExecutionPlan& plan, const MemoryUse& use) {
  if (Status st = check_memory_use(plan, use); !st.ok()) return st;
  const std::size_t ncalls = plan.calls.size(), nslots = plan.slots.size();
  ArenaLayout out;
  out.offsets.assign(nslots, 0);
  out.placed.assign(nslots, false);
  out.live.assign(nslots, {0, 0});
  std::vector<graph::Lifetime> lifetimes;
  std::vector<std::uint32_t> which;
  for (std::uint32_t s = 0; s < nslots; ++s) {
    const Slot& sl = plan.slots[s];
    const bool untouched = !use.untouched.empty() && use.untouched[s];
    if (untouched || (sl.kind != SlotKind::Arena && sl.kind != SlotKind::Constant)) continue;
    // A Constant is written before the run: it is live from the first call.
    const std::uint32_t first = sl.kind == SlotKind::Constant ? 0
                                : sl.first < ncalls           ? use.spans[sl.first].first
                                                              : sl.first;
    const std::uint32_t last = sl.last < ncalls ? use.spans[sl.last].second : sl.last;
    lifetimes.push_back({sl.bytes, first, last});
    which.push_back(s);
    out.placed[s] = true;
    out.live[s] = {first, last};
  }
  const graph::ArenaPlacement placement = graph::place_in_arena(lifetimes);
  for (std::size_t i = 0; i < which.size(); ++i) out.offsets[which[i]] = placement.offsets[i];
  out.arena_bytes = placement.arena_bytes;
  return out;
}

}  // namespace crucible::exec
