// linear_bench.cpp — where OpenBLAS wins for the runtime's linear layer (PackedLinear::kBlasRows).
//
// For a 1024 -> 1024 linear layer and several row counts, times PackedLinear::run (the built-in
// AVX2 GEMV below kBlasRows rows, OpenBLAS sgemm from there on) against the built-in GEMV applied
// row by row — what the runtime would do without OpenBLAS — and prints the ratio per row count.
// OpenBLAS runs with its default threads (the bench sets none).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "crucible/runtime/Linear.h"

namespace {
using crucible::runtime::PackedLinear;
constexpr std::int64_t kIn = 1024, kOut = 1024;

const PackedLinear& layer() {
  static const PackedLinear p = [] {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> w(kIn * kOut), b(kOut);
    for (float& v : w) v = u(rng);
    for (float& v : b) v = u(rng);
    return *PackedLinear::make(kIn, kOut, w, b);
  }();
  return p;
}

void BM_Linear_Runtime(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  std::vector<float> x(rows * kIn, 0.5f), y(rows * kOut);
  for (auto _ : state) {
    layer().run(x.data(), rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}

void BM_Linear_GemvPerRow(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  std::vector<float> x(rows * kIn, 0.5f), y(rows * kOut);
  for (auto _ : state) {
    for (std::int64_t r = 0; r < rows; ++r) layer().run(x.data() + r * kIn, 1, y.data() + r * kOut);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}

BENCHMARK(BM_Linear_Runtime)->Arg(1)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK(BM_Linear_GemvPerRow)->Arg(1)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseRealTime();

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> ns;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Iteration && r.iterations > 0) ns[r.benchmark_name()] = r.GetAdjustedRealTime();
    }
  }
};
}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter console;
  benchmark::RunSpecifiedBenchmarks(&console);
  std::printf("\nlinear %lld -> %lld: runtime path vs built-in GEMV row by row (kBlasRows = %lld)\n",
              static_cast<long long>(kIn), static_cast<long long>(kOut),
              static_cast<long long>(PackedLinear::kBlasRows));
  for (int rows : {1, 8, 16, 64, 256}) {
    const std::string a = "BM_Linear_Runtime/" + std::to_string(rows) + "/real_time";
    const std::string b = "BM_Linear_GemvPerRow/" + std::to_string(rows) + "/real_time";
    if (console.ns.count(a) && console.ns.count(b)) {
      std::printf("  rows %4d  runtime (%s) %10.1f us   gemv per row %10.1f us   ratio %.2fx\n", rows,
                  rows >= PackedLinear::kBlasRows ? "OpenBLAS" : "GEMV", console.ns[a] / 1e3,
                  console.ns[b] / 1e3, console.ns[b] / console.ns[a]);
    }
  }
  std::printf("  %s\n", crucible::runtime::blas_status().c_str());
  benchmark::Shutdown();
  return 0;
}
