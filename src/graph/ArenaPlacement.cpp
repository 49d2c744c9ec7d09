// ArenaPlacement.cpp — greedy-by-size first fit over lifetimes, time order past a budget of
// visits, and the overlap sweep that checks a placement.
#include "crucible/graph/ArenaPlacement.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

#include "crucible/core/Contract.h"
#include "crucible/graph/FirstFit.h"

namespace crucible::graph {
namespace {

// Time order (ArenaPlacement.h): blocks in order of first use (then index), each at the
// smallest free chunk it fits (the lowest such on ties), else at the top of the arena (taking
// in a free chunk that ends there), its chunk freed after its last use and merged with free
// neighbours. O(B log B) whatever the lifetimes. Returns the arena's size.
std::uint64_t place_in_time_order(std::span<const Lifetime> blocks,
                                  std::vector<std::uint64_t>& offsets) {
  std::map<std::uint64_t, std::uint64_t> free_at;             // offset -> bytes
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size;  // (bytes, offset)
  std::uint64_t top = 0;
  auto release = [&](std::uint32_t bi) {
    std::uint64_t off = offsets[bi], bytes = blocks[bi].bytes;
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
    const std::uint64_t want = blocks[bi].bytes;
    auto fit = by_size.lower_bound({want, 0});
    if (fit != by_size.end()) {
      const auto [bytes, off] = *fit;
      by_size.erase(fit);
      free_at.erase(off);
      if (bytes > want) {
        free_at.emplace(off + want, bytes - want);
        by_size.emplace(bytes - want, off + want);
      }
      offsets[bi] = off;
    } else if (!free_at.empty() && free_at.rbegin()->first + free_at.rbegin()->second == top) {
      const auto [off, bytes] = *free_at.rbegin();  // too small, but the arena can grow past it
      by_size.erase({bytes, off});
      free_at.erase(off);
      offsets[bi] = off;
      top = off + want;
    } else {
      offsets[bi] = top;
      top += want;  // under 2^62 in all: the callers checked the total
    }
    return true;
  };
  sweep_first_uses(blocks, place, release);
  return top;
}

}  // namespace

ArenaPlacement place_in_arena(std::span<const Lifetime> blocks, std::uint64_t first_fit_visits) {
  ArenaPlacement out;
  out.offsets.assign(blocks.size(), 0);
  std::vector<std::size_t> order(blocks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Lifetime &x = blocks[a], &y = blocks[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    if (x.first != y.first) return x.first < y.first;
    return a < b;  // the callers' order (first touch): a plan never depends on raw addresses
  });
  // Placed blocks in increasing offset order; each block goes at its first fit among them
  // (FirstFit.h): the same first fit as sorting the lifetime-overlapping blocks' intervals,
  // without building or sorting them per block.
  PlacedBlocks placed;
  placed.reserve(blocks.size());
  std::uint64_t visits = 0;  // placed blocks looked at or moved, against first_fit_visits
  for (std::size_t bi : order) {
    const Lifetime& b = blocks[bi];
    CRUCIBLE_PRE(b.bytes > 0 && b.first <= b.last, "a block has bytes and a lifetime");
    const Fit fit = first_fit(placed, b.bytes, b.first, b.last);
    const auto seen_end = placed.offset.begin() + static_cast<long>(fit.seen);
    const std::size_t at = static_cast<std::size_t>(
        std::upper_bound(placed.offset.begin(), seen_end, fit.offset) - placed.offset.begin());
    // The insertion moves every placed block after it: as costly per block as a visit.
    visits += fit.seen + (placed.size() - at);
    if (visits > first_fit_visits) [[unlikely]] {
      out.first_fit = false;
      out.arena_bytes = place_in_time_order(blocks, out.offsets);
      return out;
    }
    out.offsets[bi] = fit.offset;
    out.arena_bytes = std::max(out.arena_bytes, fit.offset + b.bytes);
    placed.insert(at, fit.offset, fit.offset + b.bytes, b.first, b.last);
  }
  return out;
}

std::optional<std::pair<std::uint32_t, std::uint32_t>> overlapping_pair(
    std::span<const Lifetime> blocks, std::span<const std::uint64_t> offsets) {
  CRUCIBLE_PRE(blocks.size() == offsets.size(), "one offset per block");
  std::set<std::pair<std::uint64_t, std::uint32_t>> live;  // (offset, block)
  auto overlap = [&](std::uint32_t i, std::uint32_t j) {
    return offsets[i] < offsets[j] + blocks[j].bytes && offsets[j] < offsets[i] + blocks[i].bytes;
  };
  std::optional<std::pair<std::uint32_t, std::uint32_t>> found;
  sweep_first_uses(
      blocks,
      [&](std::uint32_t bi) {
        const auto at = live.emplace(offsets[bi], bi).first;
        if (at != live.begin() && overlap(std::prev(at)->second, bi))
          found.emplace(std::prev(at)->second, bi);
        else if (std::next(at) != live.end() && overlap(std::next(at)->second, bi))
          found.emplace(std::next(at)->second, bi);
        return !found;
      },
      [&](std::uint32_t bi) { live.erase({offsets[bi], bi}); });
  return found;
}

}  // namespace crucible::graph
