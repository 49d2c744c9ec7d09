// SpscRing.h — bounded lock-free single-producer / single-consumer ring.
//
// Ownership: exactly one producer thread calls try_push / try_push_with / try_push_n /
// has_room / push_n_fitting; exactly one consumer thread calls try_pop / try_pop_n. Which
// thread that is may change only across a synchronisation point (thread join, a mutex
// hand-off). size_approx() and capacity() may be called from any thread.
//
// Ordering guarantee: everything the producer wrote (the item and any memory it wrote before
// the push) happens-before the consumer's reads after the pop that returns that item. Built on
// one release store per side (head_ by the producer, tail_ by the consumer) and acquire loads
// of the other side's index. Items come out in the order they went in, none lost or doubled.
//
// Layout: head_ and tail_ sit on separate 64-byte lines, and each side keeps a private cached
// copy of the other's index on its own line, so in steady state a push or pop touches the
// shared line of the other side only when its cache says the ring looks full (or empty).
// Capacity is a power of two; indices are free-running 64-bit counters (no wrap in practice:
// 2^64 items at 1 ns each is 584 years).
//
// Note [Ring prefetch]: every slot a producer writes was last read by the consumer on another
// core, long enough ago to be out of both cores' private caches, so the first store to each
// line waits for it (~100 ns, measured as most of a recorded op's commit). Each push therefore
// also prefetches, for writing, the lines kPrefetchBytes ahead of what it wrote: by the time
// the producer gets there (a few ops later for the recorder) the line is in its own cache.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "crucible/core/Contract.h"

