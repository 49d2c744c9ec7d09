// MemoryPlan.cpp — lifetimes, greedy-by-size placement, lower bound, budget check.
#include "crucible/graph/MemoryPlan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <queue>
#include <set>

#include "crucible/core/Contract.h"
#include "crucible/graph/FirstFit.h"

namespace crucible::graph {
namespace {
std::string mib(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

// The blocks in order of first use (then block order), each handed to start(block index); before
// it, every block started earlier whose last use comes before its first use is handed to
// end(block index), earliest last use first. start returns false to stop the sweep. The shared
// skeleton of time-order placement and check_plan: O(B log B).
template <class Start, class End>
void sweep_first_uses(const std::vector<Block>& blocks, Start start, End end) {
  std::vector<std::uint32_t> order(blocks.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return blocks[a].first < blocks[b].first; });
  using Ending = std::pair<std::uint32_t, std::uint32_t>;  // (last, block)
  std::priority_queue<Ending, std::vector<Ending>, std::greater<>> ending;
  for (std::uint32_t bi : order) {
    while (!ending.empty() && ending.top().first < blocks[bi].first) {
      end(ending.top().second);
      ending.pop();
    }
    if (!start(bi)) return;
    ending.emplace(blocks[bi].last, bi);
  }
}

// Time-order placement (MemoryPlan.h): blocks in order of first use (then block order), each
// at the smallest free chunk it fits (the lowest such on ties), else at the top of the arena
// (taking in a free chunk that ends there), its chunk freed after its last use and merged with
// free neighbours. O(B log B) whatever the lifetimes. Sizes are multiples of the alignment, so
// every offset is aligned. Returns the arena's size.
std::uint64_t place_in_time_order(std::vector<Block>& blocks) {
  std::map<std::uint64_t, std::uint64_t> free_at;             // offset -> bytes
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size;  // (bytes, offset)
  std::uint64_t top = 0;
  auto release = [&](std::uint32_t bi) {
    std::uint64_t off = blocks[bi].offset, bytes = blocks[bi].bytes;
    auto next = free_at.find(off + bytes);
    if (next != free_at.end()) {
      by_size.erase({next->second, next->first});
      bytes += next->second;
      free_at.erase(next);
    }
    auto at = free_at.lower_bound(off);
    if (at != free_at.begin()) {
      auto prev = std::prev(at);
      if (prev->first + prev->second == off) {
        by_size.erase({prev->second, prev->first});
        off = prev->first;
        bytes += prev->second;
        free_at.erase(prev);
      }
    }
    free_at.emplace(off, bytes);
    by_size.emplace(bytes, off);
  };
  auto place = [&](std::uint32_t bi) {
    Block& b = blocks[bi];
    auto fit = by_size.lower_bound({b.bytes, 0});
    if (fit != by_size.end()) {
      const auto [bytes, off] = *fit;
      by_size.erase(fit);
      free_at.erase(off);
      if (bytes > b.bytes) {
        free_at.emplace(off + b.bytes, bytes - b.bytes);
        by_size.emplace(bytes - b.bytes, off + b.bytes);
      }
      b.offset = off;
    } else if (!free_at.empty() && free_at.rbegin()->first + free_at.rbegin()->second == top) {
      const auto [off, bytes] = *free_at.rbegin();  // too small, but the arena can grow past it
      by_size.erase({bytes, off});
      free_at.erase(off);
      b.offset = off;
      top = off + b.bytes;
    } else {
      b.offset = top;
      top += b.bytes;  // under 2^62 in all: plan_memory checked the total
    }
    return true;
  };
  sweep_first_uses(blocks, place, release);
  return top;
}
}  // namespace

Status check_plan_options(const PlanOptions& opt) {
  if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0 ||
      opt.alignment > (std::uint64_t{1} << 30))
    return invalid_input(
        "plan alignment " + std::to_string(opt.alignment) + " is not a power of two up to 2^30",
        "use 16, 64, 256, ...");
  return ok_status();
}

