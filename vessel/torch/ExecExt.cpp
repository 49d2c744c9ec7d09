// ExecExt.cpp — _crucible_exec, the pybind11 module of the exec stage on recorded steps: a step's
// execution plan built the whole way (trace -> IR001 -> Forge's front end -> IR002 -> plan) and
// run on the null backend or Mimic's CPU backend, library calls through the ATen provider (Note
// [ATen provider]). A module of its own because it links LLVM (the CPU backend), which
// _crucible_ext, imported by every user of crucible_native, does not need; crucible_native
// loads it on first use (_native.load_exec), after _crucible_ext, which registers Trace.
// crucible.compile(step, backend="null" | "cpu") runs its whole-step plans through the same
// stage (attach_exec, Note [Exec replay]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ExecReplay.h"
#include "crucible/graph/Analysis.h"

namespace py = pybind11;
using namespace crucible;

namespace {

void check(const Status& s) {
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kInvalidArgument) throw py::value_error(message_of(s));
  throw std::runtime_error(message_of(s));
}

using ExecPlanHandle = vessel::ExecStep;

// The ops [begin, end) of `t` (a step, as its caller counted them), or else the latest
// detected iteration on `thread`, planned with the rules `hardware` in `rules_dir`.
// `escaping`: storages whose values Python holds after the step (the loss, the gradients),
// which escape beside the IR's live-out values.
std::unique_ptr<ExecPlanHandle> exec_plan(const record::Trace& t, const std::string& rules_dir,
                                          const std::string& hardware, int thread,
                                          const std::vector<std::uint64_t>& escaping,
                                          const std::string& backend, std::int64_t begin,
                                          std::int64_t end) {
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
  vessel::ExecStepOptions o;
  o.rules_dir = rules_dir;
  o.hardware = hardware;
  o.backend = backend;
  o.escaping = escaping;
  o.memory_only_cache = true;  // a test's kernels stay out of the user's cache
  auto h = vessel::plan_exec_step(t, ops, o);
  check(h.status());
  return std::move(*h);
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
             d["out_failed"] = s.out_failed;
             d["functional"] = s.functional;
             d["copied"] = s.copied;
             d["adopted"] = s.adopted;
             d["generated_kernels"] = h.cpu ? h.cpu->generated_kernels() : 0u;
             d["generated_calls"] = h.generated_calls();
             d["library_launches"] = h.cpu ? h.cpu->library_launches() : std::uint64_t{0};
             return d;
           });
  m.def(
      "attach_exec",  // "" or why the plan keeps running its ATen ops
      [](std::int64_t plan, const record::Trace& t, std::size_t begin, std::size_t end,
         const std::vector<std::uint64_t>& arg_storages, const std::string& rules_dir, const std::string& hardware,
         const std::string& backend, std::int64_t form, const std::string& numerics) {
        if (backend != "null" && backend != "cpu")
          throw py::value_error("attach_exec: backend must be \"null\" or \"cpu\", not \"" + backend + "\"");
        if (numerics != "bitwise" && numerics != "fast")
          throw py::value_error("attach_exec: numerics must be \"bitwise\" or \"fast\", not \"" + numerics + "\"");
        vessel::ExecStepOptions o;
        o.rules_dir = rules_dir;
        o.hardware = hardware;
        o.backend = backend;
        o.fast = numerics == "fast";
        return vessel::attach_exec(plan, t, begin, end, arg_storages, o, form);
      },
      py::arg("plan"), py::arg("trace"), py::arg("begin"), py::arg("end"), py::arg("arg_storages"),
      py::arg("rules_dir"), py::arg("hardware") = "cpu-avx2", py::arg("backend") = "cpu", py::arg("form") = -1,
      py::arg("numerics") = "bitwise");
  m.def("bind_exec", &vessel::bind_exec, py::arg("bound"), py::arg("plan_a"), py::arg("plan_b"));
  m.def("exec_plan", &exec_plan, py::arg("trace"), py::arg("rules_dir"),
        py::arg("hardware") = "cpu-avx2", py::arg("thread") = -1,
        py::arg("escaping") = std::vector<std::uint64_t>{}, py::arg("backend") = "null",
        py::arg("begin") = -1, py::arg("end") = -1);
}
