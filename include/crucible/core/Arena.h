// Arena.h — bump allocator with bulk free.
//
// Allocation is a pointer bump inside the current block (a few ns, no locking, no per-object
// header). Memory is returned all at once: reset() keeps the first block for reuse, the
// destructor frees everything. Objects placed here must be trivially destructible, or their
// owner must run destructors before reset(): the arena never calls them.
//
// Threading: an Arena belongs to one thread at a time; it has no internal synchronisation.
// Blocks are `block_bytes` (default 64 KiB); a request larger than a block gets a block of its
// own, so no request is ever refused for size short of overflow or the OS saying no.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "crucible/core/Contract.h"

namespace crucible {

class Arena {
 public:
  static constexpr std::size_t kDefaultBlockBytes = 64 * 1024;

  explicit Arena(std::size_t block_bytes = kDefaultBlockBytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;

  // `bytes` bytes aligned to `align` (a power of two <= 4096). Never returns null: on
  // exhaustion it throws std::bad_alloc like operator new. bytes == 0 returns a valid,
  // unique-enough pointer that must not be dereferenced.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t align = alignof(std::max_align_t));

  // Uninitialised storage for n objects of T (trivially destructible types only).
  template <class T>
  [[nodiscard]] T* allocate_array(std::size_t n) {
    static_assert(std::is_trivially_destructible_v<T>, "the arena never runs destructors");
    CRUCIBLE_PRE(n <= SIZE_MAX / sizeof(T), "array byte size overflows size_t");
    return static_cast<T*>(allocate(n * sizeof(T), alignof(T)));
  }

  // Constructs one T in the arena.
  template <class T, class... Args>
  [[nodiscard]] T* make(Args&&... args) {
    static_assert(std::is_trivially_destructible_v<T>, "the arena never runs destructors");
    return new (allocate(sizeof(T), alignof(T))) T(static_cast<Args&&>(args)...);
  }

  // Frees every allocation at once; keeps one block so a steady-state reuse allocates nothing.
  void reset() noexcept;

  std::size_t bytes_allocated() const noexcept { return bytes_allocated_; }  // sum of requests
  std::size_t bytes_reserved() const noexcept { return bytes_reserved_; }    // sum of block sizes
  std::size_t block_count() const noexcept { return block_count_; }

 private:
  struct Block;
  void* allocate_slow(std::size_t bytes, std::size_t align);
  void release_all(Block* keep) noexcept;

  std::size_t block_bytes_;
  Block* head_ = nullptr;  // newest block; blocks form a singly linked list
  std::byte* cursor_ = nullptr;
  std::byte* end_ = nullptr;
  std::size_t bytes_allocated_ = 0;
  std::size_t bytes_reserved_ = 0;
  std::size_t block_count_ = 0;
};

}  // namespace crucible
