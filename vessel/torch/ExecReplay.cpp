// ExecReplay.cpp — recorded steps through the exec stage (ExecReplay.h), and Note [Exec replay]
// (ReplayPlan.h): crucible.compile's whole-step plans run by an exec::Runner.
#include "ExecReplay.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#include "AtenMath.h"
#include "AtenParallel.h"
#include "Dispatch.h"
#include "ReplayPlan.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "crucible/core/OpTable.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/forge/Ir001.h"
#include "crucible/forge/Passes.h"
#include "crucible/forge/Rules.h"

namespace crucible::vessel {

// The backend (null, or Mimic's CPU backend as `fast` says) and the Runner over h.sp.plan.
// check_args: the provider checks every call's non-tensor arguments first (false: a plan whose
// calls' arguments differ from a checked plan's only in integer values, Note [Bound exec plans]).
Status start_runner(ExecStep& h, const std::string& backend, bool fast, bool memory_only_cache,
                    bool check_args = true);

std::uint32_t ExecStep::generated_calls() const {
  std::uint32_t n = 0;
  if (cpu)
    for (const mimic::CpuKernelState& k : cpu->kernels()) n += k.generated_calls;
  return n;
}

Result<std::unique_ptr<ExecStep>> plan_exec_step(const record::Trace& t, std::span<const std::size_t> ops,
                                                 const ExecStepOptions& o,
                                                 std::vector<bool>* constant_patched,
                                                 std::vector<std::uint32_t>* scalar_patch_of) {
  if (o.backend != "null" && o.backend != "cpu")
    return invalid_input("exec: backend must be \"null\" or \"cpu\", not \"" + o.backend + "\"",
                         "pass backend=\"null\" (ATen calls) or \"cpu\" (Mimic's generated kernels)");
  auto rules = forge::load_rules_dir(o.rules_dir, o.hardware);
  if (!rules.ok()) return rules.status();
  auto h = std::make_unique<ExecStep>();
  auto ir = forge::build_ir001(t, ops, h->pool);
  if (!ir.ok()) return ir.status();
  if (o.exact_escaping) {
    const absl::flat_hash_set<std::uint64_t> held(o.escaping.begin(), o.escaping.end());
    absl::flat_hash_set<std::uint64_t> outside;  // storages with a value from outside the step
    for (const forge::Value& v : ir->values)
      if (v.producer == forge::kNoNode) outside.insert(v.storage);
    for (forge::Value& v : ir->values)
      if (v.producer != forge::kNoNode && !outside.contains(v.storage)) v.live_out = held.contains(v.storage);
    ir = forge::forward_fresh_copies(std::move(*ir));
    if (!ir.ok()) return ir.status();
  }
  forge::Policy policy;
  policy.rematerialize = true;  // Note [Rematerialization]
  auto fe = forge::run_front_end(std::move(*ir), *rules, policy, 1e15);
  if (!fe.ok()) return fe.status();
  const forge::Ir001& g = fe->ir;
  const absl::flat_hash_set<std::uint64_t> held(o.escaping.begin(), o.escaping.end());
  exec::PlanOptions opt;
  opt.escaping.emplace();
  absl::flat_hash_set<std::uint64_t> written;
  for (std::uint32_t v = 0; v < g.values.size(); ++v) {
    const forge::Value& val = g.values[v];
    if (val.producer == forge::kNoNode) continue;
    written.insert(val.storage);
    if (val.live_out || held.contains(val.storage)) opt.escaping->push_back(v);
  }
  if (scalar_patch_of) scalar_patch_of->clear();
  for (std::uint32_t pi = 0; pi < o.scalar_patches.size(); ++pi) {
    const ExecStepOptions::ArgPatch& ap = o.scalar_patches[pi];
    const std::string name = ap.trace_op < t.ops.size() ? t.schema_name(t.ops[ap.trace_op].schema_hash) : "";
    bool found = false;
    // Every node of the op: a value computed again in the backward (Note [Rematerialization])
    // is one more call with the same argument.
    for (std::uint32_t n = 0; n < g.nodes.size(); ++n) {
      const forge::Node& node = g.nodes[n];
      if (node.trace_op != ap.trace_op || node.op != name) continue;
      for (std::uint32_t s = 0; s < node.scalars.size(); ++s)
        if (node.scalars[s].arg_index == ap.arg && node.scalars[s].kind == record::ScalarKind::Double) {
          opt.scalar_patches.push_back({n, s, name + " argument " + std::to_string(ap.arg)});
          if (scalar_patch_of) scalar_patch_of->push_back(pi);
          found = true;
          break;
        }
    }
    if (!found)
      return invalid_input("exec: the patched argument " + std::to_string(ap.arg) + " of trace op " +
                               std::to_string(ap.trace_op) + " (" + name +
                               ") is no floating-point scalar of a planned call",
                           "patch only double arguments of ops the plan runs");
  }
  if (constant_patched) constant_patched->assign(o.constant_patches.size(), false);
  for (std::size_t i = 0; i < o.constant_patches.size(); ++i) {
    const std::uint64_t sid = o.constant_patches[i];
    if (written.contains(sid)) continue;  // an Input slot: bound, written in place by the caller
    bool found = false;
    for (std::uint32_t v = 0; v < g.values.size() && !found; ++v) {
      const forge::Value& val = g.values[v];
      if (val.storage != sid || val.producer != forge::kNoNode || !val.wrapped_number) continue;
      bool read = false;  // a value no call reads is no Constant slot
      for (const forge::Node& node : g.nodes)
        read = read || std::find(node.inputs.begin(), node.inputs.end(), v) != node.inputs.end();
      if (!read) continue;
      opt.constant_patches.push_back({v, "Python number in storage " + std::to_string(sid)});
      found = true;
    }
    if (constant_patched) (*constant_patched)[i] = found;
  }
  auto plan = exec::build_plan(g, fe->plan, opt);
  if (!plan.ok()) return plan.status();
  h->recomputed = fe->recomputed;
  h->sp = exec::SteppedPlan{std::move(fe->ir), std::move(fe->plan), std::move(*plan)};
  if (Status st = start_runner(*h, o.backend, o.fast, o.memory_only_cache); !st.ok()) return st;
  return h;
}

Status start_runner(ExecStep& h, const std::string& backend, bool fast, bool memory_only_cache,
                    bool check_args) {
  exec::Backend b = exec::null_backend();
  if (backend == "cpu") {
    mimic::CpuBackendOptions co = memory_only_cache ? mimic::CpuBackendOptions::memory_only()
                                                    : mimic::CpuBackendOptions{};
    co.threads = static_cast<unsigned>(std::max(1, at::get_num_threads()));  // torch's own count
    co.fast = fast;
    // Note [Launch tables] (CpuBackend.cpp): CRUCIBLE_LAUNCH_TABLES=0 launches each run alone,
    // for benchmarks to compare
    const char* tables = std::getenv("CRUCIBLE_LAUNCH_TABLES");
    co.launch_tables = tables == nullptr || std::string_view(tables) != "0";
    co.parallel = aten_parallel;  // split loops on ATen's threads (Note [Split loops])
    co.current_threads = [] {  // ATen runs a parallel_for inline inside a parallel region
      return at::in_parallel_region() ? 1u : static_cast<unsigned>(std::max(1, at::get_num_threads()));
    };
    provide_aten_vector_math();   // Note [Vector math]: without it, softmax stays a library call
    auto cpu = mimic::CpuBackend::make(co);
    if (!cpu.ok()) return cpu.status();
    h.cpu = std::move(*cpu);
    b = h.cpu->backend();
  }
  // an argument the provider cannot give back refuses the stage now, not at the first run
  if (check_args) CRUCIBLE_RETURN_IF_ERROR(h.provider.check_arguments(h.sp.plan));
  auto r = exec::Runner::make(h.sp.plan, b, h.provider.provider());
  if (!r.ok()) return r.status();
  h.runner = std::move(*r);
  return ok_status();
}

namespace {

using replay::Form;
using replay::OutT;
using replay::Ref;

// A form slot an output or a .grad reads, made a tensor on the memory the exec plan wrote.
struct SlotTensor {
  std::uint32_t slot = 0;    // in the form
  std::uint32_t exec = 0;    // the exec plan's slot of its storage (Input or Output)
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes, strides;
};

class ExecReplayImpl final : public replay::ExecReplay {
 public:
  std::unique_ptr<ExecStep> step;
  std::string backend_name;
  bool fast = false;
  std::vector<Ref> input_src;               // per input binding: the tensor whose storage it is
  std::vector<SlotTensor> slot_tensors;
  std::vector<std::uint32_t> patch_source;  // per exec patch point: the source feeding it
  std::vector<c10::Storage> last_out;       // each output binding's memory in the last run
  // Note [Bound exec plans]: the sibling exec stage this one was last found to be one plan with
  // (same_tables and the checks after it, a pure function of the two), and the slot map they
  // gave; a family's later sizes bind against the same two.
  std::mutex paired_mu;
  std::weak_ptr<const replay::ExecReplay> paired_with;
  std::vector<std::uint32_t> paired_perm;
  // A run's scratch, sized once (its storages are let go at the end of the run).
  std::vector<c10::Storage> in_storage, result;
  std::vector<void*> in, out;
  std::vector<std::uint64_t> bits;

