// MemoryPlan.h — static offsets for every intermediate tensor of an iteration, in one arena.
//
// A block is one storage produced inside the graph (views and in-place ops of a storage share
// its block: they are the same storage id). Persistent storages — anything the graph reads
// before producing it (parameters, gradients, optimizer state, batch inputs) or that the trace
// classifies as external (as the graph's storage numbering recorded it when the graph was
// built) — live outside the arena. Lifetimes run from the first node that
// produces a storage to the last node that touches it.
//
// Placement: blocks by decreasing size, each at the lowest aligned offset that overlaps no
// already placed block whose lifetime intersects its own (greedy by size; the live set at each
// node comes from a sweep over the nodes). Each block looks at or moves (inserting itself in
// offset order) every block placed before it, so its cost grows with the square of the blocks,
// which a loaded trace can make as many as it likes: past a number of such visits
// (PlanOptions::first_fit_visits: about 0.2 s, some 16k blocks) the plan is made again in time
// order instead, each block at the best fitting free chunk when it is first produced and freed
// after its last use (O(B log B)), and the plan says so (MemoryPlan::first_fit). The lower bound is
// the largest total of bytes live at one node; arena / lower bound is reported. A budget turns an over-size plan into an error
// that lists what is live at the peak — before anything runs.
//
// Note [Elementwise outputs in their input's block]: an elementwise op (relu,
// threshold_backward, add, mul, clone, ...: is_elementwise_functional in core/OpTable.h) whose
// output has the same dtype, sizes, strides and offset as an input that no later node touches
// writes its output into that input's block: each element is read before the same element is written, which is how
// such a kernel runs in place. The output keeps its own Block (Block::shares names the input's)
// at the same offset, and the two are one buffer from the input's first use to the output's last;
// the lower bound counts that buffer once. A runtime following the plan runs such an op in place;
// eager PyTorch cannot, which is how a plan gets below eager's peak. PlanOptions::share_elementwise
// turns it off (the plan is then the blocks' own lifetimes, as before 2026-12-02).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/graph/ArenaPlacement.h"
#include "crucible/graph/TraceGraph.h"

namespace crucible::graph {

struct PlanOptions {
  std::uint64_t alignment = 64;  // bytes, power of two
  std::uint64_t budget = 0;      // device bytes for persistent state + arena; 0 = no check
  // Greedy-by-size placement gives way to time-order placement past this many visits of placed
  // blocks (ArenaPlacement.h).
  std::uint64_t first_fit_visits = kDefaultFirstFitVisits;
  // Note [Elementwise outputs in their input's block].
  bool share_elementwise = true;
};

inline constexpr std::uint32_t kOwnBlock = UINT32_MAX;  // Block::shares of a block with its own memory

struct Block {
  std::uint64_t storage_id = 0;
  std::uint64_t bytes = 0;       // aligned size
  std::uint32_t first = 0, last = 0;  // node lifetime, inclusive
  std::uint64_t offset = 0;
  std::uint32_t producer = 0;    // node that first produced it
  std::uint32_t storage_number = 0;  // in the graph's numbering (record::StorageNumbering)
  // kOwnBlock, or the index in MemoryPlan::blocks of the block whose memory this one takes over at
  // its first node, where that one is last used (Note [Elementwise outputs in their input's
  // block]): the same offset, never more bytes than the buffer they share.
  std::uint32_t shares = kOwnBlock;
};

struct MemoryPlan {
  std::vector<Block> blocks;
  std::uint64_t arena_bytes = 0;
  std::uint64_t lower_bound = 0;     // max over nodes of live bytes (a shared buffer counted once)
  std::uint32_t peak_node = 0;       // where the lower bound is reached
  std::uint64_t persistent_bytes = 0;
  // Greedy by size (true), or time order after greedy by size passed opt.first_fit_visits.
  bool first_fit = true;
  std::uint32_t shared_blocks = 0;   // blocks placed in their input's block (Block::shares)
  double ratio() const { return lower_bound == 0 ? 1.0 : static_cast<double>(arena_bytes) / lower_bound; }
};

// Whether plan_memory accepts the options: an alignment that is a power of two up to 2^30.
Status check_plan_options(const PlanOptions& opt);

Result<MemoryPlan> plan_memory(const record::Trace& t, const TraceGraph& g, const PlanOptions& opt = {});

// The plan of other ops with the same wiring key (Note [Wiring key], Trace.h): the same
// blocks, offsets and sizes, with storage ids from their numbering (the graph's, rebased).
MemoryPlan rebased_plan(const MemoryPlan& p, const record::StorageNumbering& numbering);
// Whether a plan made with shares (PlanOptions::share_elementwise) for ops of the same wiring
// as g's (Note [Wiring key], Trace.h: the same lifetimes and block sizes) makes exactly the
// shares plan_memory would make for t and g: shares also depend on the layouts of the ops'
// tensors, which the wiring key leaves out. When it does, rebased_plan(p, g.numbering()) is
// the plan plan_memory(t, g) would make with the options p was made with.
bool shares_hold(const MemoryPlan& p, const record::Trace& t, const TraceGraph& g);

// The property every plan must have: no two blocks with intersecting lifetimes overlap in the
// arena, and every block lies inside it; a block that shares another's memory (Block::shares)
// is at that one's offset, first used where that one is last used, and overlaps nothing else
// (the buffers they make are checked as one). An error names an offending pair. O(B log B). Where
// contracts are enforced (every test preset but release), plan_memory checks it on every plan
// it returns.
Status check_plan(const MemoryPlan& p);

}  // namespace crucible::graph
