// ExecExt.cpp — _crucible_exec, the pybind11 module of the exec stage on recorded steps: a step's
// execution plan built the whole way (trace -> IR001 -> Forge's front end -> IR002 -> plan) and
// run on the null backend or Mimic's CPU backend, library calls through the ATen provider (Note
// [ATen provider]). A module of its own because it links LLVM (the CPU backend), which
// _crucible_ext, imported by every user of crucible_native, does not need; crucible_native
// loads it on first use (_native.load_exec), after _crucible_ext, which registers Trace.
// crucible.compile's replay does not use it yet.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "AtenProvider.h"
#include "crucible/exec/BuildPlan.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/forge/Ir001.h"
#include "crucible/forge/Passes.h"
#include "crucible/forge/Rules.h"
#include "crucible/graph/Analysis.h"
#include "crucible/mimic/CpuBackend.h"
#include "crucible/record/Trace.h"

namespace py = pybind11;
using namespace crucible;

namespace {

void check(const Status& s) {
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kInvalidArgument) throw py::value_error(std::string(s.message()));
  throw std::runtime_error(std::string(s.message()));
}

struct ExecPlanHandle {
  forge::ExprPool pool;
  exec::SteppedPlan sp;
  vessel::AtenProvider provider;
  std::unique_ptr<mimic::CpuBackend> cpu;  // backend "cpu": Mimic's generated kernels
  std::unique_ptr<exec::Runner> runner;
};

// The ops [begin, end) of `t` (a step, as its caller counted them), or else the latest
// detected iteration on `thread`, planned with the rules `hardware` in `rules_dir`.
// `escaping`: storages whose values Python holds after the step (the loss, the gradients),
// which escape beside the IR's live-out values.
std::unique_ptr<ExecPlanHandle> exec_plan(const record::Trace& t, const std::string& rules_dir,
                                          const std::string& hardware, int thread,
                                          const std::vector<std::uint64_t>& escaping,
                                          const std::string& backend, std::int64_t begin,
                                          std::int64_t end) {
  if (backend != "null" && backend != "cpu")
    throw py::value_error("exec_plan: backend must be \"null\" or \"cpu\", not \"" + backend + "\"");
  auto rules = forge::load_rules_dir(rules_dir, hardware);
  check(rules.status());
  std::vector<std::size_t> ops;
  if (begin >= 0) {
    if (end < begin || static_cast<std::uint64_t>(end) > t.ops.size())
      throw py::value_error("exec_plan: ops [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") are not in the trace's " + std::to_string(t.ops.size()) + " ops");
    for (std::int64_t i = begin; i < end; ++i) ops.push_back(static_cast<std::size_t>(i));
  } else {
    auto it = graph::analyze_latest_iteration(t, thread);
    check(it.status());
    ops = (*it)->ops();
  }
  auto h = std::make_unique<ExecPlanHandle>();
  auto ir = forge::build_ir001(t, ops, h->pool);
  check(ir.status());
  auto fe = forge::run_front_end(std::move(*ir), *rules, forge::Policy{}, 1e15);
  check(fe.status());
  exec::PlanOptions opt;
  opt.escaping.emplace();
  for (std::uint32_t v = 0; v < fe->ir.values.size(); ++v) {
    const forge::Value& val = fe->ir.values[v];
    const bool held = val.producer != forge::kNoNode &&
                      std::find(escaping.begin(), escaping.end(), val.storage) != escaping.end();
    if (val.live_out || held) opt.escaping->push_back(v);
  }
  auto plan = exec::build_plan(fe->ir, fe->plan, opt);
  check(plan.status());
  h->sp = exec::SteppedPlan{std::move(fe->ir), std::move(fe->plan), std::move(*plan)};
  exec::Backend b = exec::null_backend();
  if (backend == "cpu") {  // no disk cache: a test's kernels stay out of the user's cache
    auto cpu = mimic::CpuBackend::make(mimic::CpuBackendOptions::memory_only());
    check(cpu.status());
    h->cpu = std::move(*cpu);
    b = h->cpu->backend();
  }
  auto r = exec::Runner::make(h->sp.plan, b, h->provider.provider());
  check(r.status());
  h->runner = std::move(*r);
  return h;
}

py::list bindings(const exec::ExecutionPlan& p, const std::vector<std::uint32_t>& slots) {
  py::list l;
  for (std::uint32_t s : slots) l.append(py::make_tuple(p.slots[s].storage, p.slots[s].bytes));
  return l;
}

}  // namespace

PYBIND11_MODULE(_crucible_exec, m) {
  m.doc() = "Crucible's exec stage on recorded steps (native part); use crucible_native instead";
  py::class_<ExecPlanHandle>(m, "ExecPlan")
      .def_property_readonly("inputs",  // (recorded storage id, bytes) per input binding
                             [](const ExecPlanHandle& h) { return bindings(h.sp.plan, h.sp.plan.inputs); })
      .def_property_readonly("outputs",
                             [](const ExecPlanHandle& h) { return bindings(h.sp.plan, h.sp.plan.outputs); })
      .def("describe", [](const ExecPlanHandle& h) { return exec::describe(h.sp.plan); })
      .def("kernels",  // per plan kernel on the cpu backend: (generated, generated calls, why not)
           [](const ExecPlanHandle& h) {
             py::list l;
             if (h.cpu)
               for (const mimic::CpuKernelState& k : h.cpu->kernels())
                 l.append(py::make_tuple(k.generated, k.generated_calls, k.why));
             return l;
           })
      .def("run",  // the storages' base addresses, in binding order
           [](ExecPlanHandle& h, const std::vector<std::uintptr_t>& inputs,
              const std::vector<std::uintptr_t>& outputs) {
             std::vector<void*> in, out;
             for (std::uintptr_t a : inputs) in.push_back(reinterpret_cast<void*>(a));
             for (std::uintptr_t a : outputs) out.push_back(reinterpret_cast<void*>(a));
             Status st;
             {
               py::gil_scoped_release nogil;
               st = h.runner->run(exec::RunArgs{in, out, {}});
             }
             check(st);
             const vessel::AtenProviderStats& s = h.provider.stats();
             py::dict d;
             d["calls"] = s.calls;
             d["in_place"] = s.in_place;
             d["out_variant"] = s.out_variant;
             d["copied"] = s.copied;
             d["generated_kernels"] = h.cpu ? h.cpu->generated_kernels() : 0u;
             std::uint32_t generated_calls = 0;
             if (h.cpu)
               for (const mimic::CpuKernelState& k : h.cpu->kernels()) generated_calls += k.generated_calls;
             d["generated_calls"] = generated_calls;
             d["library_launches"] = h.cpu ? h.cpu->library_launches() : std::uint64_t{0};
             return d;
           });
  m.def("exec_plan", &exec_plan, py::arg("trace"), py::arg("rules_dir"),
        py::arg("hardware") = "cpu-avx2", py::arg("thread") = -1,
        py::arg("escaping") = std::vector<std::uint64_t>{}, py::arg("backend") = "null",
        py::arg("begin") = -1, py::arg("end") = -1);
}