  void run(const Form& f, const std::vector<at::Tensor>& exts, std::vector<at::Tensor>& slots,
           at::TensorList args, at::ArrayRef<double> scalars) override {
    const exec::ExecutionPlan& plan = step->sp.plan;
    in_storage.resize(input_src.size());
    in.resize(input_src.size());
    out.resize(plan.outputs.size());
    struct LetGo {  // the scratch holds no storage past the run, however it ends
      ExecReplayImpl& r;
      ~LetGo() {
        std::fill(r.in_storage.begin(), r.in_storage.end(), c10::Storage());
        std::fill(r.result.begin(), r.result.end(), c10::Storage());
      }
    } let_go{*this};
    for (std::size_t b = 0; b < input_src.size(); ++b) {
      const at::Tensor t = replay::value_of(f, exts, slots, args, input_src[b]);
      const exec::Slot& s = plan.slots[plan.inputs[b]];
      TORCH_CHECK(t.defined() && t.has_storage() && t.storage().nbytes() >= s.bytes,
                  "crucible plan: the tensor bound to the exec plan's input ", b, " (", replay::ref_text(input_src[b]),
                  ") has ", t.defined() && t.has_storage() ? t.storage().nbytes() : 0, " bytes of storage, the plan reads ",
                  s.bytes, "; crucible.compile's guard should have caught this: call step.reset()");
      in_storage[b] = t.storage();
      in[b] = in_storage[b].mutable_data();
    }
    // An output's memory of the last run that nothing holds any more (Python dropped the
    // .grad it was, zero_grad(set_to_none=True)) is used again: the plan writes an output before
    // it reads it, and the same addresses let the ATen provider keep its calls' arguments.
    std::vector<c10::Storage>& out_storage = last_out;
    out_storage.resize(plan.outputs.size());
    for (std::size_t b = 0; b < plan.outputs.size(); ++b) {
      const std::uint64_t bytes = std::max<std::uint64_t>(plan.slots[plan.outputs[b]].bytes, 1);
      // From the default allocator, not through the replay arena's wrapper: these come and
      // go with no regard to the run, which must allocate the same sequence every time.
      if (!out_storage[b] || out_storage[b].use_count() != 1 || out_storage[b].nbytes() < bytes)
        out_storage[b] = c10::Storage(c10::Storage::use_byte_size_t(), static_cast<std::size_t>(bytes),
                                      c10::GetDefaultCPUAllocator(), /*resizable=*/false);
      out[b] = out_storage[b].mutable_data();
    }
    bits.resize(patch_source.size());
    for (std::size_t i = 0; i < patch_source.size(); ++i) {
      TORCH_CHECK(patch_source[i] < scalars.size(), "crucible plan: patch point ", i, " takes source ",
                  patch_source[i], ", and the run has ", scalars.size(), " source values");
      bits[i] = std::bit_cast<std::uint64_t>(scalars[patch_source[i]]);
    }
    step->provider.take_error();
    exec::RunArgs ra{in, out, bits};
    ra.outputs_may_move = true;  // an output ATen allocated itself is taken over, not copied
    ra.at_call = &ExecReplayImpl::at_call;
    const Status st = step->runner->run(ra);
    if (!st.ok())  // ATen's own error (an index out of range) reaches Python as eager raises it
      if (std::exception_ptr e = step->provider.take_error()) std::rethrow_exception(e);
    TORCH_CHECK(st.ok(), "crucible plan (exec stage, ", backend_name,
                " backend): ", message_of(st));
    result.assign(out_storage.begin(), out_storage.end());
    for (std::uint32_t b = 0; b < plan.outputs.size(); ++b) {
      void* at = step->runner->output_data(b);
      if (at == out[b]) continue;
      result[b] = step->provider.adopted_storage(at);
      TORCH_CHECK(result[b], "crucible plan (exec stage): output ", b, " moved to memory no adopted result owns; "
                  "this is a bug: report it, and run the step with backend=\"replay\"");
    }
    for (const SlotTensor& v : slot_tensors) {
      const exec::Slot& s = plan.slots[v.exec];
      c10::Storage storage = s.kind == exec::SlotKind::Input ? in_storage[s.binding] : result[s.binding];
      auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                       c10::scalarTypeToTypeMeta(v.dtype));
      impl->set_sizes_and_strides(v.sizes, v.strides, v.offset);
      slots[v.slot] = at::Tensor(std::move(impl));
    }
    // Adopted intermediates die with the run (so the replay arena serves them in the next one);
    // adopted outputs live on in the slots just made.
    step->provider.release_adopted();
  }

