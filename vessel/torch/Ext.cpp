// Ext.cpp — _crucible_ext, the pybind11 module behind crucible_native.py.
//
// It passes no tensors across the boundary (so it needs no libtorch_python): storages are
// named by their StorageImpl address, which Python reads as `storage._cdata`.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

#include "Dispatch.h"
#include "Replay.h"
#include "crucible/core/ScalarType.h"
#include "crucible/record/Recorder.h"
#include "crucible/graph/Analysis.h"
#include "crucible/graph/Dot.h"
#include "crucible/pipeline/Pipeline.h"
#include "crucible/record/TraceFile.h"

namespace py = pybind11;
using namespace crucible;
using namespace crucible::record;

namespace {

// Errors reach Python as crucible_native's exception types, by kind (set_error_types): a call
// valid but not now (the recorder already made, a forked child) as CrucibleStateError, a bad
// argument as CrucibleValueError, the rest as CrucibleError.
struct StateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(const Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case absl::StatusCode::kFailedPrecondition:
      throw StateError(message_of(s));
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw ArgumentError(message_of(s));
    default:
      throw std::runtime_error(message_of(s));
  }
}

py::dict tensor_dict(const Trace& t, std::size_t idx) {
  const TensorMeta& m = t.tensors[idx];
  py::dict d;
  auto sz = t.sizes(idx);
  auto st = t.strides(idx);
  d["shape"] = py::tuple(py::cast(std::vector<std::int64_t>(sz.begin(), sz.end())));
  d["stride"] = py::tuple(py::cast(std::vector<std::int64_t>(st.begin(), st.end())));
  d["dtype"] = std::string(scalar_type_info(m.dtype).name);
  d["dtype_ordinal"] = static_cast<int>(m.dtype);
  d["device"] = std::string(device_kind_name(static_cast<DeviceKind>(m.device_kind)));
  d["device_index"] = static_cast<int>(m.device_index);
  d["layout"] = std::string(layout_kind_name(static_cast<LayoutKind>(m.layout)));
  d["storage_id"] = m.storage_id;
  d["storage_offset"] = m.storage_offset;
  d["storage_nbytes"] = m.storage_nbytes;
  d["version"] = m.version;
  d["data_ptr"] = m.data_ptr;
  d["arg"] = m.arg_index;
  d["list_index"] = m.list_index;
  d["requires_grad"] = (m.flags & tensor_flag::kRequiresGrad) != 0;
  d["is_view"] = (m.flags & tensor_flag::kIsView) != 0;
  d["wrapped_number"] = (m.flags & tensor_flag::kWrappedNumber) != 0;
  d["wrapped_value"] = m.wrapped_value;
  d["inference"] = (m.flags & tensor_flag::kInference) != 0;
  d["has_storage"] = (m.flags & tensor_flag::kNoStorage) == 0;
  return d;
}

py::object scalar_value(const ScalarRecord& s) {
  switch (s.kind) {
    case ScalarKind::None: return py::none();
    case ScalarKind::Int: return py::int_(static_cast<std::int64_t>(s.bits));
    case ScalarKind::Bool: return py::bool_(s.bits != 0);
    case ScalarKind::Double:
    case ScalarKind::ComplexReal:
    case ScalarKind::ComplexImag: {
      double d;
      std::memcpy(&d, &s.bits, 8);
      return py::float_(d);
    }
    default: return py::int_(s.bits);
  }
}

const char* scalar_kind_name(ScalarKind k) {
  static const char* names[] = {"none", "int", "float", "bool", "complex_real", "complex_imag",
                                "string", "list", "device", "tensor_list", "other", "unknown"};
  const auto i = static_cast<std::size_t>(k);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

py::dict op_dict(const Trace& t, std::size_t i) {
  const TraceEntry& e = t.ops[i];
  py::dict d;
  d["name"] = t.schema_name(e.schema_hash);
  d["schema_hash"] = e.schema_hash;
  d["phase"] = std::string(phase_name(e.phase));
  d["seq"] = e.seq;
  d["thread"] = e.thread;
  d["module"] = t.module_path(e.module_id);
  d["stream"] = e.stream;
  d["mutable"] = (e.flags & op_flag::kMutable) != 0;
  d["grad_mode"] = (e.flags & op_flag::kGradMode) != 0;
  d["inference_mode"] = (e.flags & op_flag::kInferenceMode) != 0;
  d["after_drop"] = (e.flags & op_flag::kAfterDrop) != 0;
  py::list ins, outs, scalars;
  const std::size_t base = t.op_tensor_begin[i];
  for (std::size_t k = 0; k < e.n_tensors; ++k) (k < e.n_inputs ? ins : outs).append(tensor_dict(t, base + k));
  for (const ScalarRecord& s : t.scalars_of(i))
    scalars.append(py::make_tuple(scalar_kind_name(s.kind), s.arg_index, s.aux, scalar_value(s)));
  d["inputs"] = ins;
  d["outputs"] = outs;
  d["scalars"] = scalars;
  return d;
}

py::dict stats_dict(const std::vector<ThreadStats>& threads) {
  py::dict d, per_phase;
  std::uint64_t ops[kNumPhases] = {}, dropped = 0, bytes = 0, waits = 0;
  py::list per_thread;
  for (const auto& s : threads) {
    py::dict td;
    td["thread"] = s.thread;
    for (int p = 0; p < kNumPhases; ++p) {
      td[phase_name(static_cast<Phase>(p))] = s.ops[p];
      ops[p] += s.ops[p];
    }
    td["dropped"] = s.dropped;
    td["bytes"] = s.bytes;
    td["waits"] = s.waits;
    dropped += s.dropped;
    bytes += s.bytes;
    waits += s.waits;
    per_thread.append(td);
  }
  std::uint64_t total = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    per_phase[phase_name(static_cast<Phase>(p))] = ops[p];
    total += ops[p];
  }
  d["ops"] = per_phase;
  d["total"] = total;
  d["dropped"] = dropped;
  d["bytes"] = bytes;
  d["waits"] = waits;
  d["threads"] = per_thread;
  return d;
}

