// AllocationTags.h — internal to libcrucible_dispatch.so: storage ids carried by the memory
// they name.
//
// Note [Allocation tags]: a storage id must name one storage for the whole recording, though
// the caching allocator reuses data addresses and malloc reuses StorageImpl addresses. The
// table in Capture.h (StorageIds) keeps a weak reference to every StorageImpl it named, so its
// address cannot be reused while the entry lives; that lifecycle (an atomic count per new
// storage, a sweep per 256, a global mutex) was the largest single cost of recording a step
// whose ops each make a new storage. While any thread records, the CPU allocator wrapper
// (ReplayArena.cpp; installed on the first enable, or by crucible.compile) asks its base for
// n + 128 bytes for every non-empty block it hands out and puts a 64-byte header just before
// the data: a fresh id, the base allocator's own deleter and context, and a check word. The
// block's deleter is tagged_delete, so a CPU storage's id is read from its DataPtr with no
// lookup, lock or reference: the id lives exactly as long as the memory, and memory reused
// later is a new block with a new header. Storages whose memory is not tagged (allocated
// while no thread recorded, empty, from another allocator, during a compiled plan's run or an
// allocation measurement, or on another device) keep the table.
//
// raw_allocate needs a block's data pointer to be its context, and its raw_deallocate comes
// to the current allocator's raw deleter with that pointer only (ideep's scratch memory does
// this). So a header sits in the same page as its data (the data starts at least 64 bytes
// into a page), and its check word is the data address xor a random per-process key: the raw
// deleter reads the 64 bytes before any pointer at that distance from its page start (mapped
// memory, whatever allocator made it) and frees the block as tagged only when the check
// matches. Blocks are tagged only while the wrapper is PyTorch's current allocator; a raw
// block tagged before another library replaced it and freed raw after would reach that
// library's deleter (not detected).
//
// Ids follow memory, not StorageImpls. An op that gives a storage new memory (resize_ past
// its capacity, an out= argument resized) records its output under the new block's id, so the
// dataflow stays explained. Memory replaced outside the dispatcher is not seen: a Python
// storage resize_, share_memory_(), PyTorch 2.x copy-on-write, a tool that swaps the deleter.
// Later reads of that storage then look like a new external input, and storage_id() after
// the change differs from the ids recorded before it.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace crucible::vessel::detail {

struct TagHeader {
  std::uint64_t check;        // a per-process random key ^ the data address
  std::uint64_t id;           // the storage id of every storage this memory backs
  c10::DeleterFnPtr deleter;  // the base block's deleter and context
  void* ctx;
  unsigned char pad[32];
};
static_assert(sizeof(TagHeader) == 64, "the header keeps the data 64-byte aligned");

void tagged_delete(void* data);  // the deleter of every tagged block

// The id a tagged block carries, or 0 for any other block (a cleared DataPtr keeps its
// deleter but loses its context).
inline std::uint64_t tag_of(const c10::DataPtr& dp) {
  if (dp.get_deleter() != &tagged_delete || dp.get_context() == nullptr) return 0;
  return reinterpret_cast<const TagHeader*>(static_cast<const char*>(dp.get_context()) -
                                            sizeof(TagHeader))
      ->id;
}

// n bytes from base, tagged; the data pointer is the context (raw_allocate accepts it).
c10::DataPtr tagged_allocate(c10::Allocator& base, std::size_t n);
// A raw free: frees `data` and returns true if it is a tagged block's data pointer.
bool free_if_tagged(void* data);
std::uint64_t tagged_raw_frees();  // how many free_if_tagged freed (tests)

// True while at least one thread records (tag new blocks).
bool tagging();
// Counted per recording thread: the first acquire installs the wrapper (once per process).
void tagging_acquire();
void tagging_release();
// In a forked child (its fork handler): the forking thread stops recording (Note [Forked
// children], Dispatch.cpp).
void stop_recording_in_forked_child();
// "" while the wrapper is installed; else why storages are named by the table alone.
std::string tagging_unavailable();

// A fresh storage id; tagged blocks and the table draw from the same sequence.
std::uint64_t fresh_storage_id();

}  // namespace crucible::vessel::detail
