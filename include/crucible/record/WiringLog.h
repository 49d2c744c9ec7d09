// WiringLog.h — what the structure key reads of each op, kept compact and linked as the ops
// are appended, so that the key of a recorded iteration is computed without reading the trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "crucible/core/ContentHash.h"
#include "crucible/record/StructureWords.h"
#include "crucible/record/Trace.h"

namespace crucible::record {

// Note [Wiring log]
// The pipeline's build stage computes the structure key of every detected iteration (Note
// [Structure key] in Trace.h); in a training loop the key matches the last one and that pass
// is all the stage does. By then the ops were recorded a whole step ago, and the step's own
// tensors have evicted them: the pass read 64 bytes of TraceEntry per op and 64 of TensorMeta
// per tensor from memory, and zeroed and probed a table of twice as many slots as tensors to
// number the storages. For resnet18 (504 ops, 1.5k tensors) that was about 80 us with empty
// caches, against 21 with warm ones.
//
// The drain appends each op to this log right after the trace, while the op is in cache:
//   * per op, the three words of the entry that the pass hashes (24 bytes);
//   * per tensor, its storage id, storage bytes, version, flags, and the distance back to the
//     previous tensor of the whole trace with the same storage id (24 bytes).
// With the distance the pass numbers storages without a table: a tensor whose previous use
// lies inside the ops being keyed takes that use's number, any other starts a new one. The
// distances come from two open-addressed tables of storage id -> last tensor index, one per
// generation of window() tensors (kDefaultWindow = 2^16; the current generation and the one
// before it), each of twice as many slots as a generation has tensors, so a probe always
// ends: a use less than window() tensors back is always found, one further back may be forgotten (the distance is then 0), and the
// tables hold only the storages of the last two windows, whatever the run's length. When a
// generation ends the older table is zeroed and becomes the current one: the tables are
// allocated once (2 x 2 MiB, at the first append), never grown, and clear() zeroes them. The
// per-op and per-tensor words grow with the trace, as its own arrays do (about a third more
// memory than the trace's op and tensor records). absl::flat_hash_map in their
// place, cleared at each turn, cost 35 % of the drain's throughput (growing, and page faults).
// So the log's pass applies to a run of consecutive ops of at most window() tensors, which is
// what the pipeline keys (one thread's iteration, while no other thread records in between,
// when its tensors fit in the window: a resnet18 step has about 1.7k); anything else takes the trace's own pass (the recorder counts how often:
// Recorder::keys_from_trace). Both hash the same words in the same order:
// structure_body gives the same body, wiring body and numbering (property test
// WiringLog.KeyEqualsTheTracesOverRandomRuns).
class WiringLog {
 public:
  static constexpr std::size_t kDefaultWindow = std::size_t{1} << 16;
  // window: tensors per generation of the storage map (tests use small ones to exercise it).
  explicit WiringLog(std::size_t window = kDefaultWindow);

  // Appends op `op` of t, which must be the next op (op == num_ops()).
  void append(const Trace& t, std::size_t op);
  void clear();
  std::size_t num_ops() const { return ops_.size(); }
  std::size_t window() const { return window_; }

  // structure_body(t, ops first .. first + n - 1, numbering, contents, wiring) from the log,
  // when those ops are in it and their tensors number at most window(); otherwise false, and
  // nothing is written. t is the trace the log was appended from (read for two tensor offsets,
  // and for the contents when none are given).
  bool structure_body(const Trace& t, std::size_t first, std::size_t n, StorageNumbering& numbering,
                      std::span<const ContentHash> contents, ContentHash& body,
                      ContentHash* wiring) const;

 private:
  using OpWords = structure_words::OpWords;  // the entry's words the structure key hashes
  struct TensorWords {
    std::uint64_t storage_id, storage_nbytes;
    std::uint32_t version;
    std::uint32_t back_flags;  // distance back to the previous use (0: none found) << 8 | flags
  };
  static_assert(sizeof(TensorWords) == 24);
  static constexpr std::uint32_t kMaxBack = (std::uint32_t{1} << 24) - 1;

  std::size_t window_;
  Trace::Array<OpWords> ops_;
  Trace::Array<TensorWords> tensors_;
  struct Slot {
    std::uint64_t id;     // 0: empty (storage id 0 is never looked up)
    std::uint64_t index;  // the storage's last tensor
  };
  // cur_ covers tensors since gen_start_, old_ the window before; bits_: log2 of their slots.
  std::unique_ptr<Slot[]> cur_, old_;
  unsigned bits_ = 0;
  std::uint64_t gen_start_ = 0;
  std::uint64_t max_id_ = 0;  // the largest storage id appended since clear()
  std::uint64_t seed_ = table_seed();
  std::size_t probe(const Slot* table, std::uint64_t id) const;
};

}  // namespace crucible::record