  std::string backend() const override { return backend_name; }
  std::string numerics() const override { return fast ? "fast" : "bitwise"; }
  std::size_t kernels() const override { return step->sp.plan.kernels.size(); }
  std::size_t calls() const override { return step->sp.plan.calls.size(); }
  std::size_t generated_calls() const override { return step->generated_calls(); }
  std::vector<std::string> generated_ops() const override {
    std::vector<std::string> ops;
    if (!step->cpu) return ops;
    const exec::ExecutionPlan& p = step->sp.plan;
    const std::vector<bool> mask = step->cpu->generated_call_mask();
    for (std::size_t c = 0; c < mask.size() && c < p.calls.size(); ++c)
      if (mask[c]) ops.push_back(p.op_names[p.calls[c].op]);
    return ops;
  }

  ExecArena arena_view() const override {
    ExecArena a;
    const exec::Runner& r = *step->runner;
    a.base = static_cast<unsigned char*>(r.arena_data());
    a.bytes = static_cast<std::size_t>(r.arena_bytes());
    a.calls = static_cast<std::uint32_t>(r.calls());
    // Widened to whole kernels: the replay arena checks at kernel starts that its blocks are
    // gone, and a backend's span may start inside a kernel (a generated run after a library call).
    const auto kernel = exec::kernel_spans(step->sp.plan);
    for (const exec::ArenaUse& u : r.arena_uses()) {
      const std::uint32_t first = u.first < kernel.size() ? kernel[u.first].first : u.first;
      const std::uint32_t last = u.last < kernel.size() ? kernel[u.last].second : u.last;
      a.uses.push_back({u.offset, u.bytes, first, last});
    }
    return a;
  }

  void renew_arena() override {
    const Status st = step->runner->renew_arena();
    TORCH_CHECK(st.ok(), message_of(st));
  }

  // Note [Run position]: the Runner says where it is; the replay arena's scope notes it.
  static Status at_call(void*, std::uint32_t call, bool kernel_start) {
    std::string why = arena_at_call(call, kernel_start);
    if (why.empty()) return ok_status();
    return bad_state(std::move(why), "report it: the plan's memory did not follow its profiled run");
  }

