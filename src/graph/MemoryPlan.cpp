// MemoryPlan.cpp — lifetimes, greedy-by-size placement, lower bound, budget check.
#include "crucible/graph/MemoryPlan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <queue>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/Contract.h"
#include "crucible/core/ContentHash.h"
#include "crucible/core/OpTable.h"
#include "crucible/graph/ArenaPlacement.h"
#include "crucible/graph/FirstFit.h"

namespace crucible::graph {
namespace {
std::string mib(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

// Note [Elementwise outputs in their input's block] (MemoryPlan.h): the ops whose output may
// take over a dying input's block are those the op table calls elementwise and functional
// (is_elementwise_functional): each output element is a function of the inputs' elements at the
// same position; an input broadcast to the output's shape is never the one taken over (its sizes
// differ from the output's). An in-place op's output already is its input's storage.
//
// The answer for a schema hash is the same in every trace (the hash is hash64 of the name), so
// each thread keeps the answers it has worked out: a plan asks once per node with one output
// (resnet18's step: 500), and a lookup here is a hash probe instead of a name lookup and a
// binary search of the op table. A name that does not hash to its key (a corrupt trace) gets
// no and is not kept; past kMaxKnown schemas (a loaded trace names as many as it likes) the
// answers are forgotten and worked out again.
bool is_elementwise(const record::Trace& t, std::uint64_t schema_hash) {
  constexpr std::size_t kMaxKnown = 4096;
  thread_local absl::flat_hash_map<std::uint64_t, bool> known;
  if (auto it = known.find(schema_hash); it != known.end()) return it->second;
  auto name = t.schema_names.find(schema_hash);
  if (name == t.schema_names.end() || hash64(name->second) != schema_hash) return false;
  const bool yes = is_elementwise_functional(name->second);
  if (known.size() >= kMaxKnown) known.clear();
  known.emplace(schema_hash, yes);
  return yes;
}

// Whether two tensors of a trace lie on their storages alike: the same dtype, sizes, strides,
// and both at offset 0 (so an element of one is at the same bytes as in the other).
bool same_layout(const record::Trace& t, std::size_t a, std::size_t b) {
  const record::TensorMeta &x = t.tensors[a], &y = t.tensors[b];
  constexpr std::uint8_t kOff = record::tensor_flag::kNoStorage | record::tensor_flag::kWrappedNumber;
  if (x.dtype != y.dtype || x.ndim != y.ndim || x.storage_offset != 0 || y.storage_offset != 0 ||
      x.device_kind != y.device_kind || x.device_index != y.device_index || x.layout != y.layout ||
      ((x.flags | y.flags) & kOff) != 0)
    return false;
  const auto xs = t.sizes(a), ys = t.sizes(b), xt = t.strides(a), yt = t.strides(b);
  return std::equal(xs.begin(), xs.end(), ys.begin()) && std::equal(xt.begin(), xt.end(), yt.begin());
}

// The blocks as buffers of memory: a block that shares another's (Block::shares) joins that
// one's buffer, which spans their lifetimes and the larger size. buffer_of[b] indexes the result.
std::vector<Block> buffers_of(const std::vector<Block>& blocks, std::vector<std::uint32_t>& buffer_of) {
  std::vector<Block> out;
  buffer_of.assign(blocks.size(), 0);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    if (b.shares == kOwnBlock) {
      buffer_of[i] = static_cast<std::uint32_t>(out.size());
      out.push_back(b);
      continue;
    }
    Block& buf = out[buffer_of[i] = buffer_of[b.shares]];  // shares < i (checked by the callers)
    buf.last = std::max(buf.last, b.last);
    buf.bytes = std::max(buf.bytes, b.bytes);
  }
  return out;
}

// Note [Elementwise outputs in their input's block]: which blocks take over a dying input's
// block, given every block's lifetime and size (block_of: a storage number's block, or a value
// >= kPersistentBlock for a storage outside the arena). Sets shares[i] (what Block::shares of
// block i is to be; kOwnBlock for the rest), returns how many share. A host's last use is one
// node, whose op has one output: at most one block takes it over.
constexpr std::uint32_t kPersistentBlock = UINT32_MAX - 1;
std::uint32_t assign_shares(const record::Trace& t, const TraceGraph& g, const std::vector<Block>& blocks,
                            const std::vector<std::uint32_t>& block_of, std::vector<std::uint32_t>& shares) {
  shares.assign(blocks.size(), kOwnBlock);
  const record::StorageNumbering& num = g.numbering();
  const auto n = static_cast<std::uint32_t>(g.num_nodes());
  std::uint32_t shared = 0;
  const std::uint32_t* number = num.storage.data();
  for (std::uint32_t node = 0; node < n; ++node) {
    const std::size_t op = g.trace_op(node);
    const std::size_t nin = t.ops[op].n_inputs, nout = t.ops[op].n_tensors - nin;
    const std::uint32_t* here = number;
    number += nin + nout;
    if (nout != 1 || !is_elementwise(t, t.ops[op].schema_hash)) continue;
    const std::uint32_t so = here[nin];
    if (so == 0 || block_of[so] >= kPersistentBlock || blocks[block_of[so]].first != node) continue;
    const std::size_t t0 = t.op_tensor_begin[op];
    for (std::size_t k = 0; k < nin; ++k) {
      const std::uint32_t si = here[k];
      if (si == 0 || si == so || block_of[si] >= kPersistentBlock) continue;
      if (blocks[block_of[si]].last != node || !same_layout(t, t0 + k, t0 + nin)) continue;
      // The same bytes for both (a buffer spans the larger block), and no other input reading
      // the host's storage through another layout (add(x, x.t()), a shifted slice): that
      // input would read elements already overwritten.
      if (blocks[block_of[si]].bytes != blocks[block_of[so]].bytes) continue;
      bool other_view = false;
      for (std::size_t k2 = 0; k2 < nin; ++k2)
        other_view |= k2 != k && here[k2] == si && !same_layout(t, t0 + k2, t0 + nin);
      if (other_view) continue;
      shares[block_of[so]] = block_of[si];
      ++shared;
      break;
    }
  }
  return shared;
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
  constexpr std::uint32_t kUnseen = UINT32_MAX, kPersistent = kPersistentBlock;
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
  // Note [Elementwise outputs in their input's block]: the second pass, once every lifetime is
  // known.
  if (opt.share_elementwise) {
    std::vector<std::uint32_t> shares;
    plan.shared_blocks = assign_shares(t, g, plan.blocks, block_of, shares);
    for (std::size_t i = 0; i < plan.blocks.size(); ++i) plan.blocks[i].shares = shares[i];
  }
  // Lower bound, placement and budget work on buffers: the blocks themselves unless some share.
  std::vector<std::uint32_t> buffer_of;
  std::vector<Block> merged;
  if (plan.shared_blocks != 0) merged = buffers_of(plan.blocks, buffer_of);
  std::vector<Block>& bufs = plan.shared_blocks != 0 ? merged : plan.blocks;
  // Lower bound by a sweep: +bytes at first, -bytes after last.
  std::vector<std::int64_t> delta(n + 1, 0);
  for (const Block& b : bufs) {
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
  // Greedy by size, or time order past opt.first_fit_visits (ArenaPlacement.h).
  {
    std::vector<Lifetime> lifetimes(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) lifetimes[i] = {bufs[i].bytes, bufs[i].first, bufs[i].last};
    const ArenaPlacement placed = place_in_arena(lifetimes, opt.first_fit_visits);
    for (std::size_t i = 0; i < bufs.size(); ++i) bufs[i].offset = placed.offsets[i];
    plan.arena_bytes = placed.arena_bytes;
    plan.first_fit = placed.first_fit;
  }
  if (plan.shared_blocks != 0)
    for (std::size_t i = 0; i < plan.blocks.size(); ++i) plan.blocks[i].offset = bufs[buffer_of[i]].offset;
  if (opt.budget != 0 && plan.persistent_bytes + plan.arena_bytes > opt.budget) {
    // Per buffer live at the peak, the tensor that holds it there: with shares, the latest of
    // its chain to have started by then (its host is last used where it starts), named by its
    // own producer, with the buffer's bytes (never 0: a block has at least the alignment, so
    // bytes 0 marks a buffer not live there).
    struct Live {
      std::uint64_t bytes = 0;
      std::uint32_t producer = 0;
      std::uint32_t first = 0;
    };
    std::vector<Live> holder(bufs.size());
    for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
      const Block& b = plan.blocks[i];
      if (b.first > plan.peak_node || plan.peak_node > b.last) continue;
      const std::size_t at = plan.shared_blocks != 0 ? buffer_of[i] : i;
      if (holder[at].bytes == 0 || b.first >= holder[at].first) holder[at] = Live{bufs[at].bytes, b.producer, b.first};
    }
    std::vector<const Live*> at_peak;
    for (const Live& h : holder)
      if (h.bytes != 0) at_peak.push_back(&h);
    std::sort(at_peak.begin(), at_peak.end(), [](const Live* a, const Live* b) { return a->bytes > b->bytes; });
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

bool shares_hold(const MemoryPlan& p, const record::Trace& t, const TraceGraph& g) {
  const record::StorageNumbering& num = g.numbering();
  std::vector<std::uint32_t> block_of(num.num_storages() + 1, kPersistentBlock);
  for (std::size_t i = 0; i < p.blocks.size(); ++i) {
    const std::uint32_t s = p.blocks[i].storage_number;
    if (s == 0 || s > num.num_storages()) return false;  // not a plan of this graph's wiring
    block_of[s] = static_cast<std::uint32_t>(i);
  }
  // The shares these ops would make, beside the plan's blocks (whose lifetimes and sizes they
  // are computed from): no copy of the blocks.
  std::vector<std::uint32_t> shares;
  if (assign_shares(t, g, p.blocks, block_of, shares) != p.shared_blocks) return false;
  for (std::size_t i = 0; i < p.blocks.size(); ++i)
    if (shares[i] != p.blocks[i].shares) return false;
  return true;
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
  for (const Block& a : p.blocks)
    if (a.offset > p.arena_bytes || a.bytes > p.arena_bytes - a.offset)
      return invalid_input("block of storage " + std::to_string(a.storage_id) + " ends past the arena",
                           "this is a planner bug: report it with the trace");
  // Blocks that share memory (Block::shares): each takes over an earlier block, at its offset,
  // where that one is last used, and no block is taken over twice. Then their buffers are what
  // must not overlap.
  std::vector<std::uint8_t> taken(p.blocks.size(), 0);
  bool any_shared = false;
  for (std::size_t i = 0; i < p.blocks.size(); ++i) {
    const Block& b = p.blocks[i];
    if (b.shares == kOwnBlock) continue;
    any_shared = true;
    if (b.shares >= i || p.blocks[b.shares].offset != b.offset || p.blocks[b.shares].last != b.first ||
        taken[b.shares]++ != 0)
      return invalid_input("block of storage " + std::to_string(b.storage_id) +
                               " shares memory with a block it cannot take over (not an earlier one, "
                               "not at its offset, not where it is last used, or taken twice)",
                           "this is a planner bug: report it with the trace");
  }
  std::vector<std::uint32_t> buffer_of;
  std::vector<Block> merged;
  if (any_shared) merged = buffers_of(p.blocks, buffer_of);
  const std::vector<Block>& bl = any_shared ? merged : p.blocks;
  for (const Block& a : bl)
    if (a.bytes > p.arena_bytes - a.offset)
      return invalid_input("the buffer of storage " + std::to_string(a.storage_id) + " ends past the arena",
                           "this is a planner bug: report it with the trace");
  std::vector<Lifetime> lifetimes(bl.size());
  std::vector<std::uint64_t> offsets(bl.size());
  for (std::size_t i = 0; i < bl.size(); ++i) {
    lifetimes[i] = {bl[i].bytes, bl[i].first, bl[i].last};
    offsets[i] = bl[i].offset;
  }
  const auto pair = overlapping_pair(lifetimes, offsets);
  const bool found = pair.has_value();
  const std::uint32_t first = found ? pair->first : 0, second = found ? pair->second : 0;
  if (found) {
    // A buffer is named by every storage in it: its first block's, and those of the blocks that
    // take it over (the block at fault may be any of them).
    auto name = [&](std::uint32_t buf) {
      if (!any_shared) return "storage " + std::to_string(bl[buf].storage_id);
      std::string ids;
      int n = 0;
      for (std::size_t i = 0; i < p.blocks.size(); ++i)
        if (buffer_of[i] == buf) ids += (n++ == 0 ? "" : ", ") + std::to_string(p.blocks[i].storage_id);
      return (n == 1 ? "storage " : "storages ") + ids;
    };
    return invalid_input("blocks of " + name(first) + " and of " + name(second) + " are live together and overlap",
                         "this is a planner bug: report it with the trace");
  }
  return ok_status();
}

}  // namespace crucible::graph
