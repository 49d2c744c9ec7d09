// Channel.h — an SpscRing whose consumer parks instead of spinning.
//
// Ownership: one producer thread calls push(), one consumer thread calls pop()/wait().
// Ordering: as SpscRing (an item's writes happen-before the pop that returns it).
// Parking: the consumer spins briefly (~kSpins polls), then announces it is going to sleep
// (sleeping_ = true, seq_cst), re-checks the ring, and waits on doorbell_ (C++20 atomic wait:
// a futex). A producer that finds sleeping_ set after its push bumps the doorbell and wakes
// it. The consumer's seq_cst store of the flag and the producer's seq_cst fence between its
// push and its load of the flag mean either the consumer's re-check sees the item or the
// producer sees the flag: no lost wake-up. When the ring is full the producer waits the same
// way (it yields; the consumer is awake because the ring is non-empty).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "crucible/core/SpscRing.h"

namespace crucible::pipeline {

template <class T>
class Channel {
 public:
  explicit Channel(std::size_t capacity) : ring_(capacity) {}

  void push(const T& item) {
    while (!ring_.try_push(item)) {
      ring_doorbell();
      std::this_thread::yield();
    }
    // Full fence: the ring's release store must not pass the load of sleeping_ (Dekker).
    // Taking the flag (exchange) rings once per sleep: a consumer that was rung but is not
    // running yet leaves the flag set, and every further push of a burst would otherwise make
    // its own futex wake call (tens of thousands of syscalls per second behind a drain).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed) && sleeping_.exchange(false, std::memory_order_relaxed)) ring_doorbell();
  }

  bool try_pop(T& out) { return ring_.try_pop(out); }

  // Consumer: blocks until an item is available (or close() was called: returns false).
  bool pop(T& out) {
    for (int i = 0; i < kSpins; ++i) {
      if (ring_.try_pop(out)) return true;
      if (closed_.load(std::memory_order_acquire)) return ring_.try_pop(out);
    }
    for (;;) {
      const std::uint32_t bell = doorbell_.load(std::memory_order_acquire);
      sleeping_.store(true, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);  // the store before the re-check's loads
      if (ring_.try_pop(out)) {
        sleeping_.store(false, std::memory_order_relaxed);
        return true;
      }
      if (closed_.load(std::memory_order_acquire)) {
        sleeping_.store(false, std::memory_order_relaxed);
        return false;
      }
      doorbell_.wait(bell, std::memory_order_acquire);
      sleeping_.store(false, std::memory_order_relaxed);
      if (ring_.try_pop(out)) return true;
    }
  }

  // Any thread: wakes the consumer for good; pop() returns false once the ring is empty.
  void close() {
    closed_.store(true, std::memory_order_release);
    ring_doorbell();
  }

 private:
  static constexpr int kSpins = 256;
  void ring_doorbell() {
    doorbell_.fetch_add(1, std::memory_order_release);
    doorbell_.notify_one();
  }
  SpscRing<T> ring_;
  alignas(kCacheLine) std::atomic<std::uint32_t> doorbell_{0};
  alignas(kCacheLine) std::atomic<bool> sleeping_{false};
  std::atomic<bool> closed_{false};
};

}  // namespace crucible::pipeline
