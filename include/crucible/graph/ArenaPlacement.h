// ArenaPlacement.h — the one lifetime planner: an offset in one arena for every block, given its
// size and the steps it is live over, so that no two blocks live at one step overlap.
//
// The graph's memory plan, the execution plan (exec) and the runtime's Net all place their
// blocks here. Greedy by size: blocks by decreasing size (then first use, then index), each at
// its first fit among the blocks placed so far (FirstFit.h). Each block looks at or moves every
// block placed before it, so the cost grows with the square of the blocks, which a loaded trace
// can make as many as it likes: past `first_fit_visits` such visits (about 0.2 s, some 16k
// blocks) the blocks are placed again in time order instead — each at the best fitting free
// chunk when it is first used, freed after its last use, O(B log B) — and the result says so.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <span>
#include <utility>
#include <vector>

namespace crucible::graph {

// One block: its size (bytes, a multiple of the arena's alignment and above 0, so that every
// offset is aligned and an empty tensor still gets an address of its own) and its lifetime, the
// steps [first, last], inclusive.
struct Lifetime {
  std::uint64_t bytes = 0;
  std::uint32_t first = 0, last = 0;
};

// Visits of placed blocks before greedy-by-size gives way to time order (1-2 ns each;
// resnet18's step makes 29k, a 12-layer transformer's 0.6M): about 0.2 s.
inline constexpr std::uint64_t kDefaultFirstFitVisits = std::uint64_t{1} << 27;

struct ArenaPlacement {
  std::vector<std::uint64_t> offsets;  // one per block, in the order given
  std::uint64_t arena_bytes = 0;       // the highest end
  bool first_fit = true;               // greedy by size (true) or time order (visits ran out)
};

// Places every block. Sizes must add up to less than 2^62 (kMaxPlacedBytes, FirstFit.h): the
// callers refuse larger totals before they get here.
ArenaPlacement place_in_arena(std::span<const Lifetime> blocks,
                              std::uint64_t first_fit_visits = kDefaultFirstFitVisits);

// The first pair of blocks (by the order a sweep over first uses meets them) that are live at
// one step and overlap in [offset, offset + bytes), or nullopt when none do. O(B log B).
std::optional<std::pair<std::uint32_t, std::uint32_t>> overlapping_pair(
    std::span<const Lifetime> blocks, std::span<const std::uint64_t> offsets);

// The blocks in order of first use (then index), each handed to start(index); before it, every
// block started earlier whose last use comes before its first use is handed to end(index),
// earliest last use first. start returns false to stop the sweep. O(B log B). Blocks are any
// type with `first` and `last`.
template <class Blocks, class Start, class End>
void sweep_first_uses(const Blocks& blocks, Start start, End end) {
  std::vector<std::uint32_t> order(blocks.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return blocks[a].first < blocks[b].first;
  });
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

}  // namespace crucible::graph