  std::string summary() const override {
    const exec::ExecutionPlan& p = step->sp.plan;
    std::string s = std::to_string(p.kernels.size()) + " kernels, " + std::to_string(p.calls.size()) + " calls";
    if (step->recomputed > 0)  // Note [Rematerialization]
      s += " (" + std::to_string(step->recomputed) + " computed again in the backward)";
    if (step->cpu) {
      s += ", " + std::to_string(step->cpu->generated_kernels()) + " kernels generated, " +
           std::to_string(step->generated_calls()) + " calls generated";
      const mimic::CacheStats& c = step->cpu->stats();
      char secs[64];
      std::snprintf(secs, sizeof secs, "; %.1f ms compiling, %.1f ms loading", c.compile_seconds * 1e3,
                    c.load_seconds * 1e3);
      s += " (compiled " + std::to_string(c.compiled) + ", from disk " + std::to_string(c.disk_hits) +
           ", from memory " + std::to_string(c.memory_hits) + secs + ")";
      std::uint32_t tables = 0, rows = 0, prologues = 0;  // Note [Launch tables] (CpuBackend.cpp)
      for (const mimic::CpuKernelState& k : step->cpu->kernels())
        tables += k.table_launches, rows += k.table_runs, prologues += k.prologue_sums;
      if (prologues > 0)  // Note [Sum prologues] (PointwiseProgram.h)
        s += ", " + std::to_string(prologues) + (prologues == 1 ? " sum" : " sums") +
             " with a pointwise prologue";
      if (tables > 0)
        s += ", " + std::to_string(rows) + " runs in " + std::to_string(tables) +
             (tables == 1 ? " launch table" : " launch tables");
    }
    const AtenProviderStats& a = step->provider.stats();
    s += "; ATen calls " + std::to_string(a.calls) + " (out= " + std::to_string(a.out_variant) +
         (a.out_failed ? ", out= raised " + std::to_string(a.out_failed) : std::string()) +
         ", in place " + std::to_string(a.in_place) + ", functional " +
         std::to_string(a.functional) + "; results copied " + std::to_string(a.copied) +
         ", allocations " + std::to_string(a.allocations) + ", adopted " +
         std::to_string(a.adopted) +
         (a.placed_late ? ", placed late " + std::to_string(a.placed_late) : std::string()) +
         ", arguments kept " + std::to_string(a.reused) + ")";
    // The Runner's arena, placed for how the backend touches memory (Note [Memory use]).
    s += "; arena " + std::to_string(step->runner->arena_bytes()) + " bytes (the plan places " +
         std::to_string(p.arena_bytes) + ")";
    if (step->cpu && step->cpu->scratch_bytes() > 0)  // the CPU backend's own, beside the arena
      s += "; scratch " + std::to_string(step->cpu->scratch_bytes()) + " bytes";
    return s;
  }
};

// The base tensor a ref stands on (through views).
Ref base_of(const Form& f, Ref r) {
  while (r.kind == Ref::View) r = f.views[r.idx].base;
  return r;
}

std::string attach(replay::Plan& p, const Form& call, const record::Trace& t, std::size_t begin, std::size_t end,
                   const std::vector<std::uint64_t>& arg_storages, const ExecStepOptions& options) {
  const Form& f = *p.form;
  if (call.ops.size() != f.ops.size() || call.exts.size() != f.exts.size())
    return "the recorded call does not have the plan's ops and persistent tensors";
  if (p.sync) return "a sync-point plan runs its Python between its native stretches; it runs its ATen ops";
  if (end < begin || end > t.ops.size())
    return "the captured call's ops [" + std::to_string(begin) + ", " + std::to_string(end) +
           ") are not in the trace's " + std::to_string(t.ops.size());
  if (end - begin != f.ops.size())
    return "the trace holds " + std::to_string(end - begin) + " ops of the captured call, the capture " +
           std::to_string(f.ops.size()) + " (another thread recorded between them?)";
  for (std::size_t k = 0; k < f.ops.size(); ++k) {
    const std::string want = replay::op_name(f.ops[k].op), got = t.schema_name(t.ops[begin + k].schema_hash);
    if (want != got)
      return "op " + std::to_string(k) + " of the captured call is " + want + " and the trace's is " + got;
  }
  if (arg_storages.size() != f.arg_meta.size())
    return "got " + std::to_string(arg_storages.size()) + " argument storages for " +
           std::to_string(f.arg_meta.size()) + " tensor arguments";
  // Where each storage comes from: a step argument, a persistent tensor (external), or a slot.
  absl::flat_hash_map<std::uint64_t, Ref> source;
  for (std::size_t j = 0; j < arg_storages.size(); ++j)
    if (arg_storages[j] != 0) source.emplace(arg_storages[j], Ref{Ref::Arg, static_cast<std::uint32_t>(j)});
  for (std::size_t e = 0; e < call.exts.size(); ++e)  // the call's own tensors, as its trace ops name them
    if (call.exts[e].defined() && call.exts[e].has_storage())
      source.emplace(storage_id(call.exts[e].storage()), Ref{Ref::Ext, static_cast<std::uint32_t>(e)});
  // Each form slot's recorded tensor: op k's return i (element e of a list) is slot out.slot + e.
  std::vector<std::int64_t> slot_meta(f.num_slots, -1);  // index in t.tensors
  for (std::size_t k = 0; k < f.ops.size(); ++k) {
    const auto outs = t.outputs(begin + k);
    for (const record::TensorMeta& m : outs) {
      if (m.arg_index >= f.ops[k].outs.size()) continue;
      const OutT& o = f.ops[k].outs[m.arg_index];
      if (o.kind == OutT::Ignore || m.list_index >= o.count) continue;
      slot_meta[o.slot + m.list_index] = static_cast<std::int64_t>(t.tensor_index(&m));
    }
  }
  // The slots an output or a .grad reads: their storages escape.
  std::vector<std::uint32_t> needed;
  auto need = [&](Ref r) {
    r = base_of(f, r);
    if (r.kind == Ref::Slot && std::find(needed.begin(), needed.end(), r.idx) == needed.end()) needed.push_back(r.idx);
  };
  for (Ref r : f.outputs) need(r);
  for (const auto& g : f.grads) need(g.second);
  ExecStepOptions o = options;
  o.exact_escaping = true;  // a whole-step plan run shows Python its outputs and .grad fields only
  for (std::uint32_t s : needed) {
    if (slot_meta[s] < 0) return "slot " + std::to_string(s) + ", an output or a gradient, is in no recorded op's results";
    o.escaping.push_back(t.tensors[static_cast<std::size_t>(slot_meta[s])].storage_id);
  }
  // Patch points: a scalar argument, or a Python number the form holds as an external.
  std::vector<std::uint32_t> scalar_sources, constant_sources;
  for (const replay::Patch& pt : p.patches) {
    if (pt.ext < 0) {
      o.scalar_patches.push_back({begin + pt.op, pt.arg});
      scalar_sources.push_back(pt.source);
    } else {
      const at::Tensor& x = call.exts[static_cast<std::size_t>(pt.ext)];
      o.constant_patches.push_back(x.has_storage() ? storage_id(x.storage()) : 0);
      constant_sources.push_back(pt.source);
    }
  }
  std::vector<std::size_t> ops(end - begin);
  for (std::size_t k = 0; k < ops.size(); ++k) ops[k] = begin + k;
  std::vector<bool> constant_patched;
  std::vector<std::uint32_t> scalar_patch_of;
  auto step = plan_exec_step(t, ops, o, &constant_patched, &scalar_patch_of);
  if (!step.ok()) return "the exec stage could not plan the step: " + message_of(step.status());
  auto impl = std::make_shared<ExecReplayImpl>();
  impl->backend_name = options.backend;
  impl->fast = options.fast;
  for (std::uint32_t pi : scalar_patch_of) impl->patch_source.push_back(scalar_sources[pi]);
  for (std::size_t i = 0; i < constant_sources.size(); ++i)
    if (constant_patched[i]) impl->patch_source.push_back(constant_sources[i]);
  const exec::ExecutionPlan& plan = (*step)->sp.plan;
  if (impl->patch_source.size() != plan.patches.size())
    return "the exec plan has " + std::to_string(plan.patches.size()) + " patch points for " +
           std::to_string(impl->patch_source.size()) + " of the form's";
  for (std::uint32_t b = 0; b < plan.inputs.size(); ++b) {
    const exec::Slot& s = plan.slots[plan.inputs[b]];
    auto it = source.find(s.storage);
    if (it == source.end())
      return "the exec plan reads storage " + std::to_string(s.storage) + " (" + std::to_string(s.bytes) +
             " bytes) from outside the step, and it is neither a step argument nor a persistent tensor of the plan";
    impl->input_src.push_back(it->second);
  }
  absl::flat_hash_map<std::uint64_t, std::uint32_t> exec_slot;
  for (std::uint32_t s = 0; s < plan.slots.size(); ++s)
    if (plan.slots[s].kind == exec::SlotKind::Input || plan.slots[s].kind == exec::SlotKind::Output)
      exec_slot.emplace(plan.slots[s].storage, s);
  for (std::uint32_t s : needed) {
    const std::size_t ti = static_cast<std::size_t>(slot_meta[s]);
    const record::TensorMeta& m = t.tensors[ti];
    auto it = exec_slot.find(m.storage_id);
    if (it == exec_slot.end())
      return "slot " + std::to_string(s) + " (storage " + std::to_string(m.storage_id) +
             "), an output or a gradient, has no memory of its own in the exec plan";
    SlotTensor v;
    v.slot = s;
    v.exec = it->second;
    v.dtype = static_cast<c10::ScalarType>(m.dtype);
    v.offset = m.storage_offset;
    const auto sz = t.sizes(ti), st = t.strides(ti);
    v.sizes.assign(sz.begin(), sz.end());
    v.strides.assign(st.begin(), st.end());
    impl->slot_tensors.push_back(std::move(v));
  }
  impl->step = std::move(*step);
  p.exec = std::move(impl);
  return "";
}

}  // namespace