Result<MemoryPlan> plan_memory(const record::Trace& t, const TraceGraph& g, const PlanOptions& opt) {
  if (Status st = check_plan_options(opt); !st.ok()) return st;
  MemoryPlan plan;
  const auto n = static_cast<std::uint32_t>(g.num_nodes());
  // Per storage number (the graph's numbering): its block, or kPersistent for storages read
  // before produced (graph externals) or classified external, whose sizes are summed apart.
  const record::StorageNumbering& num = g.numbering();
  constexpr std::uint32_t kUnseen = UINT32_MAX, kPersistent = UINT32_MAX - 1;
  std::vector<std::uint32_t> block_of(num.num_storages() + 1, kUnseen);
  std::vector<std::uint64_t> persistent_size(num.num_storages() + 1, 0);
  for (std::size_t s = 1; s <= num.num_storages(); ++s)
    if (num.kinds[s - 1] != 0) block_of[s] = kPersistent;
  for (const auto& x : g.externals()) block_of[x.storage_number] = kPersistent;
  const std::uint32_t* number = num.storage.data();
  for (std::uint32_t node = 0; node < n; ++node) {
    const std::size_t op = g.trace_op(node);
    auto touch = [&](const record::TensorMeta& m, std::uint32_t s, bool output) {
      if (m.flags & record::tensor_flag::kNoStorage || s == 0) return;
      std::uint32_t& slot = block_of[s];
      if (slot == kUnseen) {
        if (!output) return;  // unreachable: an input not produced earlier is a graph external
        slot = static_cast<std::uint32_t>(plan.blocks.size());
        Block b;
        b.storage_id = m.storage_id;
        b.bytes = m.storage_nbytes;
        b.first = b.last = node;
        b.producer = node;
        b.storage_number = s;
        plan.blocks.push_back(b);
      } else if (slot == kPersistent) {
        persistent_size[s] = std::max(persistent_size[s], m.storage_nbytes);
      } else {
        Block& b = plan.blocks[slot];
        b.bytes = std::max(b.bytes, m.storage_nbytes);
        b.last = node;
      }
    };
    const auto ins = t.inputs(op), outs = t.outputs(op);
    for (std::size_t k = 0; k < ins.size(); ++k) touch(ins[k], number[k], false);
    for (std::size_t k = 0; k < outs.size(); ++k) touch(outs[k], number[ins.size() + k], true);
    number += ins.size() + outs.size();
  }
  // Sizes come from the trace, and a loaded file says what it likes: every total below stays
  // under 2^62 bytes (far above any real device), so no offset, end or live sum can wrap.
  constexpr std::uint64_t kMaxTotal = kMaxPlacedBytes;  // 2^62
  auto too_big = [&](std::uint64_t storage_id, std::uint64_t bytes) {
    return invalid_input("the trace's storage sizes add up to more than 2^62 bytes (storage " +
                             std::to_string(storage_id) + " says " + std::to_string(bytes) +
                             " bytes)",
                         "the trace is corrupt or not of a real program: record it again");
  };
  std::uint64_t total = 0;
  for (std::size_t s = 1; s < persistent_size.size(); ++s) {
    if (persistent_size[s] > kMaxTotal - total)
      return too_big(num.storages[s - 1], persistent_size[s]);
    total += persistent_size[s];
  }
  plan.persistent_bytes = total;
  total = 0;
  for (const Block& b : plan.blocks) {
    if (b.bytes > kMaxTotal - total || opt.alignment > kMaxTotal - total - b.bytes)
      return too_big(b.storage_id, b.bytes);
    total += b.bytes + opt.alignment;  // with the rounding up below
  }
  for (Block& b : plan.blocks) {
    b.bytes = (b.bytes + opt.alignment - 1) & ~(opt.alignment - 1);
    if (b.bytes == 0) b.bytes = opt.alignment;  // empty tensors still get a distinct address
  }
  // Lower bound by a sweep: +bytes at first, -bytes after last.
  std::vector<std::int64_t> delta(n + 1, 0);
  for (const Block& b : plan.blocks) {
    delta[b.first] += static_cast<std::int64_t>(b.bytes);
    delta[b.last + 1] -= static_cast<std::int64_t>(b.bytes);
  }
  std::int64_t live = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    live += delta[i];
    if (static_cast<std::uint64_t>(live) > plan.lower_bound) {
      plan.lower_bound = static_cast<std::uint64_t>(live);
      plan.peak_node = i;
    }
  }
  // Greedy by size.
  std::vector<std::size_t> order(plan.blocks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Block &x = plan.blocks[a], &y = plan.blocks[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    if (x.first != y.first) return x.first < y.first;
    return a < b;  // block order = first-touch order: the plan never depends on raw storage ids
  });
  // Placed blocks in increasing offset order; each block goes at its first fit among them
  // (FirstFit.h): the same first fit as sorting the lifetime-overlapping blocks' intervals,
  // without building or sorting them per block.
  PlacedBlocks placed;
  placed.reserve(plan.blocks.size());
  std::uint64_t visits = 0;  // placed blocks looked at or moved, against opt.first_fit_visits
  for (std::size_t bi : order) {
    Block& b = plan.blocks[bi];
    const Fit fit = first_fit(placed, b.bytes, b.first, b.last);
    const auto seen_end = placed.offset.begin() + static_cast<long>(fit.seen);
    const std::size_t at = static_cast<std::size_t>(
        std::upper_bound(placed.offset.begin(), seen_end, fit.offset) - placed.offset.begin());
    // The insertion moves every placed block after it: as costly per block as a visit.
    visits += fit.seen + (placed.size() - at);
    if (visits > opt.first_fit_visits) [[unlikely]] {
      plan.first_fit = false;
      plan.arena_bytes = place_in_time_order(plan.blocks);
      break;
    }
    b.offset = fit.offset;
    plan.arena_bytes = std::max(plan.arena_bytes, fit.offset + b.bytes);
    placed.insert(at, fit.offset, fit.offset + b.bytes, b.first, b.last);
  }
  if (opt.budget != 0 && plan.persistent_bytes + plan.arena_bytes > opt.budget) {
    std::vector<const Block*> at_peak;
    for (const Block& b : plan.blocks)
      if (b.first <= plan.peak_node && plan.peak_node <= b.last) at_peak.push_back(&b);
    std::sort(at_peak.begin(), at_peak.end(), [](const Block* a, const Block* b) { return a->bytes > b->bytes; });
    std::string report = "memory plan does not fit: persistent " + mib(plan.persistent_bytes) +
                         " + arena " + mib(plan.arena_bytes) + " > budget " + mib(opt.budget) +
                         "; at the peak (node " + std::to_string(plan.peak_node) + ", op '" +
                         t.schema_name(t.ops[g.trace_op(plan.peak_node)].schema_hash) + "') " +
                         std::to_string(at_peak.size()) + " tensors are live, largest:";
    for (std::size_t i = 0; i < at_peak.size() && i < 8; ++i)
      report += " [" + mib(at_peak[i]->bytes) + " from node " + std::to_string(at_peak[i]->producer) +
                " '" + t.schema_name(t.ops[g.trace_op(at_peak[i]->producer)].schema_hash) + "']";
    return exhausted(report, "use a smaller batch, or raise the budget if the device has more memory");
  }
  // Every plan built where contracts are enforced (every test preset but release) is checked
  // for the property every plan must have: no two live blocks overlap (check_plan, a sweep
  // that costs about what the plan did), so builds that only observe contracts (release) skip it.
  if constexpr (CRUCIBLE_CONTRACT_SEMANTIC == 2)
    CRUCIBLE_POST(check_plan(plan).ok(), "no two blocks live at one node overlap in the arena");
  return plan;
}