// A live storage given its StorageImpl address (Python: storage._cdata); null for 0.
c10::Storage storage_at(std::uintptr_t cdata) {
  if (cdata == 0) return c10::Storage();
  auto* impl = reinterpret_cast<c10::StorageImpl*>(cdata);
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
}

// Storage id of a live storage. Shares the recorder's id table and allocation tags, so ids
// match the ones in recorded tensor metadata.
std::uint64_t storage_id_of(std::uintptr_t cdata) { return vessel::storage_id(storage_at(cdata)); }

// Does the storage's memory carry its id (Note [Allocation tags])? For tests.
bool storage_is_tagged_of(std::uintptr_t cdata) { return vessel::storage_is_tagged(storage_at(cdata)); }

// check_plan of the iteration's plan, computed once per analysis: crucible.iteration() is called
// again and again on one published analysis (shared by the iterations that reuse it), and the
// check is a sweep over the plan's blocks (36 ms for 200k). Callers hold the GIL.
bool plan_ok_of(const graph::Iteration& it) {
  static std::weak_ptr<const graph::IterationAnalysis> checked;
  static bool ok = false;
  if (checked.lock() != it.analysis) {
    ok = graph::check_plan(*it.plan()).ok();
    checked = it.analysis;
  }
  return ok;
}

py::dict iteration_dict(const graph::Iteration& it) {
    py::dict d, phases;
    for (int p = 0; p < kNumPhases; ++p)
      phases[phase_name(static_cast<Phase>(p))] = it.ops_per_phase()[p];
    d["thread"] = it.thread;
    d["ops"] = phases;
    d["total_ops"] = it.ops().size();
    d["first_op"] = it.ops().empty() ? 0 : it.ops().front();
    d["iterations"] = it.report.segments.size();
    d["steady_iterations"] = it.report.steady_count();
    d["first_differs"] = it.report.first_differs;
    d["variant_every"] = it.report.variant_every;
    d["summary"] = it.report.reason;
    // Ops recorded right after dropped ones (drop_when_full): not zero, the iteration is incomplete.
    d["ops_after_drop"] = it.analysis->ops_after_drop;
    d["incomplete"] = it.incomplete();
    d["root_hash"] = it.dag().root().hex();
    d["edges"] = it.graph().num_edges();
    d["externals"] = it.graph().externals().size();
    py::list regions;
    for (const auto& rg : it.dag().regions()) {
      py::dict rd;
      rd["kind"] = rg.kind == graph::RegionKind::Phase ? "phase" : "module";
      rd["name"] = rg.kind == graph::RegionKind::Phase
                       ? std::string(phase_name(static_cast<Phase>(rg.label)))
                       : std::string(rg.module_path());
      rd["begin"] = rg.begin;
      rd["end"] = rg.end;
      rd["hash"] = rg.hash.hex();
      regions.append(rd);
    }
    d["regions"] = regions;
    if (it.plan()) {
      d["arena_bytes"] = it.plan()->arena_bytes;
      d["lower_bound_bytes"] = it.plan()->lower_bound;
      d["plan_ratio"] = it.plan()->ratio();
      d["persistent_bytes"] = it.plan()->persistent_bytes;
      d["plan_blocks"] = it.plan()->blocks.size();
      // Greedy by size, or time order when greedy passed its visit budget (MemoryPlan.h).
      d["plan_placement"] = it.plan()->first_fit ? "greedy by size" : "time order";
      d["plan_ok"] = plan_ok_of(it);
      d["plan_error"] = py::none();
    } else {
      d["plan_error"] = message_of(it.plan_status());
    }
  return d;
}

