// mimic_pointwise_bench.cpp — the CPU backend's generated kernel for a pointwise chain vs the
// same chain as one library call per op (each a contiguous C++ loop compiled -O3 -march=native,
// intermediates in memory: what the null backend runs) and vs one hand-fused C++ loop; and the
// code generator's cold compile time vs loading the object from the disk cache.
//
// Chain: y = -relu(a*b + c), float32, n elements, one thread; median of 21 runs; then the same
// chain with `a` transposed (the strided loop), whole and split over threads. The
// C++ loops build without FP contraction, as the generated code (a*b + c is two roundings).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../test/mimic/chain_plan.h"
#include "crucible/exec/Runner.h"
#include "crucible/mimic/CpuBackend.h"
#include "crucible/mimic/CpuCodegen.h"

namespace {

using namespace crucible;
using namespace crucible::mimic;
using Clock = std::chrono::steady_clock;

template <class F>
double median_us(F&& f, int reps = 21) {
  std::vector<double> t;
  f();  // warm
  for (int i = 0; i < reps; ++i) {
    const auto s = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One op per pass, as per-op library calls run it.
__attribute__((noinline)) void per_op(const float* a, const float* b, const float* c, float* t0,
                                      float* t1, float* t2, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) t0[i] = a[i] * b[i];
  for (std::int64_t i = 0; i < n; ++i) t1[i] = t0[i] + c[i];
  for (std::int64_t i = 0; i < n; ++i) t2[i] = t1[i] < 0.f ? 0.f : t1[i];
  for (std::int64_t i = 0; i < n; ++i) y[i] = -t2[i];
}
__attribute__((noinline)) void fused(const float* a, const float* b, const float* c, float* y,
                                     std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float t = a[i] * b[i] + c[i];
    y[i] = -(t < 0.f ? 0.f : t);
  }
}

test::StepSpec step_of(std::string op, std::vector<int> in,
                       std::vector<record::ScalarRecord> s = {}) {
  test::StepSpec x;
  x.op = std::move(op);
  x.in = std::move(in);
  x.scalars = std::move(s);
  return x;
}

// -relu(a*b + c) over inputs a, b, c, through a Runner on one thread (`whole`) and on the
// backend's default threads (`split`), library calls in plain loops.
struct Chain {
  test::BuiltPlan bp;
  std::unique_ptr<CpuBackend> one, many;
  test::LoopProvider provider;
  std::unique_ptr<exec::Runner> whole, split;
};

std::unique_ptr<Chain> make_chain(test::ChainSpec c) {
  c.steps = {step_of("aten::mul.Tensor", {0, 1}),
             step_of("aten::add.Tensor", {-1, 2}, {test::scalar_double(2, 1.0)}),
             step_of("aten::relu", {-2}), step_of("aten::neg", {-3})};
  auto h = std::make_unique<Chain>();
  h->bp = test::build_chain_plan(c);
  CpuBackendOptions one = CpuBackendOptions::memory_only();
  one.threads = 1;
  auto a = CpuBackend::make(one);
  auto b = CpuBackend::make(CpuBackendOptions::memory_only());
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "%s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    return nullptr;
  }
  h->one = std::move(*a);
  h->many = std::move(*b);
  auto whole = exec::Runner::make(h->bp.plan, h->one->backend(), h->provider.provider());
  auto split = exec::Runner::make(h->bp.plan, h->many->backend(), h->provider.provider());
  if (!whole.ok() || !split.ok()) {
    std::fprintf(stderr, "%s\n", (whole.ok() ? split.status() : whole.status()).ToString().c_str());
    return nullptr;
  }
  h->whole = std::move(*whole);
  h->split = std::move(*split);
  return h;
}

void fill(std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<float>(i);
    a[i] = std::sin(x * 0.1f), b[i] = std::cos(x * 0.3f);
    c[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  }
}

}  // namespace

