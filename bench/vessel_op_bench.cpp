// vessel_op_bench.cpp — what recording adds to one ATen op, against the same op not recorded.
//
// The Python step benchmark (python/vessel_overhead.py) answers the user's question, but its
// noise on a 2-core VM is several percent of the step; this one isolates the per-op path.
// Two ops on 32x128 float tensors, each run eagerly and with this thread recording:
//   add_   in place: no new storage (three tensor records, one scalar);
//   add    out of place: a new output storage every op (its storage id is new).
// Prints, for each, the eager time, the recorded time and the added ns per op, with the ratio of
// added to eager time, measured in this run. The recorder is cleared between benchmarks.
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <map>
#include <string>

#include "Dispatch.h"
#include "crucible/record/Recorder.h"

namespace {
using crucible::record::Recorder;

constexpr int kIters = 200000;

struct Tensors {
  at::Tensor a = at::randn({32, 128}), b = at::randn({32, 128});
};

template <bool kRecord, bool kInPlace>
void BM_Op(benchmark::State& state) {
  at::set_num_threads(1);
  Tensors t;
  crucible::vessel::set_enabled(kRecord);
  for (auto _ : state) {
    if constexpr (kInPlace) {
      t.a.add_(t.b, 1e-9);
    } else {
      at::Tensor c = at::add(t.a, t.b);
      benchmark::DoNotOptimize(c.data_ptr());
    }
  }
  crucible::vessel::set_enabled(false);
  Recorder::global().clear();
}

BENCHMARK_TEMPLATE(BM_Op, false, true)->Name("add_/eager")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, true, true)->Name("add_/recorded")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, false, false)->Name("add/eager")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, true, false)->Name("add/recorded")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);

class AddedReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> ns;  // benchmark name -> median ns per op
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median")
        ns[r.run_name.function_name] = r.GetAdjustedRealTime();
  }
};
}  // namespace

int main(int argc, char** argv) {
  const auto st = crucible::vessel::install(/*unboxed_kernels=*/true);
  if (!st.ok()) {
    std::fprintf(stderr, "vessel_op_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  AddedReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  std::printf("\nrecording added per op (32x128 float, 1 thread; medians of 7 x %d ops), vs the same op eager in this run\n", kIters);
  for (const char* op : {"add_", "add"}) {
    const auto e = rep.ns.find(std::string(op) + "/eager");
    const auto r = rep.ns.find(std::string(op) + "/recorded");
    if (e == rep.ns.end() || r == rep.ns.end()) continue;
    std::printf("  %-5s eager %7.1f ns  recorded %7.1f ns  added %6.1f ns/op  (%.2fx of the eager op)\n", op,
                e->second, r->second, r->second - e->second, (r->second - e->second) / e->second);
  }
  benchmark::Shutdown();
  return 0;
}
