// spsc_ring_stress_test.cpp — two threads, 10M items, order and content verified.
// Run under the tsan preset this is the data-race check for SpscRing's acquire/release protocol.
#include "crucible/core/SpscRing.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace {
using crucible::SpscRing;

// Each item carries its sequence number and a checksum word, so a torn or stale read shows.
struct Item {
  std::uint64_t seq;
  std::uint64_t check;
};
constexpr std::uint64_t mix(std::uint64_t s) { return s * 0x9E3779B97F4A7C15ull ^ (s >> 7); }

constexpr std::uint64_t kItems = 10'000'000;

TEST(SpscRingStress, TenMillionItemsSingle) {
  SpscRing<Item> ring(1024);
  std::thread producer([&] {
    for (std::uint64_t i = 0; i < kItems;) {
      if (ring.try_push(Item{i, mix(i)})) ++i;
      else std::this_thread::yield();
    }
  });
  std::uint64_t expected = 0, bad = 0;
  while (expected < kItems) {
    Item it;
    if (!ring.try_pop(it)) { std::this_thread::yield(); continue; }
    bad += (it.seq != expected) | (it.check != mix(expected));
    ++expected;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  Item it;
  EXPECT_FALSE(ring.try_pop(it)) << "nothing extra";
}

TEST(SpscRingStress, TenMillionItemsBatched) {
  SpscRing<Item> ring(4096);
  std::thread producer([&] {
    std::vector<Item> batch(97);  // odd size: batches straddle the wrap point
    std::uint64_t i = 0;
    while (i < kItems) {
      std::size_t n = std::min<std::uint64_t>(batch.size(), kItems - i);
      for (std::size_t k = 0; k < n; ++k) batch[k] = Item{i + k, mix(i + k)};
      std::size_t pushed = 0;
      while (pushed < n) {
        std::size_t got = ring.try_push_n(std::span<const Item>(batch.data() + pushed, n - pushed));
        if (got == 0) std::this_thread::yield();
        pushed += got;
      }
      i += n;
    }
  });
  std::vector<Item> out(61);
  std::uint64_t expected = 0, bad = 0;
  while (expected < kItems) {
    std::size_t n = ring.try_pop_n(out);
    if (n == 0) { std::this_thread::yield(); continue; }
    for (std::size_t k = 0; k < n; ++k) {
      bad += (out[k].seq != expected) | (out[k].check != mix(expected));
      ++expected;
    }
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(expected, kItems);
}
}  // namespace
