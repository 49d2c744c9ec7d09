// Arena.cpp — block management for the bump allocator.
#include "crucible/core/Arena.h"

#include <cstdlib>
#include <utility>

namespace crucible {

struct Arena::Block {
  Block* next;
  std::size_t size;  // usable bytes after the header
  std::byte* data() { return reinterpret_cast<std::byte*>(this + 1); }
};
static_assert(sizeof(void*) == 8, "Arena assumes a 64-bit target");

Arena::Arena(std::size_t block_bytes) : block_bytes_(block_bytes < 256 ? 256 : block_bytes) {}

Arena::~Arena() { release_all(nullptr); }

Arena::Arena(Arena&& o) noexcept
    : block_bytes_(o.block_bytes_), head_(std::exchange(o.head_, nullptr)),
      cursor_(std::exchange(o.cursor_, nullptr)), end_(std::exchange(o.end_, nullptr)),
      bytes_allocated_(std::exchange(o.bytes_allocated_, 0)),
      bytes_reserved_(std::exchange(o.bytes_reserved_, 0)),
      block_count_(std::exchange(o.block_count_, 0)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    release_all(nullptr);
    new (this) Arena(std::move(o));
  }
  return *this;
}

void* Arena::allocate(std::size_t bytes, std::size_t align) {
  CRUCIBLE_PRE(align != 0 && (align & (align - 1)) == 0 && align <= 4096,
               "alignment must be a power of two no larger than 4096");
  auto cur = reinterpret_cast<std::uintptr_t>(cursor_);
  std::uintptr_t aligned = (cur + (align - 1)) & ~(std::uintptr_t{align} - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(end_);
  if (cursor_ != nullptr && aligned <= end && bytes <= end - aligned) {
    cursor_ = reinterpret_cast<std::byte*>(aligned + bytes);
    bytes_allocated_ += bytes;
    return reinterpret_cast<void*>(aligned);
  }
  return allocate_slow(bytes, align);
}

void* Arena::allocate_slow(std::size_t bytes, std::size_t align) {
  // Header + worst-case alignment padding + payload, checked for overflow.
  const std::size_t overhead = sizeof(Block) + align;
  if (bytes > SIZE_MAX - overhead) throw std::bad_alloc();
  std::size_t payload = bytes + align > block_bytes_ ? bytes + align : block_bytes_;
  void* raw = std::malloc(sizeof(Block) + payload);
  if (raw == nullptr) throw std::bad_alloc();
  auto* b = static_cast<Block*>(raw);
  b->next = head_;
  b->size = payload;
  head_ = b;
  ++block_count_;
  bytes_reserved_ += payload;
  cursor_ = b->data();
  end_ = b->data() + payload;
  auto cur = reinterpret_cast<std::uintptr_t>(cursor_);
  std::uintptr_t aligned = (cur + (align - 1)) & ~(std::uintptr_t{align} - 1);
  cursor_ = reinterpret_cast<std::byte*>(aligned + bytes);
  bytes_allocated_ += bytes;
  CRUCIBLE_POST(cursor_ <= end_, "a fresh block always fits its request");
  return reinterpret_cast<void*>(aligned);
}

void Arena::release_all(Block* keep) noexcept {
  Block* b = head_;
  while (b != nullptr) {
    Block* next = b->next;
    if (b != keep) std::free(b);
    b = next;
  }
  head_ = nullptr;
  cursor_ = end_ = nullptr;
  bytes_allocated_ = bytes_reserved_ = block_count_ = 0;
}

void Arena::reset() noexcept {
  // Keep the largest-or-last block: the oldest one is at the list tail; keep the head (newest),
  // which is at least block_bytes_ and often the biggest.
  Block* keep = head_;
  if (keep == nullptr) return;
  // Unlink keep so release_all does not walk into it twice.
  Block* rest = keep->next;
  keep->next = nullptr;
  head_ = rest;
  release_all(nullptr);
  head_ = keep;
  block_count_ = 1;
  bytes_reserved_ = keep->size;
  cursor_ = keep->data();
  end_ = keep->data() + keep->size;
}

}  // namespace crucible
