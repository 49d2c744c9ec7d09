// StructureWords.h — internal to the record library (no API): the words a structure key hashes per op
// and per tensor (Note [Wiring key], Trace.h), shared by the trace's own pass
// (walk_structure, Trace.cpp) and the drain's wiring log (WiringLog.cpp), whose keys must be
// equal for the same ops.
#pragma once

#include <cstdint>

#include "crucible/core/ContentHash.h"
#include "crucible/record/TraceRecord.h"

namespace crucible::record::structure_words {

// An op's entry as the wiring hashes it: schema, then input and tensor counts, then module,
// argument count, flags and phase.
struct OpWords {
  std::uint64_t schema_hash, counts, misc;
  std::uint32_t n_tensors() const { return static_cast<std::uint32_t>(counts >> 32); }
};
inline OpWords op_words(const TraceEntry& e) {
  return OpWords{e.schema_hash, std::uint64_t{e.n_inputs} | std::uint64_t{e.n_tensors} << 32,
                 e.module_id | std::uint64_t{e.n_args} << 32 | std::uint64_t{e.flags} << 48 |
                     std::uint64_t{static_cast<std::uint8_t>(e.phase)} << 56};
}
inline void hash_op(ContentHasher& wiring, const OpWords& o) { wiring.update_words(o.schema_hash, o.counts, o.misc); }

// A tensor as the wiring hashes it: its storage's number in the ops (0: none) and its version
// relative to the storage's first, its storage's bytes, and its flags.
inline void hash_tensor(ContentHasher& wiring, std::uint32_t number, std::uint32_t version,
                        std::uint64_t storage_nbytes, std::uint8_t flags) {
  wiring.update_words(number | std::uint64_t{version} << 32, storage_nbytes, std::uint64_t{flags});
}

// The structure body: the wiring's digest, then the contents' (each op's op_content in order).
inline ContentHash body(const ContentHash& wiring, const ContentHash& contents) {
  ContentHasher b;
  b.update_hash(wiring).update_hash(contents);
  return b.digest();
}

}  // namespace crucible::record::structure_words
