// pipeline_bench.cpp — how fast the background stages take ops from a recording thread.
//
// A producer commits synthetic 3-tensor ops (a 100-op periodic step) into a Recorder with the
// Pipeline attached; the time runs until flush() returns, i.e. until every op has gone through
// drain, detect, build and publish. Prints ops/s and the ratio to the 1M ops/s the pipeline
// must sustain, measured in this run, with and without the pipeline stages behind the drain.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>

#include "crucible/pipeline/Pipeline.h"
#include "crucible/record/OpBuilder.h"

namespace {
using namespace crucible;
using namespace crucible::record;

constexpr int kOps = 1'000'000;

void produce(Recorder& r) {
  OpBuilder b;
  const std::uint64_t mm = r.intern_schema("aten::mm"), relu = r.intern_schema("aten::relu");
  std::uint64_t sid = 0;
  for (int i = 0; i < kOps; ++i) {
    b.reset();
    TensorMeta m;
    m.dtype = 6;
    m.storage_nbytes = 4096;
    const std::int64_t sz[2] = {32, 32 + (i % 100)}, st[2] = {32 + (i % 100), 1};
    m.storage_id = sid;
    b.add_tensor(m, sz, st);
    m.storage_id = 7;
    b.add_tensor(m, sz, st);
    b.end_inputs();
    m.storage_id = ++sid;
    m.flags = tensor_flag::kOutput;
    b.add_tensor(m, sz, st);
    r.commit(r.thread_log(), b.entry(i % 2 ? mm : relu, Phase::Forward, 0), b.cells(), b.scalars());
  }
}

void BM_DrainOnly(benchmark::State& state) {
  for (auto _ : state) {
    auto r = *Recorder::create();
    produce(*r);
    r->flush();
  }
  state.SetItemsProcessed(state.iterations() * kOps);
}

void BM_DrainDetectBuildPublish(benchmark::State& state) {
  for (auto _ : state) {
    auto r = *Recorder::create();
    pipeline::Pipeline p(*r);
    produce(*r);
    p.flush();
    if (!p.latest()) state.SkipWithError("no iteration published");
  }
  state.SetItemsProcessed(state.iterations() * kOps);
}

// One 1M-op run per repetition, the median of 7 reported: a run takes about a second, and on a
// shared 2-core machine single runs vary by a fifth.
BENCHMARK(BM_DrainOnly)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1)->Repetitions(7);
BENCHMARK(BM_DrainDetectBuildPublish)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1)->Repetitions(7);

class RateReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> ops_per_s;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median")
        ops_per_s[r.run_name.function_name] = kOps / (r.GetAdjustedRealTime() / 1e3);
  }
};
}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RateReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  std::printf("\nops from one producer until flush() returns (1M ops, 3 tensors each; median of 7 runs)\n");
  for (const auto& [name, rate] : rep.ops_per_s)
    std::printf("  %-44s %6.2f M ops/s   ratio to the 1M ops/s requirement: %.2fx\n", name.c_str(), rate / 1e6, rate / 1e6);
  benchmark::Shutdown();
  return 0;
}