// crucible.compile's per-call guard (crucible_native._StateGuard builds it): snapshots of the
// dicts and lists that hold a step's modules' and optimizers' state, checked by identity (or
// equality for hyperparameters and flags) without hashing keys — optimizer state is keyed by
// parameter tensors, whose __hash__ is Python code.
class StateGuard {
 public:
  enum Mode : int { kIdentity = 0, kEqual = 1, kIgnore = 2 };
  // keys: (dict, str key, value, mode); dicts: (dict, [(key, value, mode)]) compared entry by
  // entry in order; lists: (list, [items]) by identity; attrs: (object, str name, value, mode);
  // cells: (closure cell, value, mode). crucible_native.purity.PythonGuard builds one from a
  // fingerprint of what a step's code reaches.
  StateGuard(py::list keys, py::list dicts, py::list lists, py::list attrs, py::list cells) {
    for (py::handle h : attrs) {
      auto t = h.cast<py::tuple>();
      attrs_.push_back(Attr{py::reinterpret_borrow<py::object>(t[0]), t[1].cast<py::str>(),
                            py::reinterpret_borrow<py::object>(t[2]), t[3].cast<int>()});
    }
    for (py::handle h : cells) {
      auto t = h.cast<py::tuple>();
      if (!PyCell_Check(t[0].ptr())) throw py::type_error("StateGuard: a cells entry is not a closure cell");
      cells_.push_back(Cell{py::reinterpret_borrow<py::object>(t[0]), py::reinterpret_borrow<py::object>(t[1]),
                            t[2].cast<int>()});
    }
    for (py::handle h : keys) {
      auto t = h.cast<py::tuple>();
      keys_.push_back(Key{t[0].cast<py::dict>(), t[1].cast<py::str>(), py::reinterpret_borrow<py::object>(t[2]), t[3].cast<int>()});
    }
    for (py::handle h : dicts) {
      auto t = h.cast<py::tuple>();
      Dict d{t[0].cast<py::dict>(), {}};
      for (py::handle e : t[1].cast<py::list>()) {
        auto et = e.cast<py::tuple>();
        d.items.push_back(Item{py::reinterpret_borrow<py::object>(et[0]), py::reinterpret_borrow<py::object>(et[1]), et[2].cast<int>()});
      }
      dicts_.push_back(std::move(d));
    }
    for (py::handle h : lists) {
      auto t = h.cast<py::tuple>();
      List l{t[0].cast<py::list>(), {}};
      for (py::handle e : t[1].cast<py::list>()) l.items.push_back(py::reinterpret_borrow<py::object>(e));
      lists_.push_back(std::move(l));
    }
  }

  bool ok() const {
    for (const Key& k : keys_) {
      PyObject* x = PyDict_GetItemWithError(k.dict.ptr(), k.key.ptr());  // borrowed
      if (x == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return false;
      }
      if (!same(x, k.value.ptr(), k.mode)) return false;
    }
    for (const Dict& d : dicts_) {
      if (static_cast<std::size_t>(PyDict_Size(d.dict.ptr())) != d.items.size()) return false;
      Py_ssize_t pos = 0;
      PyObject *key, *value;
      std::size_t i = 0;
      while (PyDict_Next(d.dict.ptr(), &pos, &key, &value)) {
        const Item& it = d.items[i++];
        if (key != it.key.ptr() || !same(value, it.value.ptr(), it.mode)) return false;
      }
    }
    for (const List& l : lists_) {
      if (static_cast<std::size_t>(PyList_GET_SIZE(l.list.ptr())) != l.items.size()) return false;
      for (std::size_t i = 0; i < l.items.size(); ++i)
        if (PyList_GET_ITEM(l.list.ptr(), static_cast<Py_ssize_t>(i)) != l.items[i].ptr()) return false;
    }
    for (const Cell& c : cells_) {
      PyObject* x = PyCell_GET(c.cell.ptr());  // borrowed; null for an empty cell
      if (x == nullptr ? c.value.ptr() != Py_None || c.mode != kIdentity : !same(x, c.value.ptr(), c.mode))
        return false;
    }
    for (const Attr& a : attrs_) {
      PyObject* x = PyObject_GetAttr(a.obj.ptr(), a.name.ptr());  // new reference
      if (x == nullptr) {
        PyErr_Clear();
        return false;
      }
      const bool s = same(x, a.value.ptr(), a.mode);
      Py_DECREF(x);
      if (!s) return false;
    }
    return true;
  }

 private:
  static bool same(PyObject* x, PyObject* v, int mode) {
    if (x == v || mode == kIgnore) return true;
    if (mode == kIdentity) return false;
    const int r = PyObject_RichCompareBool(x, v, Py_EQ);
    if (r < 0) throw py::error_already_set();
    return r == 1;
  }
  struct Key {
    py::dict dict;
    py::str key;
    py::object value;
    int mode;
  };
  struct Item {
    py::object key, value;
    int mode;
  };
  struct Dict {
    py::dict dict;
    std::vector<Item> items;
  };
  struct List {
    py::list list;
    std::vector<py::object> items;
  };
  struct Attr {
    py::object obj;
    py::str name;
    py::object value;
    int mode;
  };
  struct Cell {
    py::object cell, value;  // value None with kIdentity: the cell was empty
    int mode;
  };
  std::vector<Key> keys_;
  std::vector<Dict> dicts_;
  std::vector<List> lists_;
  std::vector<Attr> attrs_;
  std::vector<Cell> cells_;
};

