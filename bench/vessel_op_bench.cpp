// vessel_op_bench.cpp — what recording adds to one ATen op, against the same op not recorded.
//
// The Python step benchmark (python/vessel_overhead.py) answers the user's question, but its
// noise on a 2-core VM is several percent of the step; this one isolates the per-op path.
// Two ops on 32x128 float tensors, each run eagerly and with this thread recording:
//   add_   in place: no new storage (three tensor records, one scalar);
//   add    out of place: a new output storage every op (its storage id is new).
// Prints, for each, the eager time, the recorded time and the added ns per op, with the ratio of
// added to eager time, measured in this run. The recorder is cleared between benchmarks.
// Also the MLP training step of python/vessel_overhead.py written against ATen (Linear 64->128,
// ReLU, Linear 128->10, batch 32, cross-entropy, backward, SGD with momentum 0.9 as
// torch.optim.SGD does it op by op): the same ATen ops through the same dispatcher, without the
// Python interpreter's share of the step and its noise. (Python's optimizer also opens
// record_function scopes, profiler markers that go through the boxed fallback and put the SGD
// ops in the optimizer phase; this step has none, so its SGD ops are recorded as forward.)
// Repetitions run in random order, eager and recorded mixed, so drift on a shared machine hits
// both sides alike.
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
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

double g_mlp_ops_per_step = 0;  // measured by the recorded runs
// The fastest repetition: on a shared machine interference only ever adds time.
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
constexpr int kMlpIters = 2000, kMlpReps = 15;  // steps per repetition, repetitions

// The MLP step. Parameters, gradients and momentum buffers persist across steps, as in Python.
struct Mlp {
  at::Tensor w1 = at::randn({128, 64}).mul_(0.1).set_requires_grad(true);
  at::Tensor b1 = at::zeros({128}).set_requires_grad(true);
  at::Tensor w2 = at::randn({10, 128}).mul_(0.1).set_requires_grad(true);
  at::Tensor b2 = at::zeros({10}).set_requires_grad(true);
  at::Tensor x = at::randn({32, 64});
  at::Tensor y = at::randint(0, 10, {32});
  std::array<at::Tensor, 4> momentum;

  void step() {
    const std::array<at::Tensor*, 4> params{&w1, &b1, &w2, &b2};
    for (at::Tensor* p : params)  // optimizer.zero_grad() (set_to_none=False in torch 1.13)
      if (p->grad().defined()) p->mutable_grad().zero_();
    at::Tensor h = at::relu(at::linear(x, w1, b1));
    at::Tensor loss = at::cross_entropy_loss(at::linear(h, w2, b2), y);
    loss.backward();
    c10::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {  // SGD, momentum 0.9, lr 0.01
      at::Tensor g = params[i]->grad();
      if (!momentum[i].defined()) momentum[i] = g.clone().detach();
      else momentum[i].mul_(0.9).add_(g, 1.0);
      params[i]->add_(momentum[i], -0.01);
    }
  }
};

// Shared by both sides (not a static in the template, which would give each its own): the same
// tensors, warmed up once.
Mlp& shared_mlp() {
  static Mlp* m = [] {
    auto* mlp = new Mlp();
    for (int i = 0; i < 20; ++i) mlp->step();
    return mlp;
  }();
  return *m;
}

template <bool kRecord>
void BM_MlpStep(benchmark::State& state) {
  at::set_num_threads(1);
  Mlp* m = &shared_mlp();
  crucible::vessel::set_enabled(kRecord);
  for (auto _ : state) m->step();
  crucible::vessel::set_enabled(false);
  if (kRecord) {
    std::uint64_t ops = 0;  // the producer counts its ops as it commits them: no flush needed
    for (const auto& t : Recorder::global().thread_stats()) ops += t.total_ops();
    g_mlp_ops_per_step = static_cast<double>(ops) / static_cast<double>(state.iterations());
    state.counters["ops_per_step"] = g_mlp_ops_per_step;
  }
  Recorder::global().clear();
}

BENCHMARK_TEMPLATE(BM_Op, false, true)->Name("add_/eager")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, true, true)->Name("add_/recorded")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, false, false)->Name("add/eager")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK_TEMPLATE(BM_Op, true, false)->Name("add/recorded")->Iterations(kIters)->Repetitions(7)->ReportAggregatesOnly(true);

BENCHMARK_TEMPLATE(BM_MlpStep, false)->Name("mlp_step/eager")->Iterations(kMlpIters)->Repetitions(kMlpReps)->ReportAggregatesOnly(true)->ComputeStatistics("min", min_of);
BENCHMARK_TEMPLATE(BM_MlpStep, true)->Name("mlp_step/recorded")->Iterations(kMlpIters)->Repetitions(kMlpReps)->ReportAggregatesOnly(true)->ComputeStatistics("min", min_of);

class AddedReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> ns;      // benchmark name -> median ns per op
  std::map<std::string, double> ns_min;  // benchmark name -> fastest repetition, where computed
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median")
        ns[r.run_name.function_name] = r.GetAdjustedRealTime();
      else if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "min")
        ns_min[r.run_name.function_name] = r.GetAdjustedRealTime();
  }
};
}  // namespace

int main(int argc, char** argv) {
  const auto st = crucible::vessel::install(/*unboxed_kernels=*/true);
  if (!st.ok()) {
    std::fprintf(stderr, "vessel_op_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  // Eager and recorded repetitions alternate in random order unless the command line says
  // otherwise: drift on a shared machine then hits both sides alike.
  std::vector<char*> args(argv, argv + argc);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, interleave.data());
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());
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
  // The MLP step by two statistics of the same runs: the median, and the fastest repetition.
  const auto print_mlp = [](const std::map<std::string, double>& ns, const char* what) {
    const auto e = ns.find("mlp_step/eager");
    const auto r = ns.find("mlp_step/recorded");
    if (e == ns.end() || r == ns.end() || g_mlp_ops_per_step <= 0) return;
    std::printf("  MLP step (%.0f ops, C++, %s of %d x %d steps): eager %.1f us  recorded %.1f us  added %.1f%%  %.0f ns/op\n",
                g_mlp_ops_per_step, what, kMlpReps, kMlpIters, e->second / 1e3, r->second / 1e3,
                (r->second - e->second) / e->second * 100, (r->second - e->second) / g_mlp_ops_per_step);
  };
  print_mlp(rep.ns, "medians");
  print_mlp(rep.ns_min, "fastest");
  benchmark::Shutdown();
  return 0;
}