namespace {
// Note [Bound exec plans]: the exec stage of a plan bound to new sizes (Note [Bound sizes],
// Replay.cpp), without Forge: two exec plans of the family at the sizes the binding was made
// from, planned from their recorded calls, must be one plan table for table — the same kernels,
// calls, arguments, tensors, slots, scalar kinds and patch points — differing only in integers:
// tensors' sizes, strides and offsets, and integer scalars. Each such integer is evaluated at the
// new sizes by the fits of the argument sizes that differ (size_at, as the binding's integers
// are); a Double scalar that differs must be a patch point. Slots' bytes follow from the tensors
// in them (the rule is checked to give both recorded plans' bytes, or less for an Arena or
// Output slot whose storage is larger than its tensors reach, as the 0-d result of mse_loss,
// smooth_l1_loss, soft_margin_loss and binary_cross_entropy keeps the unreduced loss's), the
// arena is placed again,
// the Runner made over it checks it (verify_plan) and prepares the backend's kernels (generated
// code depends on no size: the JIT's cache serves them). The bound plan's outputs and .grad
// fields are taken from the exec plan's memory as for any plan, at their sizes here.

// Every slot's bytes by the rule: its tensors' extent (the furthest element's byte + 1), rounded
// up to the alignment for Arena and Constant slots; UINT64_MAX where an extent overflows (no plan
// holds it: verify_plan and the bytes check refuse it). One pass over the tensors.
std::vector<std::uint64_t> slot_bytes_rule(const exec::ExecutionPlan& p) {
  std::vector<std::uint64_t> extent(p.slots.size(), 0);
  for (const exec::TensorRef& t : p.tensors) {
    if (t.slot >= extent.size()) return std::vector<std::uint64_t>(p.slots.size(), UINT64_MAX);
    const auto sz = p.sizes(t);
    const auto st = p.strides(t);
    if (std::any_of(sz.begin(), sz.end(), [](std::int64_t d) { return d == 0; })) continue;
    std::int64_t last = t.offset, step = 0;
    bool overflow = false;
    for (std::size_t d = 0; d < sz.size(); ++d) {
      overflow |= sz[d] < 0 || st[d] < 0 || __builtin_mul_overflow(sz[d] - 1, st[d], &step) ||
                  __builtin_add_overflow(last, step, &last);
    }
    const std::int64_t item = static_cast<std::int64_t>(c10::elementSize(static_cast<c10::ScalarType>(t.dtype)));
    std::int64_t end = 0;
    if (overflow || last < 0 || __builtin_add_overflow(last, 1, &end) || __builtin_mul_overflow(end, item, &end))
      extent[t.slot] = UINT64_MAX;
    else
      extent[t.slot] = std::max<std::uint64_t>(extent[t.slot], static_cast<std::uint64_t>(end));
  }
  for (std::size_t s = 0; s < extent.size(); ++s) {
    const std::uint64_t e = extent[s];
    if (e > (std::uint64_t{1} << 62)) {
      extent[s] = UINT64_MAX;
    } else if (p.slots[s].kind == exec::SlotKind::Arena || p.slots[s].kind == exec::SlotKind::Constant) {
      extent[s] = (std::max<std::uint64_t>(e, 1) + p.alignment - 1) / p.alignment * p.alignment;
    }
  }
  return extent;
}

// Whether exec plans a and b are one plan but for their integers. Slots are numbered by the
// recorded storage ids, which differ between recorded calls: slots correspond through the tensors
// on them (tensors are numbered by first use), `perm` (a's slot -> b's).
std::string same_tables(const exec::ExecutionPlan& a, const exec::ExecutionPlan& b, std::vector<std::uint32_t>& perm) {
  if (a.kernels.size() != b.kernels.size() || a.calls.size() != b.calls.size() || a.args.size() != b.args.size() ||
      a.tensors.size() != b.tensors.size() || a.dims.size() != b.dims.size() || a.slots.size() != b.slots.size() ||
      a.scalars.size() != b.scalars.size() || a.op_names != b.op_names || a.inputs.size() != b.inputs.size() ||
      a.outputs.size() != b.outputs.size() || a.results != b.results || a.patches.size() != b.patches.size() ||
      a.alignment != b.alignment)
    return "the exec plans of the two recorded sizes differ in their tables (Forge planned them apart)";
  perm.assign(a.slots.size(), exec::kNone);
  std::vector<std::uint32_t> back(b.slots.size(), exec::kNone);
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const exec::TensorRef &x = a.tensors[i], &y = b.tensors[i];
    if (x.dtype != y.dtype || x.flags != y.flags || x.ndim != y.ndim || x.dims != y.dims || x.slot >= perm.size() ||
        y.slot >= back.size() || (perm[x.slot] != exec::kNone && perm[x.slot] != y.slot) ||
        (back[y.slot] != exec::kNone && back[y.slot] != x.slot))
      return "the exec plans of the two recorded sizes have other tensors";
    perm[x.slot] = y.slot;
    back[y.slot] = x.slot;
  }
  if (std::find(perm.begin(), perm.end(), exec::kNone) != perm.end())
    return "a slot of an exec plan holds no tensor";
  for (std::size_t k = 0; k < a.kernels.size(); ++k) {
    const exec::Kernel &x = a.kernels[k], &y = b.kernels[k];
    if (x.group != y.group || x.kernel != y.kernel || x.recipe != y.recipe || x.call_begin != y.call_begin ||
        x.call_count != y.call_count)
      return "the exec plans of the two recorded sizes have other kernels (kernel " + std::to_string(k) + ")";
  }
  for (std::size_t c = 0; c < a.calls.size(); ++c) {
    const exec::Call &x = a.calls[c], &y = b.calls[c];
    if (x.op != y.op || x.schema_hash != y.schema_hash || x.kind != y.kind || x.phase != y.phase ||
        x.grad_mode != y.grad_mode || x.in_begin != y.in_begin || x.in_count != y.in_count ||
        x.out_begin != y.out_begin || x.out_count != y.out_count || x.scalar_begin != y.scalar_begin ||
        x.scalar_count != y.scalar_count)
      return "the exec plans of the two recorded sizes have other calls (call " + std::to_string(c) + ")";
  }
  for (std::size_t i = 0; i < a.args.size(); ++i)
    if (a.args[i].tensor != b.args[i].tensor || a.args[i].arg_index != b.args[i].arg_index ||
        a.args[i].list_index != b.args[i].list_index)
      return "the exec plans of the two recorded sizes wire their calls otherwise";
  for (std::size_t i = 0; i < a.slots.size(); ++i) {
    const exec::Slot &x = a.slots[i], &y = b.slots[perm[i]];
    if (x.kind != y.kind || x.dtype != y.dtype || x.first != y.first || x.last != y.last ||
        (x.kind == exec::SlotKind::Constant && std::bit_cast<std::uint64_t>(x.value) != std::bit_cast<std::uint64_t>(y.value) &&
         std::none_of(b.patches.begin(), b.patches.end(), [&](const exec::PatchPoint& q) {
           return q.kind == exec::PatchKind::Constant && q.index == perm[i]; })))
      return "the exec plans of the two recorded sizes have other slots";
  }
  for (std::size_t i = 0; i < a.patches.size(); ++i)
    if (a.patches[i].kind != b.patches[i].kind ||
        (a.patches[i].kind == exec::PatchKind::Scalar ? a.patches[i].index != b.patches[i].index
                                                      : perm[a.patches[i].index] != b.patches[i].index))
      return "the exec plans of the two recorded sizes have other patch points";
  for (std::size_t i = 0; i < a.scalars.size(); ++i) {
    const record::ScalarRecord &x = a.scalars[i], &y = b.scalars[i];
    if (x.kind != y.kind || x.arg_index != y.arg_index || x.aux != y.aux)
      return "the exec plans of the two recorded sizes have other scalars";
  }
  return "";
}
}  // namespace