// The background pipeline's plan options (crucible.configure(memory_budget=, plan_alignment=)),
// fixed when the pipeline starts: its cached analyses were planned with them.
std::mutex g_pipeline_mu;
graph::PlanOptions g_plan_options;
std::atomic<pipeline::Pipeline*> g_pipeline{nullptr};

// Thrown for what a forked child cannot do; Python sees it as crucible_native.CrucibleStateError,
// whichever binding threw it.
struct ForkedChild : StateError {
  using StateError::StateError;
};
// crucible_native's CrucibleStateError and CrucibleValueError: strong references, set once.
PyObject* g_state_error = nullptr;
PyObject* g_value_error = nullptr;

// The process's recorder, refused in a forked child (Note [Forked children], Dispatch.cpp):
// its drain thread did not survive the fork, so a flush or a full ring would wait for ever.
Recorder& recorder() {
  if (vessel::forked_child()) throw ForkedChild(vessel::forked_child_error("a call that needs the recorder"));
  return Recorder::global();
}

pipeline::Pipeline& global_pipeline() {
  if (vessel::forked_child()) throw ForkedChild(vessel::forked_child_error("a call that needs the pipeline"));
  if (pipeline::Pipeline* p = g_pipeline.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> g(g_pipeline_mu);
  if (g_pipeline.load(std::memory_order_relaxed) == nullptr)
    // Leaked on purpose, like the global recorder: recording threads may outlive main().
    g_pipeline.store(new pipeline::Pipeline(recorder(), g_plan_options), std::memory_order_release);
  return *g_pipeline.load(std::memory_order_relaxed);
}

// check_only: only says (by throwing) whether the options would be accepted.
void configure_plan(std::uint64_t budget, std::uint64_t alignment, bool check_only) {
  std::lock_guard<std::mutex> g(g_pipeline_mu);
  graph::PlanOptions opt = g_plan_options;
  opt.budget = budget;
  opt.alignment = alignment;
  check(graph::check_plan_options(opt));
  if (pipeline::Pipeline* p = g_pipeline.load(std::memory_order_relaxed)) {
    const graph::PlanOptions& now = p->plan_options();
    if (now.budget == budget && now.alignment == alignment) return;
    throw StateError(
        "the background pipeline already runs, planning with budget " + std::to_string(now.budget) +
        " and alignment " + std::to_string(now.alignment) +
        " (the first enable(), recording(), compile() or iteration() starts it): call "
        "crucible.configure(memory_budget=..., plan_alignment=...) before those, or pass "
        "budget=/alignment= to crucible.iteration() to plan the recorded step again");
  }
  if (!check_only) g_plan_options = opt;
}

}  // namespace

// Note [Warnings of a plan run] (Replay.cpp): each warning a plan run's kernels gave, as a Python
// warning (the frame that warns is torch.ops' call); one a filter made an error raises it after a
// run that succeeded (pybind11 gives Python the warning's own exception).
static void warn_in_python(const std::vector<vessel::RunWarning>& warnings, bool run_failed) {
  py::gil_scoped_acquire gil;
  for (const vessel::RunWarning& w : warnings) {
    if (PyErr_WarnEx(w.deprecation ? PyExc_DeprecationWarning : PyExc_UserWarning,
                     w.message.c_str(), 1) == 0)
      continue;
    if (run_failed) {  // the run's own error goes on
      PyErr_Clear();
      continue;
    }
    throw py::error_already_set();
  }
}

