// FirstFit.h — the memory plan's inner scan: the lowest offset where a block fits among the
// blocks placed so far, which are kept sorted by offset.
//
// Walking the placed blocks in offset order, a block whose lifetime overlaps the new one's
// pushes the candidate offset past its end; the first placed block that starts at or past
// offset + bytes ends the walk, since every later one starts later still. The walk carries the
// candidate offset from block to block (a running maximum). first_fit takes four blocks per
// step on a CPU with AVX2 (chosen at run time): the running maximum of the four overlapping
// ends is computed apart from the carried offset, which then costs one maximum per four blocks.
// On resnet18's step (241 blocks, 16k visits; warm, alternating runs of one harness) the plan
// took 40.9 us with the scalar walk and 38.0 with this one; eight blocks per step took 38.9:
// the carried maximum is not all of the cost (a mispredicted exit and an insertion per block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crucible::graph {

// Sizes, offsets and ends stay below this (plan_memory refuses larger totals), so that they
// compare as signed 64-bit lanes and offset + bytes cannot wrap.
inline constexpr std::uint64_t kMaxPlacedBytes = std::uint64_t{1} << 62;

// The placed blocks as structure of arrays, sorted by offset.
struct PlacedBlocks {
  std::vector<std::uint64_t> offset, end;  // end = offset + bytes
  std::vector<std::uint32_t> first, last;  // lifetime: the nodes of first and last use

  std::size_t size() const { return offset.size(); }
  void reserve(std::size_t n);
  // Inserts at index `at` (keeping offset order is the caller's part).
  void insert(std::size_t at, std::uint64_t off, std::uint64_t block_end, std::uint32_t first_use,
              std::uint32_t last_use);
};

struct Fit {
  std::uint64_t offset;  // where the block goes
  std::size_t seen;      // placed blocks walked: those that start below offset + bytes
};

// The lowest offset for a block of `bytes` live over [first_use, last_use]. The same answer as
// first_fit_scalar, four blocks at a time when first_fit_is_vector().
Fit first_fit(const PlacedBlocks& placed, std::uint64_t bytes, std::uint32_t first_use,
              std::uint32_t last_use);
// One block at a time: the reference the vector scan is tested against.
Fit first_fit_scalar(const PlacedBlocks& placed, std::uint64_t bytes, std::uint32_t first_use,
                     std::uint32_t last_use, std::size_t from = 0, std::uint64_t off = 0);
// Whether first_fit walks four blocks per step here (an x86-64 CPU with AVX2).
bool first_fit_is_vector();

}  // namespace crucible::graph
