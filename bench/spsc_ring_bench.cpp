// spsc_ring_bench.cpp — SpscRing push+pop cost per item, single and batched, two threads,
// against the queue a C++ user would otherwise write: std::deque behind a std::mutex.
//
// Prints ns/item for each and the ratio mutex-queue / SpscRing measured in this run.
#include "crucible/core/SpscRing.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {
using crucible::SpscRing;

struct alignas(64) Entry {  // the size of one trace-ring record
  std::uint64_t w[8];
};
constexpr std::int64_t kItemsPerIter = 1 << 20;

template <class Push, class Pop>
void run_pair(benchmark::State& state, Push push, Pop pop) {
  for (auto _ : state) {
    std::thread consumer([&] {
      std::int64_t got = 0;
      while (got < kItemsPerIter) got += pop();
    });
    std::int64_t sent = 0;
    while (sent < kItemsPerIter) sent += push(sent);
    consumer.join();
  }
  state.SetItemsProcessed(state.iterations() * kItemsPerIter);
}

void BM_SpscRing_Single(benchmark::State& state) {
  SpscRing<Entry> ring(4096);
  run_pair(
      state, [&](std::int64_t i) { return ring.try_push(Entry{{std::uint64_t(i)}}) ? 1 : 0; },
      [&] {
        Entry e;
        return ring.try_pop(e) ? 1 : 0;
      });
}

void BM_SpscRing_Batch64(benchmark::State& state) {
  SpscRing<Entry> ring(4096);
  std::vector<Entry> in(64), out(64);
  run_pair(
      state,
      [&](std::int64_t i) {
        std::size_t n = std::min<std::int64_t>(64, kItemsPerIter - i);
        return static_cast<std::int64_t>(ring.try_push_n(std::span<const Entry>(in.data(), n)));
      },
      [&] { return static_cast<std::int64_t>(ring.try_pop_n(std::span<Entry>(out))); });
}

void BM_MutexDeque_Single(benchmark::State& state) {
  std::mutex mu;
  std::deque<Entry> q;
  run_pair(
      state,
      [&](std::int64_t i) {
        std::lock_guard<std::mutex> g(mu);
        if (q.size() >= 4096) return 0;
        q.push_back(Entry{{std::uint64_t(i)}});
        return 1;
      },
      [&] {
        std::lock_guard<std::mutex> g(mu);
        if (q.empty()) return 0;
        q.pop_front();
        return 1;
      });
}

void BM_MutexDeque_Batch64(benchmark::State& state) {
  std::mutex mu;
  std::deque<Entry> q;
  run_pair(
      state,
      [&](std::int64_t i) {
        std::int64_t n = std::min<std::int64_t>(64, kItemsPerIter - i);
        std::lock_guard<std::mutex> g(mu);
        std::int64_t room = 4096 - static_cast<std::int64_t>(q.size());
        n = std::min(n, room);
        for (std::int64_t k = 0; k < n; ++k) q.push_back(Entry{{std::uint64_t(i + k)}});
        return n;
      },
      [&] {
        std::lock_guard<std::mutex> g(mu);
        std::int64_t n = std::min<std::int64_t>(64, q.size());
        for (std::int64_t k = 0; k < n; ++k) q.pop_front();
        return n;
      });
}

BENCHMARK(BM_SpscRing_Single)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MutexDeque_Single)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpscRing_Batch64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MutexDeque_Batch64)->UseRealTime()->Unit(benchmark::kMillisecond);

// Keeps every run's ns/item so main() can print the ratios after the table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> ns_per_item;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.iterations == 0) continue;
      ns_per_item[r.benchmark_name()] =
          r.GetAdjustedRealTime() * 1e6 / static_cast<double>(kItemsPerIter);  // ms -> ns
    }
  }
};
}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter console;
  benchmark::RunSpecifiedBenchmarks(&console);
  auto& m = console.ns_per_item;
  std::printf("\nSpscRing vs std::mutex + std::deque, 64-byte items, producer and consumer threads\n");
  for (const char* kind : {"Single", "Batch64"}) {
    const std::string ring = std::string("BM_SpscRing_") + kind + "/real_time";
    const std::string mutex = std::string("BM_MutexDeque_") + kind + "/real_time";
    if (m.count(ring) && m.count(mutex)) {
      std::printf("  %-8s SpscRing %7.2f ns/item   mutex deque %7.2f ns/item   ratio %.2fx faster\n",
                  kind, m[ring], m[mutex], m[mutex] / m[ring]);
    }
  }
  benchmark::Shutdown();
  return 0;
}