PYBIND11_MODULE(_crucible_ext, m) {
  m.doc() = "Crucible's PyTorch Vessel (native part); use crucible_native instead";
  vessel::watch_forks();
  vessel::set_warning_sink(&warn_in_python);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StateError& e) {
      PyErr_SetString(g_state_error != nullptr ? g_state_error : PyExc_RuntimeError, e.what());
    } catch (const ArgumentError& e) {
      PyErr_SetString(g_value_error != nullptr ? g_value_error : PyExc_ValueError, e.what());
    }
  });
  m.def("set_error_types", [](py::object state_error, py::object value_error) {
    if (g_state_error == nullptr) g_state_error = state_error.release().ptr();  // kept for the process
    if (g_value_error == nullptr) g_value_error = value_error.release().ptr();
  });
  m.def("take_guard_failure", &vessel::take_guard_failure);
  m.def("forked_child", &vessel::forked_child);
  m.def("install", [](bool unboxed) { check(vessel::install(unboxed)); }, py::arg("unboxed") = true);
  m.def("install_key_floor", [] { check(vessel::install_key_floor()); });
  m.def("ablation", &vessel::ablation_name);
  m.def("has_ablation_switches", &vessel::has_ablation_switches);
  m.def("unboxed_kernel_count", &vessel::unboxed_kernel_count);
  m.def("composite_fallthrough_count", &vessel::composite_fallthrough_count);
  m.def("installed", &vessel::installed);
  m.def("key_floor_installed", &vessel::key_floor_installed);
  m.def("dispatch_key", &vessel::dispatch_key_name);
  m.def("set_enabled", &vessel::set_enabled);
  m.def("is_enabled", &vessel::is_enabled);
  m.def("intern_module",
        [](const std::string& path) {
          auto id = recorder().intern_module(path);
          if (!id.ok()) throw std::invalid_argument(message_of(id.status()));
          return *id;
        });
  m.def("push_module_id", [](std::uint32_t id) {
    if (const std::uint32_t n = recorder().num_modules(); id >= n)
      throw std::invalid_argument("module id " + std::to_string(id) + " was not interned (" +
                                  std::to_string(n) + " exist): use an id from intern_module");
    return vessel::push_module_id(id);
  });
  m.def("pop_modules_to_if", &vessel::pop_modules_to_if);
  m.def("pop_modules_to", &vessel::pop_modules_to);
  m.def("configure", [](std::uint32_t entries, std::uint32_t cells, std::uint32_t scalars, bool check_only) {
    RecorderConfig cfg;
    cfg.ring_entries = entries;
    cfg.meta_cells = cells;
    cfg.scalar_slots = scalars;
    check(Recorder::configure_global(cfg, !check_only));
  }, py::arg("entries"), py::arg("cells"), py::arg("scalars"), py::arg("check_only") = false);
  m.def("ring_memory_limit", &Recorder::ring_memory_limit);
  m.def("set_drop_when_full", [](bool on) { recorder().set_drop_when_full(on); });
  m.def("drop_when_full", [] { return recorder().drop_when_full(); });
  m.def("set_thread_drop_when_full",
        [](bool on) { recorder().set_thread_drop_when_full(on); });
  m.def("thread_drop_when_full", [] { return recorder().thread_drop_when_full(); });
  m.def("flush", [] {
    py::gil_scoped_release nogil;
    recorder().flush();
  });
  m.def("clear", [] {
    py::gil_scoped_release nogil;
    recorder().clear();
  });
  m.def("stats", [] {
    py::dict d = stats_dict(recorder().thread_stats());
    const auto sk = vessel::skip_counters();
    py::dict skipped;
    skipped["internal"] = sk.internal;
    skipped["decomposed"] = sk.decomposed;
    skipped["profiler"] = sk.profiler;
    d["skipped"] = skipped;
    d["storage_ids"] = vessel::storage_id_scheme();
    return d;
  });
  m.def("storage_id", &storage_id_of);
  m.def("storage_is_tagged", &storage_is_tagged_of);
  m.def("tagged_raw_frees", &vessel::tagged_raw_frees);
  m.def("classify_external", [](std::uint64_t sid, int kind) {
    if (kind < 1 || kind > kMaxExternalKind) throw std::invalid_argument("unknown external kind " + std::to_string(kind));
    recorder().classify_external(sid, static_cast<ExternalKind>(kind));
  });

  py::class_<Trace>(m, "Trace")
      .def("__len__", &Trace::num_ops)
      .def("op", [](const Trace& t, std::size_t i) {
        if (i >= t.num_ops()) throw py::index_error("op index " + std::to_string(i) + " out of range");
        return op_dict(t, i);
      })
      .def("ops", [](const Trace& t) {
        py::list l;
        for (std::size_t i = 0; i < t.num_ops(); ++i) l.append(op_dict(t, i));
        return l;
      })
      .def("stats", [](const Trace& t) { return stats_dict(t.threads); })
      .def_property_readonly("schema_names", [](const Trace& t) { return t.schema_names; })
      .def_property_readonly("module_paths", [](const Trace& t) { return t.module_paths; })
      .def_property_readonly("externals", [](const Trace& t) {
        py::dict d;
        std::vector<std::pair<std::uint64_t, ExternalKind>> sorted(t.externals.begin(), t.externals.end());
        std::sort(sorted.begin(), sorted.end());  // a stable order for the user
        for (const auto& [sid, k] : sorted) d[py::int_(sid)] = external_kind_name(k);
        return d;
      })
      .def("save", [](const Trace& t, const std::string& path) { check(save_trace(t, path)); })
      // is_operator: a Trace compared with anything else is NotImplemented, so == gives False.
      .def("__eq__", [](const Trace& a, const Trace& b) { return a == b; }, py::is_operator());

  m.def("snapshot", [] {
    py::gil_scoped_release nogil;
    return recorder().snapshot();
  });
  m.def("load_trace", [](const std::string& path) {
    auto r = load_trace(path);
    check(r.status());
    return std::move(*r);
  });
  m.def("iteration", [](const Trace& t, int thread, std::uint64_t budget, std::uint64_t alignment) {
    graph::PlanOptions opt;
    opt.budget = budget;
    opt.alignment = alignment;
    auto r = graph::analyze_latest_iteration(t, thread, opt);
    check(r.status());
    return iteration_dict(**r);
  }, py::arg("trace"), py::arg("thread") = -1, py::arg("budget") = 0, py::arg("alignment") = 64);
  m.def("published_iteration", [] {
    pipeline::Pipeline& p = global_pipeline();
    {
      py::gil_scoped_release nogil;
      p.flush();
    }
    auto it = p.latest();
    if (!it) throw std::runtime_error("no iteration published yet: " + p.last_reason());
    py::dict d = iteration_dict(*it);
    const auto st = p.stats();
    d["pipeline_builds"] = st.builds;
    d["pipeline_build_us"] = static_cast<double>(st.last_build_ns) / 1000.0;
    d["pipeline_copy_us"] = static_cast<double>(st.last_copy_ns) / 1000.0;
    d["pipeline_build_cpu_us"] = static_cast<double>(st.last_build_cpu_ns) / 1000.0;
    d["pipeline_graph_us"] = static_cast<double>(st.last_graph_ns) / 1000.0;
    d["pipeline_dag_us"] = static_cast<double>(st.last_dag_ns) / 1000.0;
    d["pipeline_plan_us"] = static_cast<double>(st.last_plan_ns) / 1000.0;
    d["pipeline_reused"] = st.reused;
    d["pipeline_reuse_us"] = static_cast<double>(st.last_reuse_ns) / 1000.0;
    d["pipeline_rewired"] = st.rewired;
    d["pipeline_rewire_us"] = static_cast<double>(st.last_rewire_ns) / 1000.0;
    d["pipeline_cached"] = st.cached;  // analyses kept for reuse (Note [Reusing earlier builds])
    d["pipeline_recycled"] = st.recycled;  // copies into an earlier copy's memory (Note [Recycled copies])
    d["pipeline_build_faults"] = st.last_build_faults;  // minor page faults of the last build
    // Whether ops recorded after this iteration (on its thread) are no loop: then this is the
    // last iteration found before them, and crucible.iteration() warns (Pipeline::Detection).
    const pipeline::Pipeline::Detection last = p.last_detection();
    d["pipeline_stale"] = last.any && !last.periodic && last.thread == it->thread;
    d["pipeline_last_detection"] = last.reason;
    d["pipeline_plan_budget"] = p.plan_options().budget;  // crucible.configure(memory_budget=)
    d["pipeline_plan_alignment"] = p.plan_options().alignment;
    // Structure keys from the drain's wiring log vs the trace's own pass (Note [Wiring log]).
    d["keys_from_log"] = recorder().keys_from_log();
    d["keys_from_trace"] = recorder().keys_from_trace();
    return d;
  });
  // The build stage's work on the latest published iteration, repeated back to back on this
  // thread: structure key and storage numbering, a copy of the ops, graph + Merkle DAG + memory
  // plan (the ops' contents are computed first, as the drain does). Returns the microseconds of
  // each round and the root hash built. It is the build's own cost on a busy core; the
  // pipeline's build runs on a core that was idle, and pays for waking up (pipeline_bench.py
  // reports both). Differences from the pipeline's build: the copy is of the published copy,
  // one contiguous run without the recorder's lock, and every round reads the same, warm ops.
  // evict_mib > 0: before each round, write that many MiB of another buffer (outside the
  // timing), so the round starts with the caches holding none of the build's code or data,
  // as the pipeline's build thread finds them after its core was lent to other work.
  m.def(
      "time_build",
      [](int rounds, int evict_mib) {
        if (rounds < 1) throw std::invalid_argument("rounds must be at least 1");
        if (evict_mib < 0 || evict_mib > 1024)
          throw std::invalid_argument("evict_mib must be in 0..1024");
        std::vector<unsigned char> junk(static_cast<std::size_t>(evict_mib) << 20);
        pipeline::Pipeline& p = global_pipeline();
        std::vector<double> us, key_us, copy_us, graph_us, dag_us, plan_us;
        auto us_of = [](auto d) { return std::chrono::duration<double, std::micro>(d).count(); };
        ContentHash root;
        {
          py::gil_scoped_release nogil;
          p.flush();
          auto it = p.latest();
          if (!it || !it->trace)
            throw std::runtime_error("no built iteration published yet: " + p.last_reason());
          const Trace& t = *it->trace;
          std::vector<std::size_t> ops(t.num_ops());
          for (std::size_t i = 0; i < ops.size(); ++i) ops[i] = i;
          std::vector<ContentHash> contents(ops.size());
          for (std::size_t i = 0; i < ops.size(); ++i) contents[i] = op_content(t, i);
          for (int r = 0; r < rounds; ++r) {
            for (std::size_t i = 0; i < junk.size(); i += 64)
              junk[i] = static_cast<unsigned char>(junk[i] + 1);
            asm volatile(""
                         :
                         : "r"(junk.data())
                         : "memory");  // the writes happen: nothing reads them
            const auto t0 = std::chrono::steady_clock::now();
            StorageNumbering numbering;
            const ContentHash body = structure_body(t, ops, numbering, contents);
            classify_storages(t, numbering);
            (void)structure_key(body, numbering.kinds);
            const auto t_key = std::chrono::steady_clock::now();
            auto copy = std::make_shared<Trace>(t);
            const auto t_copy = std::chrono::steady_clock::now();
            graph::BuildTimes parts;
            auto built = graph::build_iteration(*copy, ops, p.plan_options(), contents,
                                                std::move(numbering), &parts);
            const auto t1 = std::chrono::steady_clock::now();
            us.push_back(us_of(t1 - t0));
            key_us.push_back(us_of(t_key - t0));
            copy_us.push_back(us_of(t_copy - t_key));
            graph_us.push_back(static_cast<double>(parts.graph_ns) / 1000.0);
            dag_us.push_back(static_cast<double>(parts.dag_ns) / 1000.0);
            plan_us.push_back(static_cast<double>(parts.plan_ns) / 1000.0);
            root = built->dag().root();
          }
        }
        py::dict d;
        d["us"] = us;  // each round's whole build, then its parts
        d["key_us"] = key_us;
        d["copy_us"] = copy_us;
        d["graph_us"] = graph_us;
        d["dag_us"] = dag_us;
        d["plan_us"] = plan_us;
        d["root_hash"] = root.hex();
        return d;
      },
      py::arg("rounds"), py::arg("evict_mib") = 0);
  m.def("start_pipeline", [] { (void)global_pipeline(); });
  m.def("configure_plan", &configure_plan, py::arg("budget"), py::arg("alignment"), py::arg("check_only") = false);
  m.def("pipeline_reuse", [](bool on) { global_pipeline().set_reuse(on); }, py::arg("on"));
  m.def("export_graph", [](const Trace& t, const std::string& path, int thread) {
    auto r = graph::analyze_latest_iteration(t, thread);
    check(r.status());
    const std::string dot = graph::to_dot(t, (*r)->graph());
    // Replaces path whole, or leaves it as it was (a full disk leaves no partial graph).
    check(write_file_replacing(path, std::as_bytes(std::span<const char>(dot)), "export_graph"));
    return (*r)->ops().size();
  }, py::arg("trace"), py::arg("path"), py::arg("thread") = -1);
  // Which of these parameters have no .grad (bit i: params[i].grad is None), as an int, or a
  // tuple of 64-bit words past 64 parameters: part of crucible.compile's call signature.
  m.def("grads_none_mask", [](py::list params) -> py::object {
    static PyObject* const grad_name = PyUnicode_InternFromString("grad");  // immortal: never freed
    const Py_ssize_t n = PyList_GET_SIZE(params.ptr());
    std::vector<std::uint64_t> words(static_cast<std::size_t>((n + 63) / 64), 0);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* g = PyObject_GetAttr(PyList_GET_ITEM(params.ptr(), i), grad_name);
      if (g == nullptr) throw py::error_already_set();
      if (g == Py_None) words[static_cast<std::size_t>(i / 64)] |= std::uint64_t{1} << (i % 64);
      Py_DECREF(g);
    }
    if (words.size() <= 1) return py::int_(words.empty() ? 0 : words[0]);
    return py::tuple(py::cast(words));
  });
  py::class_<StateGuard>(m, "StateGuard")
      .def(py::init<py::list, py::list, py::list, py::list, py::list>(), py::arg("keys"), py::arg("dicts"),
           py::arg("lists"), py::arg("attrs") = py::list(), py::arg("cells") = py::list())
      .def("ok", &StateGuard::ok);
  // crucible.compile (Replay.h). Tensors travel through the crucible:: custom ops instead.
  m.def("capture_start", [](bool capture_only) {
    check(vessel::install(true));
    vessel::capture_start(capture_only);
  }, py::arg("capture_only") = true);
  m.def("capture_stop", &vessel::capture_stop);
  m.def("capture_discard", &vessel::capture_discard);
  m.def("form_info", [](std::int64_t f) {
    const auto i = vessel::form_info(f);
    py::dict d;
    d["ops"] = i.ops;
    d["hash"] = i.hash;
    return d;
  });
  m.def("form_release", &vessel::form_release);
  // Scalar sources travel as lists of (op, arg, value, anchor data pointer) tuples.
  using SourceTuples = std::vector<std::tuple<std::string, std::string, double, std::uintptr_t>>;
  auto to_sources = [](const SourceTuples& t) {
    std::vector<vessel::ScalarSource> v;
    v.reserve(t.size());
    for (const auto& [op, arg, value, anchor] : t) v.push_back(vessel::ScalarSource{op, arg, value, anchor});
    return v;
  };
  m.def("plan_build", [to_sources](std::int64_t a, std::int64_t b, const SourceTuples& sa, const SourceTuples& sb,
                                    const std::string& runs_on) {
    return vessel::plan_build(a, b, to_sources(sa), to_sources(sb), runs_on);
  }, py::arg("a"), py::arg("b"), py::arg("sources_a"), py::arg("sources_b"), py::arg("runs_on") = "");
  m.def("plan_build_like", [to_sources](std::int64_t plan, std::int64_t form, const SourceTuples& s,
                                         const std::string& runs_on) {
    return vessel::plan_build_like(plan, form, to_sources(s), runs_on);
  }, py::arg("plan"), py::arg("form"), py::arg("sources"), py::arg("runs_on") = "");
  m.def("plan_build_pair", [to_sources](std::int64_t a, std::int64_t b, const SourceTuples& sa, const SourceTuples& sb,
                                         const std::string& runs_on) {
    return vessel::plan_build_pair(a, b, to_sources(sa), to_sources(sb), runs_on);
  }, py::arg("a"), py::arg("b"), py::arg("sources_a"), py::arg("sources_b"), py::arg("runs_on") = "");
  m.def("plan_build_sync_like", [to_sources](std::int64_t plan, std::int64_t form, const SourceTuples& s) {
    return vessel::plan_build_sync_like(plan, form, to_sources(s));
  });
  m.def("plan_build_sync", [to_sources](std::int64_t a, std::int64_t b, const SourceTuples& sa, const SourceTuples& sb) {
    return vessel::plan_build_sync(a, b, to_sources(sa), to_sources(sb));
  });
  m.def("capture_mark_end", &vessel::capture_mark_end);
  m.def("plan_same_path", &vessel::plan_same_path);
  m.def("forms_same_path", &vessel::forms_same_path);
  m.def("sync_optimizer", &vessel::sync_optimizer, py::arg("tag"), py::arg("scalars"), py::arg("guards_ok"),
        py::arg("external") = false);
  m.def("sync_resume", &vessel::sync_resume);
  m.def("sync_set_paused", &vessel::sync_set_paused);
  m.def("sync_end", [] {
    const auto r = vessel::sync_end();
    py::dict d;
    d["matched"] = r.matched;
    d["why"] = r.why;
    d["plan_ops"] = r.plan_ops;
    d["matched_ops"] = r.matched_ops;
    d["native_ops"] = r.native_ops;
    d["native_segments"] = r.native_segments;
    d["eager_stretches"] = r.eager_stretches;
    d["variant"] = r.variant;
    d["switches"] = r.switches;
    d["stale"] = r.stale;
    return d;
  });
  m.def("plan_check", [to_sources](std::int64_t plan, std::int64_t form, const SourceTuples& s) {
    return vessel::plan_check(plan, form, to_sources(s));
  });
  m.def("plan_update", [to_sources](std::int64_t plan, std::int64_t form, const SourceTuples& s) {
    std::size_t added = 0, rebound = 0;
    const std::string why = vessel::plan_update(plan, form, to_sources(s), &added, &rebound);
    return py::make_tuple(why, added, rebound);
  });
  m.def("plan_release", &vessel::plan_release);
  m.def("plan_set_arena", &vessel::plan_set_arena);
  m.def("plan_set_exec_note", &vessel::plan_set_exec_note);
  m.def("alloc_measure_start", &vessel::alloc_measure_start);
  m.def("alloc_measure_stop", &vessel::alloc_measure_stop);
  m.def("plan_info", [](std::int64_t p) {
    const auto i = vessel::plan_info(p);
    py::dict d;
    d["ops"] = i.ops;
    d["slots"] = i.slots;
    d["externals"] = i.externals;
    d["constants"] = i.constants;
    d["views"] = i.views;
    d["grad_bindings"] = i.grad_bindings;
    d["grad_checks"] = i.grad_checks;
    d["args"] = i.args;
    d["outputs"] = i.outputs;
    d["patches"] = i.patches;
    d["arena"] = i.arena;
    d["arena_bytes"] = i.arena_bytes;
    d["arena_lower_bound"] = i.arena_lower_bound;
    d["arena_served"] = i.arena_served;
    d["arena_in_exec"] = i.arena_in_exec;
    d["arena_escaping"] = i.arena_escaping;
    d["arena_runs"] = i.arena_runs;
    d["arena_mismatches"] = i.arena_mismatches;
    d["sources"] = i.sources;
    d["runs"] = i.runs;
    d["hash"] = i.hash;
    d["build_ms"] = i.build_ms;
    d["op_names"] = i.op_names;
    d["shapes"] = i.shapes;
    d["constant_uses"] = i.constant_uses;
    d["value_reads"] = i.value_reads;
    d["sync"] = i.sync;
    d["segments"] = i.segments;
    d["live_args"] = i.live_args;
    d["live_exts"] = i.live_exts;
    d["exec"] = i.exec;
    d["exec_numerics"] = i.exec_numerics;
    d["exec_summary"] = i.exec_summary;
    d["exec_note"] = i.exec_note;
    d["exec_kernels"] = i.exec_kernels;
    d["exec_calls"] = i.exec_calls;
    d["exec_generated_calls"] = i.exec_generated_calls;
    d["exec_generated_ops"] = i.exec_generated_ops;
    return d;
  });
  m.def("replay_counters", [] {
    const auto c = vessel::replay_counters();
    py::dict d;
    d["captures"] = c.captures;
    d["forms"] = c.forms;
    d["plan_builds"] = c.plan_builds;
    d["plan_cache_hits"] = c.plan_cache_hits;
    d["runs"] = c.runs;
    return d;
  });
  m.def("build_info", [] {
    py::dict d;
    d["sanitizer"] = CRUCIBLE_SANITIZER_NAME;
    d["contracts"] = CRUCIBLE_CONTRACT_SEMANTIC;
    d["dispatch_key"] = vessel::dispatch_key_name();
    return d;
  });
}
