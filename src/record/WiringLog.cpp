// WiringLog.cpp — Note [Wiring log] in WiringLog.h.
#include "crucible/record/WiringLog.h"

#include <cstring>
#include <utility>

#include "crucible/core/Contract.h"

namespace crucible::record {

WiringLog::WiringLog(std::size_t window) : window_(window) {
  CRUCIBLE_PRE(window >= 1 && window <= kMaxBack / 2,
               "a window whose distances (< 2 windows) fit in 24 bits");
}

void WiringLog::clear() {
  ops_.clear();
  tensors_.clear();
  if (cur_) {  // the tables stay: zeroed, not freed and allocated again
    std::memset(cur_.get(), 0, sizeof(Slot) << bits_);
    std::memset(old_.get(), 0, sizeof(Slot) << bits_);
  }
  gen_start_ = 0;
  max_id_ = 0;
}

std::size_t WiringLog::probe(const Slot* table, std::uint64_t id) const {
  const std::size_t mask = (std::size_t{1} << bits_) - 1;
  // Runs of 64 consecutive ids take 64 consecutive slots (the Vessel numbers storages in
  // sequence, and a new storage then lands next to the last one, in a cache line the drain
  // just wrote), and the runs are spread by a seeded hash of the id's upper bits (ids that are
  // aligned pointers, as a C host may pass, differ there; Note [Seeded table hash]: a host
  // cannot choose ids that pile into one run beyond the 64 that share upper bits).
  const std::size_t j0 = static_cast<std::size_t>(table_hash(id >> 6, seed_) >> (64 - bits_ + 6))
                         << 6;
  std::size_t j = (j0 | (id & 63)) & mask;
  while (table[j].id != 0 && table[j].id != id)
    j = (j + 1) & mask;  // at most half the slots are taken
  return j;
}

void WiringLog::append(const Trace& t, std::size_t op) {
  CRUCIBLE_PRE(op == ops_.size() && op < t.ops.size(),
               "ops are appended in order, after the trace's");
  const TraceEntry& e = t.ops[op];
  ops_.push_back(structure_words::op_words(e));  // what walk_structure (Trace.cpp) hashes per op
  const std::size_t base = t.op_tensor_begin[op];
  CRUCIBLE_ASSERT(base == tensors_.size(), "the log's tensors follow the trace's");
  if (!cur_) {
    bits_ = 7;  // at least two runs of 64
    while ((std::size_t{1} << bits_) < 2 * window_) ++bits_;
    cur_.reset(new Slot[std::size_t{1} << bits_]());
    old_.reset(new Slot[std::size_t{1} << bits_]());
  }
  for (std::size_t k = base; k < base + e.n_tensors; ++k) {
    const TensorMeta& m = t.tensors[k];
    // A new generation: every use of the last window stays findable.
    if (k >= gen_start_ + window_) {
      std::swap(cur_, old_);
      std::memset(cur_.get(), 0, sizeof(Slot) << bits_);
      gen_start_ = k;
    }
    std::uint64_t back = 0;
    if (m.storage_id != 0) {
      Slot& s = cur_[probe(cur_.get(), m.storage_id)];
      if (s.id == m.storage_id) {
        back = k - s.index;
      } else {
        // An id above every id appended so far is new: no table holds it (the Vessel's ids grow).
        if (m.storage_id <= max_id_) {
          const Slot& o = old_[probe(old_.get(), m.storage_id)];
          if (o.id == m.storage_id) back = k - o.index;
        } else {
          max_id_ = m.storage_id;
        }
        s.id = m.storage_id;  // at most one new entry per tensor of the window: half the slots
      }
      s.index = k;
      // Found uses are less than two windows back, so they fit; a farther one is not found.
      CRUCIBLE_ASSERT(back <= kMaxBack, "a found use lies within two windows");
    }
    tensors_.push_back(TensorWords{m.storage_id, m.storage_nbytes, m.version,
                                   static_cast<std::uint32_t>(back) << 8 | m.flags});
  }
}

bool WiringLog::structure_body(const Trace& t, std::size_t first, std::size_t n,
                               StorageNumbering& out, std::span<const ContentHash> contents,
                               ContentHash& body, ContentHash* wiring_out) const {
  CRUCIBLE_PRE(contents.empty() || contents.size() == n, "one op_content per op, or none");
  if (n == 0 || first > ops_.size() || n > ops_.size() - first) return false;
  const std::size_t tbegin = t.op_tensor_begin[first];
  const std::size_t last = first + n - 1;
  const std::size_t tend = t.op_tensor_begin[last] + t.ops[last].n_tensors;
  const std::size_t n_tensors = tend - tbegin;
  if (n_tensors > window_) return false;  // a previous use inside the ops may have been forgotten
  CRUCIBLE_ASSERT(tend <= tensors_.size(), "the log holds the ops' tensors");
  out.storages.clear();
  out.kinds.clear();
  out.storage.resize(n_tensors);
  out.version.resize(n_tensors);
  thread_local std::vector<std::uint32_t> first_version;  // [number - 1]: version at first touch
  first_version.clear();
  // The same words, in the same order, as walk_structure<true> in Trace.cpp (StructureWords.h).
  ContentHasher h, c;
  h.update_u64(n);
  std::size_t cursor = 0;
  const TensorWords* tw = tensors_.data() + tbegin;
  for (std::size_t i = 0; i < n; ++i) {
    const OpWords& o = ops_[first + i];
    const ContentHash content = contents.empty() ? op_content(t, first + i) : contents[i];
    c.update_words(content.lo, content.hi);
    structure_words::hash_op(h, o);
    const std::size_t end = cursor + o.n_tensors();
    for (; cursor < end; ++cursor) {
      const TensorWords& w = tw[cursor];
      std::uint32_t canon = 0, version = 0;
      if (w.storage_id != 0) {
        const std::size_t back = w.back_flags >> 8;
        if (back != 0 && back <= cursor) {  // used before, inside these ops
          canon = out.storage[cursor - back];
          version = w.version - first_version[canon - 1];  // modular: only equality matters
        } else {
          out.storages.push_back(w.storage_id);
          first_version.push_back(w.version);
          canon = static_cast<std::uint32_t>(out.storages.size());
        }
      }
      out.storage[cursor] = canon;
      out.version[cursor] = version;
      structure_words::hash_tensor(h, canon, version, w.storage_nbytes,
                                   static_cast<std::uint8_t>(w.back_flags & 0xFFu));
    }
  }
  CRUCIBLE_ASSERT(cursor == n_tensors, "the ops' tensor counts cover their range");
  const ContentHash wiring = h.digest();
  if (wiring_out != nullptr) *wiring_out = wiring;
  body = structure_words::body(wiring, c.digest());
  return true;
}

}  // namespace crucible::record
