// cache_chain.h — the chain the kernel cache tests compile, run and check: in their own
// process and in a fresh one (mimic_cache_child). Its program is used by no other test, so
// the first backend in a process compiles it or loads it from disk.
#pragma once

#include <random>
#include <string>

#include "chain_plan.h"
#include "crucible/exec/Runner.h"
#include "crucible/mimic/CpuBackend.h"

namespace crucible::mimic::test {

inline ChainSpec cache_chain() {
  TensorSpec t{kF64, {3, 1001}, {}, 0, false, 0};
  auto st = [](std::string op, std::vector<int> in, std::vector<record::ScalarRecord> s = {}) {
    StepSpec x;
    x.op = std::move(op);
    x.in = std::move(in);
    x.scalars = std::move(s);
    x.out_dtype = kF64;
    return x;
  };
  return ChainSpec{"cache_chain",
                   {3, 1001},
                   {t, t},
                   {st("aten::sub.Tensor", {0, 1}, {scalar_double(2, -1.0)}),
                    st("aten::div.Scalar", {-1}, {scalar_double(1, 7.0)}), st("aten::abs", {-2}),
                    st("aten::div.Tensor", {-3, 1}), st("aten::neg", {-4}), st("aten::mul.Tensor", {-5, 0}),
                    st("aten::relu", {-6})}};
}

// Runs chain `c` on a CpuBackend made with `opts`; sets *correct when the result matches the
// reference bit for bit.
inline Result<CacheStats> run_chain_on_cpu(const ChainSpec& c, const CpuBackendOptions& opts, bool* correct) {
  const BuiltPlan bp = build_chain_plan(c);
  auto cpu = CpuBackend::make(opts);
  if (!cpu.ok()) return cpu.status();
  LoopProvider provider;
  auto runner = exec::Runner::make(bp.plan, (*cpu)->backend(), provider.provider());
  if (!runner.ok()) return runner.status();
  std::mt19937_64 rng(7);
  RunBuffers b;
  for (std::uint64_t bytes : bp.input_bytes) {
    b.inputs.emplace_back(bytes, 0);
    fill_random(b.inputs.back(), kF64, rng);
  }
  for (std::uint64_t bytes : bp.output_bytes) b.outputs.emplace_back(bytes, 0);
  RunBuffers expect = b;
  reference_run(c, bp, expect, bp.plan.scalars, {});
  std::vector<void*> ins, outs;
  for (auto& x : b.inputs) ins.push_back(x.data());
  for (auto& x : b.outputs) outs.push_back(x.data());
  if (Status st = (*runner)->run(exec::RunArgs{ins, outs, {}}); !st.ok()) return st;
  *correct = (*cpu)->generated_kernels() == 1 &&
             first_difference(expect.outputs[0], b.outputs[0], c.steps.back().out_dtype) == -1;
  return (*cpu)->stats();
}

// cache_chain on a CpuBackend caching under `dir`.
inline Result<CacheStats> run_cache_chain(const std::string& dir, bool* correct) {
  return run_chain_on_cpu(cache_chain(), CpuBackendOptions::with_cache_dir(dir), correct);
}

}  // namespace crucible::mimic::test