namespace crucible {

inline constexpr std::size_t kCacheLine = 64;

template <class T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "ring items are copied with plain stores");
  static constexpr std::size_t kPrefetchBytes = 512;
  static constexpr std::uint64_t kAhead = (kPrefetchBytes + sizeof(T) - 1) / sizeof(T);

 public:
  // capacity must be a power of two >= 2.
  explicit SpscRing(std::size_t capacity)
      : mask_(capacity - 1), slots_(std::make_unique<T[]>(capacity)) {
    CRUCIBLE_PRE(capacity >= 2 && (capacity & (capacity - 1)) == 0,
                 "SpscRing capacity must be a power of two >= 2");
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  std::size_t capacity() const noexcept { return mask_ + 1; }

  // Producer only. False when full (nothing written).
  bool try_push(const T& item) noexcept {
    const std::uint64_t head = prod_.head.load(std::memory_order_relaxed);
    if (head - prod_.cached_tail > mask_) {
      prod_.cached_tail = cons_.tail.load(std::memory_order_acquire);
      if (head - prod_.cached_tail > mask_) return false;
    }
    slots_[head & mask_] = item;
    prod_.head.store(head + 1, std::memory_order_release);
    prefetch_ahead(head, head + 1);
    return true;
  }

  // Producer only. Like try_push, but the item is written in place: fill(T& slot) sets the
  // fields of the claimed slot (which holds a stale item) before it is published. A record
  // assembled field by field on the stack and then copied in with one 64-byte vector load stalls
  // on store forwarding (~20 cycles); writing the fields where they go does not.
  template <class Fill>
  bool try_push_with(Fill&& fill) noexcept(noexcept(fill(std::declval<T&>()))) {
    const std::uint64_t head = prod_.head.load(std::memory_order_relaxed);
    if (head - prod_.cached_tail > mask_) {
      prod_.cached_tail = cons_.tail.load(std::memory_order_acquire);
      if (head - prod_.cached_tail > mask_) return false;
    }
    fill(slots_[head & mask_]);
    prod_.head.store(head + 1, std::memory_order_release);
    prefetch_ahead(head, head + 1);
    return true;
  }

  // Producer only. Pushes up to items.size() items, returns how many (all-or-some, in order),
  // with one release store for the whole batch.
  std::size_t try_push_n(std::span<const T> items) noexcept {
    const std::uint64_t head = prod_.head.load(std::memory_order_relaxed);
    std::uint64_t free_slots = capacity() - (head - prod_.cached_tail);
    if (free_slots < items.size()) {
      prod_.cached_tail = cons_.tail.load(std::memory_order_acquire);
      free_slots = capacity() - (head - prod_.cached_tail);
    }
    const std::size_t n = items.size() < free_slots ? items.size() : free_slots;
    for (std::size_t i = 0; i < n; ++i) slots_[(head + i) & mask_] = items[i];
    if (n != 0) prod_.head.store(head + n, std::memory_order_release);
    prefetch_ahead(head, head + n);
    return n;
  }

  // Producer only. Whether n more items fit now (the cached tail is refreshed only when they
  // seem not to). After true, push_n_fitting(items) with items.size() <= n cannot fail.
  bool has_room(std::size_t n) noexcept {
    const std::uint64_t head = prod_.head.load(std::memory_order_relaxed);
    if (head - prod_.cached_tail + n <= capacity()) return true;
    prod_.cached_tail = cons_.tail.load(std::memory_order_acquire);
    return head - prod_.cached_tail + n <= capacity();
  }

  // Producer only, after has_room(items.size()): pushes them all, with one release store. Two
  // contiguous runs (before and after the wrap), so the copy needs no mask per item.
  void push_n_fitting(std::span<const T> items) noexcept {
    const std::uint64_t head = prod_.head.load(std::memory_order_relaxed);
    const std::size_t n = items.size();
    if (n == 0) return;  // no store: the line the consumer polls stays clean
    CRUCIBLE_ASSERT(head - prod_.cached_tail + n <= capacity(), "push_n_fitting after has_room(n)");
    const std::size_t at = static_cast<std::size_t>(head & mask_);
    const std::size_t first = n < capacity() - at ? n : capacity() - at;
    T* slots = slots_.get();
    for (std::size_t i = 0; i < first; ++i) slots[at + i] = items[i];
    for (std::size_t i = first; i < n; ++i) slots[i - first] = items[i];
    prod_.head.store(head + n, std::memory_order_release);
    prefetch_ahead(head, head + n);
  }

  // Consumer only. False when empty.
  bool try_pop(T& out) noexcept {
    const std::uint64_t tail = cons_.tail.load(std::memory_order_relaxed);
    if (tail == cons_.cached_head) {
      cons_.cached_head = prod_.head.load(std::memory_order_acquire);
      if (tail == cons_.cached_head) return false;
    }
    out = slots_[tail & mask_];
    cons_.tail.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer only. Pops up to out.size() items into out, returns how many.
  std::size_t try_pop_n(std::span<T> out) noexcept {
    const std::uint64_t tail = cons_.tail.load(std::memory_order_relaxed);
    std::uint64_t avail = cons_.cached_head - tail;
    if (avail < out.size()) {
      cons_.cached_head = prod_.head.load(std::memory_order_acquire);
      avail = cons_.cached_head - tail;
    }
    const std::size_t n = out.size() < avail ? out.size() : avail;
    for (std::size_t i = 0; i < n; ++i) out[i] = slots_[(tail + i) & mask_];
    if (n != 0) cons_.tail.store(tail + n, std::memory_order_release);
    return n;
  }

  // Any thread; exact only when both sides are quiescent.
  std::size_t size_approx() const noexcept {
    const std::uint64_t t = cons_.tail.load(std::memory_order_acquire);
    const std::uint64_t h = prod_.head.load(std::memory_order_acquire);
    return h >= t ? static_cast<std::size_t>(h - t) : 0;
  }

 private:
  // Items [b, e) were just written: prefetch for writing the lines of items [b, e) + kAhead,
  // each line once as the writes sweep the ring (see Note [Ring prefetch]). A hint only: it
  // changes no value, and a line the consumer has not read yet just moves back when it does.
  void prefetch_ahead(std::uint64_t b, std::uint64_t e) const noexcept {
    for (std::uint64_t i = b + kAhead; i < e + kAhead; ++i) {
      // Small items: only the one that starts a line (counting from the array's start).
      if constexpr (sizeof(T) < kCacheLine)
        if ((i * sizeof(T)) % kCacheLine >= sizeof(T)) continue;
      const char* p = reinterpret_cast<const char*>(&slots_[i & mask_]);
      for (std::size_t off = 0; off < sizeof(T); off += kCacheLine)
        __builtin_prefetch(p + off, /*rw=*/1, /*locality=*/3);
    }
  }

  struct alignas(kCacheLine) ProducerSide {
    std::atomic<std::uint64_t> head{0};  // written by producer, read by consumer
    std::uint64_t cached_tail = 0;       // producer's private copy of tail
  };
  struct alignas(kCacheLine) ConsumerSide {
    std::atomic<std::uint64_t> tail{0};  // written by consumer, read by producer
    std::uint64_t cached_head = 0;       // consumer's private copy of head
  };
  static_assert(sizeof(ProducerSide) == kCacheLine && sizeof(ConsumerSide) == kCacheLine);

  const std::uint64_t mask_;
  const std::unique_ptr<T[]> slots_;
  ProducerSide prod_;
  ConsumerSide cons_;
};

}  // namespace crucible