std::string bind_exec(std::int64_t bound, std::int64_t plan_a, std::int64_t plan_b) {
  std::shared_ptr<replay::Plan> pc = replay::get_plan(bound);
  std::shared_ptr<replay::Plan> pa = replay::get_plan(plan_a);
  std::shared_ptr<replay::Plan> pb = replay::get_plan(plan_b);
  if (pa == pb || pc == pa || pc == pb) return "binding an exec plan needs plans of three sizes";
  std::shared_ptr<replay::ExecReplay> xa, xb;
  std::shared_ptr<const replay::Form> fa, fb;
  {
    replay::BusyLock ha(*pa);
    xa = pa->exec;
    fa = pa->form;
  }
  {
    replay::BusyLock hb(*pb);
    xb = pb->exec;
    fb = pb->form;
  }
  auto* ea = dynamic_cast<ExecReplayImpl*>(xa.get());
  auto* eb = dynamic_cast<ExecReplayImpl*>(xb.get());
  if (ea == nullptr || eb == nullptr) return "a plan of the two recorded sizes runs no exec stage";
  if (ea->backend_name != eb->backend_name || ea->fast != eb->fast)
    return "the exec stages of the two recorded sizes run on other backends";
  replay::BusyLock hc(*pc);
  if (pc->bound == nullptr) return "the plan was not bound to its sizes";
  // the exec stages' form slots and bindings are b's: the bound plan must run b's form, with b's
  // patch points, and a the sibling it was bound from
  if (pc->form != fb) return "the bound plan does not share the form of the plan whose exec stage it takes";
  if (pc->patches.size() != pb->patches.size()) return "the plan the size was bound from has other patch points now";
  if (pc->sibling == nullptr || pc->sibling->arg_meta.size() != fa->arg_meta.size()) return "the plans are not of one step";
  for (std::size_t j = 0; j < fa->arg_meta.size(); ++j)
    if (pc->sibling->arg_meta[j].sizes != fa->arg_meta[j].sizes || fa->arg_meta[j].offset != fb->arg_meta[j].offset)
      return "the exec plans are not of the sizes the plan was bound from";
  // The symbols: the argument dimensions plans a and b differ in, with their values here.
  replay::SizeSymbols syms;
  std::string why = replay::size_symbols(*fa, *fb, syms);
  if (!why.empty()) return why;
  std::vector<std::int64_t> c;
  const std::vector<replay::ArgMeta>& here = pc->bound->arg_meta;
  if (here.size() != fa->arg_meta.size()) return "the plans take other arguments";
  for (std::size_t j = 0; j < here.size(); ++j)
    for (std::size_t d = 0; d < here[j].sizes.size() && d < fa->arg_meta[j].sizes.size(); ++d)
      if (fa->arg_meta[j].sizes[d] != fb->arg_meta[j].sizes[d]) c.push_back(here[j].sizes[d]);
  if (c.size() != syms.size()) return "the plans' sizes vary in other dimensions";
  const exec::ExecutionPlan& a = ea->step->sp.plan;
  const exec::ExecutionPlan& b = eb->step->sp.plan;
  std::vector<std::uint32_t> perm;  // a's slot -> b's
  {
    // a and b are the family's two exec stages for every size bound from them: checked once
    std::lock_guard<std::mutex> paired(eb->paired_mu);
    if (eb->paired_with.lock() == xa) {
      perm = eb->paired_perm;
    } else {
      why = same_tables(a, b, perm);
      if (!why.empty()) return why;
      if (ea->input_src.size() != eb->input_src.size() || ea->input_src.size() != a.inputs.size() ||
          eb->input_src.size() != b.inputs.size() ||
          ea->slot_tensors.size() != eb->slot_tensors.size() ||
          ea->patch_source != eb->patch_source)
        return "the exec stages of the two recorded sizes bind other tensors";
      // each input binding of a reads, on b's corresponding slot, b's binding of the same tensor
      for (std::size_t k = 0; k < a.inputs.size(); ++k) {
        const exec::Slot& y = b.slots[perm[a.inputs[k]]];
        if (y.binding >= eb->input_src.size() ||
            ea->input_src[k].kind != eb->input_src[y.binding].kind ||
            ea->input_src[k].idx != eb->input_src[y.binding].idx)
          return "the exec stages of the two recorded sizes bind other tensors";
      }
      const std::vector<std::uint64_t> ra = slot_bytes_rule(a), rb = slot_bytes_rule(b);
      // A storage larger than its tensors reach (the 0-d result of mse_loss keeps the unreduced
      // loss's): the plan reads and writes an Arena or Output slot only through its tensors, so
      // at the new sizes it gets their extent (an output's storage the caller gets is the bound
      // form's, of eager's size)
      auto fits = [](const exec::ExecutionPlan& q, const std::vector<std::uint64_t>& rule,
                     std::uint32_t s) {
        const exec::Slot& x = q.slots[s];
        return rule[s] == x.bytes ||
               ((x.kind == exec::SlotKind::Arena || x.kind == exec::SlotKind::Output) &&
                rule[s] != UINT64_MAX && rule[s] < x.bytes);
      };
      for (std::uint32_t s = 0; s < a.slots.size(); ++s)
        if (!fits(a, ra, s) || !fits(b, rb, s))
          return "slot " + std::to_string(s) +
                 "'s bytes are not its tensors' extent in a recorded exec plan";
      eb->paired_with = xa;
      eb->paired_perm = perm;
    }
  }
  // The integers that differ take few distinct value pairs: each evaluated once.
  absl::flat_hash_map<std::pair<std::int64_t, std::int64_t>, std::optional<std::int64_t>> memo;
  auto value = [&](std::int64_t x, std::int64_t y) -> std::optional<std::int64_t> {
    if (x == y) return x;
    auto [it, fresh] = memo.try_emplace(std::pair{x, y});
    if (fresh) it->second = replay::size_at_sizes(x, y, syms, c);
    return it->second;
  };
  auto at = [&](std::int64_t x, std::int64_t y, const std::string& what) -> std::optional<std::int64_t> {
    auto v = value(x, y);
    if (!v) why = what + " has no single integer value at these sizes";
    return v;
  };
  auto h = std::make_unique<ExecStep>();
  exec::ExecutionPlan& p = h->sp.plan;
  p = b;
  for (std::size_t i = 0; i < p.dims.size() && why.empty(); ++i)
    if (auto v = at(a.dims[i], b.dims[i], "an exec tensor's size or stride")) p.dims[i] = *v;
  for (std::size_t i = 0; i < p.tensors.size() && why.empty(); ++i)
    if (auto v = at(a.tensors[i].offset, b.tensors[i].offset, "an exec tensor's offset")) p.tensors[i].offset = *v;
  for (std::size_t i = 0; i < p.scalars.size() && why.empty(); ++i) {
    const record::ScalarRecord &x = a.scalars[i], &y = b.scalars[i];
    if (x.bits == y.bits) continue;
    if (x.kind == record::ScalarKind::Int) {
      if (auto v = at(static_cast<std::int64_t>(x.bits), static_cast<std::int64_t>(y.bits), "an integer argument"))
        p.scalars[i].bits = static_cast<std::uint64_t>(*v);
    } else if (std::none_of(b.patches.begin(), b.patches.end(), [&](const exec::PatchPoint& q) {
                 return q.kind == exec::PatchKind::Scalar && q.index == i;
               })) {
      std::size_t call = 0;
      while (call + 1 < b.calls.size() &&
             !(b.calls[call].scalar_begin <= i && i < b.calls[call].scalar_begin + b.calls[call].scalar_count))
        ++call;
      // a host read's recorded value (item() of a step count): what the call read then, not an
      // argument it is given
      if (classify_op(b.op_names[b.calls[call].op]).traits & op_trait::kHostRead) continue;
      char vals[96];
      std::snprintf(vals, sizeof vals, " (%.17g and %.17g)", std::bit_cast<double>(x.bits), std::bit_cast<double>(y.bits));
      why = "argument " + std::to_string(y.arg_index) + " of call " + std::to_string(call) + " (" +
            b.op_names[b.calls[call].op] + ") differs between the exec plans of the two recorded sizes and is no "
            "size" + (x.kind == record::ScalarKind::Double ? std::string(vals) : std::string());
    }
  }
  if (!why.empty()) return why;
  {
    const std::vector<std::uint64_t> rp = slot_bytes_rule(p);
    std::vector<std::uint32_t> from_a(b.slots.size(), exec::kNone);
    for (std::uint32_t s = 0; s < perm.size(); ++s) from_a[perm[s]] = s;
    for (std::uint32_t s = 0; s < p.slots.size(); ++s) {
      p.slots[s].bytes = rp[s];
      // An Output larger than its tensors reach (mse_loss's 0-d loss keeps the unreduced loss's
      // storage) keeps eager's storage size where it is one integer of these sizes: the caller's
      // tensor is eager's, whether ATen or generated code wrote it
      if (p.slots[s].kind != exec::SlotKind::Output || from_a[s] == exec::kNone) continue;
      const auto eager = value(static_cast<std::int64_t>(a.slots[from_a[s]].bytes),
                               static_cast<std::int64_t>(b.slots[s].bytes));
      if (eager && *eager > static_cast<std::int64_t>(rp[s]))
        p.slots[s].bytes = static_cast<std::uint64_t>(*eager);
    }
  }
  auto layout = exec::place_arena(p, exec::plan_memory_use(p));
  if (!layout.ok()) return "the bound exec plan's arena: " + message_of(layout.status());
  for (std::size_t s = 0; s < p.slots.size(); ++s) p.slots[s].offset = layout->offsets[s];
  p.arena_bytes = layout->arena_bytes;
  h->recomputed = eb->step->recomputed;
  // Runner::make verifies the plan (verify_plan) before anything runs on it
  // b's arguments were checked when its stage was made; these differ from them in integer values
  // only (same_tables: the same scalar kinds and positions)
  if (Status st = start_runner(*h, eb->backend_name, eb->fast, false, /*check_args=*/false); !st.ok())
    return "the bound exec plan: " + message_of(st);
  auto impl = std::make_shared<ExecReplayImpl>();
  impl->backend_name = eb->backend_name;
  impl->fast = eb->fast;
  impl->input_src = eb->input_src;
  impl->patch_source = eb->patch_source;
  for (std::size_t i = 0; i < eb->slot_tensors.size(); ++i) {
    const SlotTensor &x = ea->slot_tensors[i], &y = eb->slot_tensors[i];
    if (x.slot != y.slot || perm[x.exec] != y.exec || x.dtype != y.dtype || x.sizes.size() != y.sizes.size())
      return "the exec stages of the two recorded sizes hand out other tensors";
    SlotTensor v = y;
    const auto off = value(x.offset, y.offset);
    if (!off) return "an output's offset has no single integer value at these sizes";
    v.offset = *off;
    for (std::size_t d = 0; d < v.sizes.size(); ++d) {
      const auto sz = value(x.sizes[d], y.sizes[d]);
      const auto st = value(x.strides[d], y.strides[d]);
      if (!sz || !st) return "an output's sizes have no single integer value at these sizes";
      v.sizes[d] = *sz;
      v.strides[d] = *st;
    }
    // its elements inside its slot (an Output's memory, or the Input's storage of that size)
    std::int64_t last = v.offset, step = 0;
    bool bad = v.offset < 0;
    for (std::size_t d = 0; d < v.sizes.size(); ++d)
      bad |= v.sizes[d] < 0 || v.strides[d] < 0 || __builtin_mul_overflow(v.sizes[d] > 0 ? v.sizes[d] - 1 : 0, v.strides[d], &step) ||
             __builtin_add_overflow(last, step, &last);
    const std::uint64_t item = c10::elementSize(v.dtype);
    if (bad || static_cast<std::uint64_t>(last + 1) * item > p.slots[v.exec].bytes)
      return "an output's elements would lie outside its memory at these sizes";
    impl->slot_tensors.push_back(std::move(v));
  }
  impl->step = std::move(h);
  pc->exec = std::move(impl);
  replay::exec_changed(*pc);
  pc->exec_note = "";
  return "";
}

std::string attach_exec(std::int64_t plan, const record::Trace& t, std::size_t begin, std::size_t end,
                        const std::vector<std::uint64_t>& arg_storages, const ExecStepOptions& options,
                        std::int64_t form) {
  std::shared_ptr<replay::Plan> p = replay::get_plan(plan);
  std::shared_ptr<const Form> call = form >= 0 ? replay::get_form(form) : nullptr;
  replay::BusyLock hold(*p);
  if (p->exec != nullptr && p->exec->backend() == options.backend &&
      p->exec->numerics() == (options.fast ? "fast" : "bitwise"))
    return "";  // a plan from the cache
  p->exec.reset();
  replay::exec_changed(*p);
  std::string why;
  try {
    why = attach(*p, call ? *call : p->recorded ? *p->recorded : *p->form, t, begin, end, arg_storages, options);
  } catch (const std::exception& e) {
    why = e.what();
  }
  p->exec_note = why;
  return why;
}

}  // namespace crucible::vessel
