// HugePageAllocator.h — a std::allocator for big, growing arrays that asks for huge pages.
//
// Note [Huge pages for the trace]
// The recorder's trace is a handful of arrays that grow by doubling for as long as recording
// runs (hundreds of MB for a million ops). Each growth copies the array into fresh memory, and
// on 4 KiB pages every page of the fresh memory is a page fault: profiling the drain at 1M
// ops/s put a third of its time in the kernel's fault path. An allocation of 2 MiB or more
// here is 2 MiB-aligned and advised MADV_HUGEPAGE, so with transparent huge pages in "madvise"
// mode (Debian's default) one fault maps 2 MiB. Smaller allocations are plain new/delete. The
// advice is only advice: where huge pages are off or unavailable the memory works as usual.
// The cost: a big array is rounded up to whole 2 MiB pages, so each of the trace's arrays can
// hold up to 2 MiB it does not use, and after a free the C library may hand parts of an advised
// range to other (small) allocations, which then sit on huge pages too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace crucible {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;

  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  T* allocate(std::size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>{}.allocate(n);
    if (bytes > SIZE_MAX - (kHugePage - 1)) throw std::bad_alloc();  // rounding up would wrap
    const std::size_t rounded = (bytes + kHugePage - 1) & ~(kHugePage - 1);
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__)
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice: on failure the memory is still fine
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < kHugePage) std::allocator<T>{}.deallocate(p, n);
    else std::free(p);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

}  // namespace crucible