int main() {
  std::printf(
      "mimic_pointwise_bench: y = -relu(a*b + c), float32, median of 21; the loops and "
      "'generated' on 1 thread, 'split' the generated kernel on the backend's default threads "
      "(%u here: Note [Split loops]); ratios: that loop's time / the generated kernel's; host %s\n",
      std::max(1u, std::thread::hardware_concurrency()), host_target().cpu.c_str());
  for (std::int64_t n : {4096, 262144, 4194304}) {
    test::TensorSpec t{test::kF32, {n}, {}, 0, false, 0};
    auto h = make_chain(test::ChainSpec{"bench", {n}, {t, t, t}, {}});
    if (h == nullptr) return 1;
    std::vector<float> a(n), b(n), cc(n), y(n), t0(n), t1(n), t2(n);
    fill(a, b, cc);
    std::vector<void*> ins{a.data(), b.data(), cc.data()}, outs{y.data()};
    const double gen = median_us([&] { (void)h->whole->run(exec::RunArgs{ins, outs, {}}); });
    const double ops = median_us([&] {
      per_op(a.data(), b.data(), cc.data(), t0.data(), t1.data(), t2.data(), y.data(), n);
    });
    const double fus = median_us([&] { fused(a.data(), b.data(), cc.data(), y.data(), n); });
    const double spl = median_us([&] { (void)h->split->run(exec::RunArgs{ins, outs, {}}); });
    std::printf(
        "n=%-8lld generated %9.1f us  per-op loops %9.1f us (%.2fx)  hand-fused loop "
        "%9.1f us (%.2fx)  split %9.1f us (hand-fused / split %.2fx)\n",
        static_cast<long long>(n), gen, ops, ops / gen, fus, fus / gen, spl, fus / spl);
  }
  // A transposed operand: the strided loop, one line per row of the output, whole on one thread
  // or split in parts of whole lines (Note [Split loops]), against a hand-fused strided loop.
  for (std::int64_t r : {256, 2048}) {
    const std::int64_t n = r * r;
    test::TensorSpec t{test::kF32, {r, r}, {}, 0, false, 0}, tt = t;
    tt.strides = {1, r};
    auto h = make_chain(test::ChainSpec{"bench_t", {r, r}, {tt, t, t}, {}});
    if (h == nullptr) return 1;
    std::vector<float> a(n), b(n), cc(n), y(n);
    fill(a, b, cc);
    std::vector<void*> ins{a.data(), b.data(), cc.data()}, outs{y.data()};
    const double gen = median_us([&] { (void)h->whole->run(exec::RunArgs{ins, outs, {}}); });
    const double spl = median_us([&] { (void)h->split->run(exec::RunArgs{ins, outs, {}}); });
    const double fus = median_us([&] {
      for (std::int64_t i = 0; i < r; ++i)
        for (std::int64_t j = 0; j < r; ++j) {
          const float v = a[j * r + i] * b[i * r + j] + cc[i * r + j];
          y[i * r + j] = -(v < 0.f ? 0.f : v);
        }
    });
    std::printf(
        "transposed a, %lldx%lld: generated %9.1f us  hand-fused strided loop %9.1f us (%.2fx)  "
        "split %9.1f us (generated / split %.2fx)\n",
        static_cast<long long>(r), static_cast<long long>(r), gen, fus, fus / gen, spl, gen / spl);
  }
  // Compile time: the code generator alone (cold), and a disk hit in a backend whose process
  // has not seen the kernel (the first level is per process, so each n above was a memory hit).
  auto lowered = lower_pointwise(
      test::build_chain_plan(
          test::ChainSpec{"c",
                          {8},
                          {test::TensorSpec{test::kF32, {8}, {}, 0, false, 0}},
                          {test::StepSpec{"aten::neg", {0}, {}, test::kF32, {}, false},
                           test::StepSpec{"aten::abs", {-1}, {}, test::kF32, {}, false}}})
          .plan,
      0);
  const double cold =
      median_us([&] { (void)compile_pointwise(lowered->program, "bench_pw", host_target()); }, 11);
  const std::string dir = "/tmp/crucible_mimic_bench_" + std::to_string(::getpid());
  auto disk = ObjectCache::open(dir);
  const CpuKernelKey key = cpu_kernel_key(lowered->program.hash(), "bench", host_target(), 3);
  (void)disk->store(key, *compile_pointwise(lowered->program, "bench_pw", host_target()));
  const double warm = median_us([&] { (void)disk->load(key, host_target()); }, 11);
  std::printf("2-op chain: compile %.2f ms cold; disk read and check %.3f ms (%.0fx)\n", cold / 1e3,
              warm / 1e3, cold / warm);
  std::filesystem::remove_all(dir);
  return 0;
}