MemoryPlan rebased_plan(const MemoryPlan& p, const record::StorageNumbering& numbering) {
  MemoryPlan out = p;
  for (Block& b : out.blocks) {
    CRUCIBLE_PRE(b.storage_number != 0 && b.storage_number <= numbering.storages.size(),
                 "the numbering is of ops with this plan's wiring");
    if (b.storage_number != 0 && b.storage_number <= numbering.storages.size())
      b.storage_id = numbering.storages[b.storage_number - 1];
  }
  return out;
}

// A sweep over first uses: the blocks live at a node, kept by offset, are pairwise disjoint
// until the first fault, so a new block overlaps one of them only if it overlaps its neighbour
// below or above. O(B log B): a loaded trace's plan may have millions of blocks.
Status check_plan(const MemoryPlan& p) {
  const std::vector<Block>& bl = p.blocks;
  for (const Block& a : bl)
    if (a.offset > p.arena_bytes || a.bytes > p.arena_bytes - a.offset)
      return invalid_input("block of storage " + std::to_string(a.storage_id) + " ends past the arena",
                           "this is a planner bug: report it with the trace");
  std::set<std::pair<std::uint64_t, std::uint32_t>> live;  // (offset, block)
  auto overlap = [&](std::uint32_t i, std::uint32_t j) {
    return bl[i].offset < bl[j].offset + bl[j].bytes && bl[j].offset < bl[i].offset + bl[i].bytes;
  };
  std::uint32_t first = 0, second = 0;  // the first overlapping pair found, if any
  bool found = false;
  sweep_first_uses(
      bl,
      [&](std::uint32_t bi) {
        const auto at = live.emplace(bl[bi].offset, bi).first;
        if (at != live.begin() && overlap(std::prev(at)->second, bi)) first = std::prev(at)->second;
        else if (std::next(at) != live.end() && overlap(std::next(at)->second, bi)) first = std::next(at)->second;
        else return true;
        second = bi;
        found = true;
        return false;
      },
      [&](std::uint32_t bi) { live.erase({bl[bi].offset, bi}); });
  if (found)
    return invalid_input("blocks of storages " + std::to_string(bl[first].storage_id) + " and " +
                             std::to_string(bl[second].storage_id) + " are live together and overlap",
                         "this is a planner bug: report it with the trace");
  return ok_status();
}

}  // namespace crucible::graph
