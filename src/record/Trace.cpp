// Trace.cpp — accessors and append for the in-memory trace.
#include "crucible/record/Trace.h"

#include <bit>
#include <cstdio>
#include <cstring>

#include "crucible/core/Contract.h"
#include "crucible/record/StructureWords.h"

namespace crucible::record {

const char* phase_name(Phase p) noexcept {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "unknown";
}

const char* external_kind_name(ExternalKind k) noexcept {
  switch (k) {
    case ExternalKind::Parameter: return "parameter";
    case ExternalKind::Buffer: return "buffer";
    case ExternalKind::Gradient: return "gradient";
    case ExternalKind::OptimizerState: return "optimizer_state";
    case ExternalKind::Input: return "input";
    case ExternalKind::Constant: return "constant";
  }
  return "unknown";
}

std::string Trace::schema_name(std::uint64_t hash) const {
  auto it = schema_names.find(hash);
  if (it != schema_names.end()) return it->second;
  char buf[48];
  std::snprintf(buf, sizeof buf, "<unknown schema 0x%016llx>", static_cast<unsigned long long>(hash));
  return buf;
}

const std::string& Trace::module_path(std::uint32_t id) const {
  static const std::string kUnknown = "<unknown module>";
  return id < module_paths.size() ? module_paths[id] : kUnknown;
}

std::uint64_t Trace::total_dropped() const {
  std::uint64_t n = 0;
  for (const auto& t : threads) n += t.dropped;
  return n;
}
std::uint64_t Trace::total_ops(Phase p) const {
  std::uint64_t n = 0;
  for (const auto& t : threads) n += t.ops[static_cast<int>(p)];
  return n;
}

void Trace::append(const TraceEntry& e, std::span<const MetaCell> cells,
                   std::span<const ScalarRecord> sc) {
  op_tensor_begin.push_back(tensors.size());
  op_scalar_begin.push_back(scalars.size());
  ops.push_back(e);
  std::size_t c = 0;
  for (std::uint32_t t = 0; t < e.n_tensors; ++t) {
    CRUCIBLE_ASSERT(c < cells.size(), "entry's cell count covers its tensors");
    const TensorMeta& m = cells[c++].meta;
    tensors.push_back(m);
    tensor_dims_begin.push_back(dims.size());
    const std::uint32_t nd = dims_cells(m.ndim);
    CRUCIBLE_ASSERT(c + nd <= cells.size(), "entry's cell count covers its dims");
    // Sizes then strides, 2 * ndim values, filling whole cells of 8 but the last.
    for (std::uint32_t left = 2u * m.ndim, k = 0; left != 0; ++k) {
      const std::uint32_t take = left < 8 ? left : 8;
      dims.insert(dims.end(), cells[c + k].dims.v, cells[c + k].dims.v + take);
      left -= take;
    }
    c += nd;
  }
  scalars.insert(scalars.end(), sc.begin(), sc.end());
}

void Trace::clear() { *this = Trace{}; }

void Trace::clear_keeping_capacity() {
  // Everything is reset to a default Trace, which resets any member added later without a line
  // here, except that the big arrays are swapped into it first and emptied (clear() keeps a
  // vector's memory).
  Trace fresh;
  auto keep = [&](auto Trace::*array) {
    (fresh.*array).swap(this->*array);
    (fresh.*array).clear();
  };
  keep(&Trace::ops);
  keep(&Trace::tensors);
  keep(&Trace::dims);
  keep(&Trace::scalars);
  keep(&Trace::op_tensor_begin);
  keep(&Trace::op_scalar_begin);
  keep(&Trace::tensor_dims_begin);
  *this = std::move(fresh);
}

const ModuleTree& Trace::module_tree_of(std::shared_ptr<const ModuleTree>& own) const {
  if (module_tree != nullptr && module_tree->fits(module_paths)) return *module_tree;
  own = std::make_shared<const ModuleTree>(module_paths);
  return *own;
}

bool Trace::operator==(const Trace& o) const {
  auto bytes_eq = [](const auto& a, const auto& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
  };
  return bytes_eq(ops, o.ops) && bytes_eq(tensors, o.tensors) && dims == o.dims &&
         bytes_eq(scalars, o.scalars) && schema_names == o.schema_names &&
         module_paths == o.module_paths && threads == o.threads && externals == o.externals;
}

ContentHash op_content(const Trace& t, std::size_t op) {
  CRUCIBLE_PRE(op < t.ops.size(), "op index in range");
  ContentHasher h;
  const TraceEntry& e = t.ops[op];
  h.update_words(e.schema_hash, std::uint64_t{e.n_inputs} | std::uint64_t{e.n_tensors} << 32,
                 std::uint64_t{static_cast<std::uint8_t>(e.phase)});
  const std::size_t base = t.op_tensor_begin[op];
  for (std::size_t k = base; k < base + e.n_tensors; ++k) {
    const TensorMeta& m = t.tensors[k];
    const bool wrapped = m.flags & tensor_flag::kWrappedNumber;
    h.update_words(std::uint64_t{static_cast<std::uint8_t>(m.dtype)} | std::uint64_t{m.device_kind} << 8 |
                       std::uint64_t{m.layout} << 16 | std::uint64_t{static_cast<std::uint8_t>(m.device_index)} << 24 |
                       std::uint64_t{wrapped} << 32 | std::uint64_t{m.ndim} << 40,
                   std::uint64_t{m.arg_index} | std::uint64_t{m.list_index} << 32,
                   static_cast<std::uint64_t>(m.storage_offset),
                   wrapped ? std::bit_cast<std::uint64_t>(m.wrapped_value) : std::uint64_t{0});
    // Sizes then strides, contiguous in the trace; ndim above delimits them.
    h.update_i64s({t.dims.data() + t.tensor_dims_begin[k], 2 * static_cast<std::size_t>(m.ndim)});
  }
  for (const ScalarRecord& s : t.scalars_of(op))
    h.update_words(std::uint64_t{static_cast<std::uint8_t>(s.kind)} | std::uint64_t{s.arg_index} << 8 | std::uint64_t{s.aux} << 24,
                   s.bits);
  return h.digest();
}

namespace {
// The pass behind structure_body and number_storages: numbers the ops' storages and, when
// kHash, hashes the structure body.
template <bool kHash>
ContentHash walk_structure(const Trace& t, std::span<const std::size_t> ops, StorageNumbering& out,
                           std::span<const ContentHash> contents, ContentHash* wiring_out) {
  CRUCIBLE_PRE(contents.empty() || contents.size() == ops.size(), "one op_content per op, or none");
  // Storage id -> (number, first version seen): an open-addressed table sized for every
  // tensor of the ops, placed by a seeded hash (Note [Seeded table hash]: a loaded trace's ids
  // can be chosen to collide under any fixed hash). It replaced absl::flat_hash_map here, whose
  // probes were a third of the key's time.
  struct Slot {
    std::uint64_t id;  // 0: empty (storage id 0 means "no storage" and is never looked up)
    std::uint32_t number;
    std::uint32_t first_version;
  };
  std::size_t n_tensors = 0;
  for (const std::size_t op : ops) {
    CRUCIBLE_PRE(op < t.ops.size(), "op index in range");
    n_tensors += t.ops[op].n_tensors;
  }
  unsigned bits = 4;
  while ((std::size_t{1} << bits) < 2 * n_tensors) ++bits;
  std::vector<Slot> table(std::size_t{1} << bits, Slot{0, 0, 0});
  const std::size_t mask = table.size() - 1;
  const std::uint64_t seed = table_seed();
  out.storages.clear();
  out.kinds.clear();
  out.storage.resize(n_tensors);
  out.version.resize(n_tensors);
  std::size_t cursor = 0;
  // Per op: its content (op_content, computed here or given), what the content leaves out of
  // the entry, then each tensor's storage identity, size and flags. Given contents spare reading
  // the dims and scalars again: the drain computes them while the ops are still in cache.
  // Two hashers (Note [Wiring key]): h takes the wiring (everything but the contents), c the
  // contents; the body hashes both digests.
  ContentHasher h, c;
  if constexpr (kHash) h.update_u64(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::size_t op = ops[i];
    const TraceEntry& e = t.ops[op];
    if (i + 4 < ops.size()) __builtin_prefetch(&t.ops[ops[i + 4]]);
    if constexpr (kHash) {
      const ContentHash content = contents.empty() ? op_content(t, op) : contents[i];
      c.update_words(content.lo, content.hi);
      structure_words::hash_op(h, structure_words::op_words(e));
    }
    const std::size_t base = t.op_tensor_begin[op];
    for (std::size_t k = base; k < base + e.n_tensors; ++k, ++cursor) {
      const TensorMeta& m = t.tensors[k];
      if (k + 8 < t.tensors.size()) __builtin_prefetch(&t.tensors[k + 8]);
      std::uint32_t canon = 0, version = 0;
      if (m.storage_id != 0) {
        std::size_t j = static_cast<std::size_t>(table_hash(m.storage_id, seed) >> (64 - bits));
        while (table[j].id != 0 && table[j].id != m.storage_id) j = (j + 1) & mask;
        if (table[j].id == 0) {  // at most n_tensors of 2 * n_tensors slots fill: a probe ends
          out.storages.push_back(m.storage_id);
          table[j] = Slot{m.storage_id, static_cast<std::uint32_t>(out.storages.size()), m.version};
        }
        canon = table[j].number;
        version = m.version - table[j].first_version;  // modular: only equality matters
      }
      out.storage[cursor] = canon;
      out.version[cursor] = version;
      if constexpr (kHash) structure_words::hash_tensor(h, canon, version, m.storage_nbytes, m.flags);
    }
  }
  if constexpr (kHash) {
    const ContentHash wiring = h.digest();
    if (wiring_out != nullptr) *wiring_out = wiring;
    return structure_words::body(wiring, c.digest());
  }
  return ContentHash{};
}
}  // namespace

void classify_storages(const absl::flat_hash_map<std::uint64_t, ExternalKind>& externals, StorageNumbering& n) {
  n.kinds.assign(n.storages.size(), 0);
  if (!externals.empty())
    for (std::size_t i = 0; i < n.storages.size(); ++i)
      if (auto it = externals.find(n.storages[i]); it != externals.end()) n.kinds[i] = static_cast<std::uint8_t>(it->second);
}

ContentHash structure_body(const Trace& t, std::span<const std::size_t> ops,
                           StorageNumbering& numbering, std::span<const ContentHash> contents,
                           ContentHash* wiring) {
  return walk_structure<true>(t, ops, numbering, contents, wiring);
}

StorageNumbering number_storages(const Trace& t, std::span<const std::size_t> ops) {
  StorageNumbering n;
  walk_structure<false>(t, ops, n, {}, nullptr);
  classify_storages(t, n);
  return n;
}

ContentHash structure_key(const ContentHash& body, std::span<const std::uint8_t> kinds) {
  ContentHasher h;
  h.update_hash(body).update_u64(kinds.size()).update_bytes(kinds.data(), kinds.size());
  return h.digest();
}

ContentHash structure_key(const Trace& t, std::span<const std::size_t> ops) {
  StorageNumbering n;
  const ContentHash body = structure_body(t, ops, n);
  classify_storages(t, n);
  return structure_key(body, n.kinds);
}

}  // namespace crucible::record
