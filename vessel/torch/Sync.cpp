// Sync.cpp — sync-point execution of a plan: the step's Python runs on every call, and the
// backward and optimizer steps it starts run natively from the plan.
//
// Note [Sync-point execution]: whole-step replay (Replay.cpp, run_op) skips the step's Python,
// so it is refused for a step whose Python does anything besides ATen ops (crucible.compile's
// purity checks). Such a step is run in sync-point mode instead:
//  - The Python runs on every call, so every side effect happens as in eager.
//  - Every op it issues at the one op level is matched against the plan's next op
//    (sync_match): the same operator, grad mode and phase; each constant argument equal to the
//    plan's (or a scalar the plan takes from each call: Plan::live_args); each tensor argument
//    the call's own value of the plan's wiring — the result of the plan op that made it, the
//    step argument, the same persistent tensor (storage, offset, sizes, strides, dtype), or a
//    view of one with the plan's geometry. Results become the plan's slots.
//  - Matched forward ops run eagerly, as they arrive: autograd must build its graph, because a
//    later mismatch hands the rest of the call to eager PyTorch, which needs it.
//  - backward() and a recognized optimizer's step() are marked stretches of the plan
//    (Form::Mark). When the call reaches one with every op before it matched, its inputs bound
//    and nothing Python would run inside it (no hook, no custom autograd.Function, no random
//    op, no scalar Python computes anew), the stretch runs natively (run_range) on the bound
//    tensors, the .grad fields are set as the engine sets them, and the autograd graph's saved
//    tensors are released as the engine releases them. Otherwise the engine or the optimizer's
//    Python runs, and its ops are matched like the others.
//  - The first op that does not match ends the matching: the rest of the call is eager
//    PyTorch, with nothing skipped (every op before it ran, eagerly or natively), and sync_end
//    reports why. Never a wrong result, at worst an eager call.
//
// Note [Optimizer plans]: a recognized optimizer's step() is a step of its own: pure, its
// scalars known (optimizer_sources.py). Run as a stretch of the sync-point plan, its ATen ops
// replay one by one; so where the step may run natively and nothing after it reads what it
// makes, the call steps aside (sync_optimizer returns 2: the sync-point run is suspended, the
// recording key off) and the optimizer's step runs as its own crucible.compile plan
// (mode="replay", the sync-point step's backend: on the cpu backend, generated kernels; OwnPlan
// in _sync.py, which says when); sync_resume takes the call up after the stretch. That plan has
// its own guards, scalar sources and refusals: while it records, the step runs eagerly; after it
// is dropped, as the stretch again. The AdamW step of the test transformer (15 tensors): about
// 325 us as a stretch, 165 us as its own plan on the cpu backend (median step() times).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <unordered_set>
#include <vector>

#include "Capture.h"
#include "Dispatch.h"
#include "Replay.h"
#include "ReplayPlan.h"

namespace crucible::vessel {
namespace replay {

struct SyncRun {
  std::vector<std::shared_ptr<Plan>> variants;  // the step's plans for this signature: one per path
  std::size_t current = 0;
  std::size_t switches = 0;
  std::shared_ptr<Plan> plan;
  const Form* f = nullptr;
  std::size_t k = 0;  // the plan's next op
  bool failed = false;
  std::string why;
  std::vector<at::Tensor> slots, exts, args;
  std::vector<std::uint8_t> bound;  // per external: taken from the call (exts[e] is the call's)
  std::vector<std::uint32_t> undo;  // externals bound by the op being matched (unbound if it misses)
  std::string miss;                 // why the op being matched does not match the current plan
  std::size_t matched = 0, native_ops = 0, native_segments = 0;
  std::vector<std::string> eager_stretches;  // why a marked stretch ran eagerly
  bool stale = false;  // a guard said the optimizers' state is not what the plan was recorded from
  std::int64_t suspended_mark = -1;  // the optimizer step run by its own plan while suspended
  detail::Capture capture;
  bool key_was_on = false;
};

namespace {
bool may_draw_random_op(const OpT& o) { return may_draw_random(o.op.schema().name()); }

// Which marked stretches of a sync-point plan may run natively, and why not (Note [Sync-point
// execution], Sync.cpp).
void plan_segments(Plan& p) {
  const Form& f = *p.form;
  p.slot_producer.assign(f.num_slots, -1);
  for (std::size_t k = 0; k < f.ops.size(); ++k)
    for (const OutT& o : f.ops[k].outs)
      for (std::uint32_t s = o.slot; s < o.slot + o.count; ++s) p.slot_producer[s] = static_cast<std::int32_t>(k);
  // Slot lifetimes counting the value reads (skip ops) as uses: a sync-point call's Python
  // makes them, after the stretch that made the value may have run natively.
  std::vector<long> last(f.num_slots, -1);
  std::function<void(Ref, long)> use = [&](Ref r, long k) {
    if (r.kind == Ref::Slot) last[r.idx] = std::max(last[r.idx], k);
    else if (r.kind == Ref::View) use(f.views[r.idx].base, k);
  };
  for (std::size_t k = 0; k < f.ops.size(); ++k)
    for (const ArgT& a : f.ops[k].args)
      for (Ref r : a.refs) use(r, static_cast<long>(k));
  for (Ref r : f.outputs) use(r, LONG_MAX);
  for (const auto& g : f.grads) use(g.second, LONG_MAX);
  for (const Form::Mark& m : f.marks) {
    const long at = m.begin < f.ops.size() ? static_cast<long>(m.begin) : LONG_MAX;
    for (Ref r : m.roots) use(r, at);
    for (Ref r : m.seeds) use(r, at);
    // read as the stretch ends: kept past its last op (m.end - 1)
    for (const auto& g : m.grads_after) use(g.second, m.end < f.ops.size() ? static_cast<long>(m.end) : LONG_MAX);
  }
  p.sync_release.assign(f.ops.size(), {});
  for (std::uint32_t s = 0; s < f.num_slots; ++s) {
    const long at = last[s] >= 0 ? last[s] : p.slot_producer[s];
    if (at >= 0 && at != LONG_MAX) p.sync_release[static_cast<std::size_t>(at)].push_back(s);
  }
  std::size_t first_live_op = f.ops.size();
  for (std::uint64_t la : p.live_args) first_live_op = std::min<std::size_t>(first_live_op, la >> 32);
  p.segments.clear();
  std::uint32_t prev_end = 0;
  for (const Form::Mark& m : f.marks) {
    Plan::Segment seg;
    auto refuse = [&](std::string why) {
      if (seg.why.empty()) seg.why = std::move(why);
    };
    if (m.begin < prev_end || m.end < m.begin || m.end > f.ops.size()) refuse("it overlaps another marked stretch");
    prev_end = std::max(prev_end, m.end);
    if (m.kind == Form::Mark::Backward) {
      if (first_live_op < m.begin)
        refuse(describe_op(f.ops[first_live_op], first_live_op) + " takes a scalar Python computes anew each "
               "call, and the backward's own copies of such scalars are not patch points");
      if (m.roots.size() != 1) refuse("backward() was given several tensors");
    }
    for (const Patch& pt : p.patches) {
      const std::size_t first = pt.ext >= 0 ? f.ext_use[static_cast<std::size_t>(pt.ext)].op : 0;
      if (m.kind == Form::Mark::Backward && pt.ext >= 0 && first >= m.begin && first < m.end)
        refuse("a Python number the plan patches is first read inside backward");
    }
    for (std::size_t k = m.begin; k < m.end && k < f.ops.size() && seg.why.empty(); ++k) {
      const OpT& o = f.ops[k];
      for (std::size_t i = 0; i < o.args.size(); ++i) {
        if (p.live_args.contains(static_cast<std::uint64_t>(k) << 32 | i))
          refuse(describe_op(o, k) + " argument '" + arg_name(o, i) + "' is a scalar Python computes anew each call");
        for (Ref r : o.args[i].refs)
          if (r.kind == Ref::Ext && p.live_ext[r.idx] != 0 && f.ext_use[r.idx].op >= m.begin)
            refuse(describe_op(o, k) + " reads a tensor Python makes anew each call");
      }
      if (m.kind == Form::Mark::Backward && p.op_patch[k] >= 0)
        refuse(describe_op(o, k) + " takes a scalar from the optimizer's sources inside backward");
      if (m.kind == Form::Mark::Backward && !o.skip && may_draw_random_op(o))
        refuse(describe_op(o, k) + " draws random numbers inside backward (activation checkpointing?)");
      if (m.kind == Form::Mark::Backward && o.op.schema().name() == "aten::_local_scalar_dense")
        refuse(describe_op(o, k) + " reads a tensor value inside backward");
    }
    seg.native = seg.why.empty();
    if (m.kind == Form::Mark::OptimizerStep && seg.native && m.grads_after.empty()) {
      seg.external = true;
      for (std::size_t k = m.begin; k < m.end && k < f.ops.size(); ++k)
        for (const OutT& o : f.ops[k].outs)
          for (std::uint32_t s = o.slot; s < o.slot + o.count; ++s)
            if (last[s] >= static_cast<long>(m.end)) seg.external = false;
    }
    p.segments.push_back(std::move(seg));
  }
}
}  // namespace

namespace {

thread_local std::unique_ptr<SyncRun> t_sync;
thread_local std::unique_ptr<SyncRun> t_suspended;  // Note [Optimizer plans]

bool same_double(double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; }

bool same_const(const c10::IValue& plan, const c10::IValue& now) {
  if (plan.isDouble() && now.isDouble()) return same_double(plan.toDouble(), now.toDouble());
  if (plan.isInt() && now.isInt()) return plan.toInt() == now.toInt();
  if (plan.isBool() && now.isBool()) return plan.toBool() == now.toBool();
  if (plan.isNone() || now.isNone()) return plan.isNone() && now.isNone();
  std::string a, b;
  const_text(plan, a);
  const_text(now, b);
  return a == b;
}

// The same memory seen the same way (a tensor object made afresh over it, p.data, counts).
bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  if (!a.defined() || !b.defined() || !a.has_storage() || !b.has_storage()) return false;
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.scalar_type() == b.scalar_type();
}

bool same_meta(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() && a.scalar_type() == b.scalar_type() &&
         a.device() == b.device() &&
         a.unsafeGetTensorImpl()->is_wrapped_number() == b.unsafeGetTensorImpl()->is_wrapped_number();
}

bool takes_any_value(const Plan& p, std::uint32_t e) {
  const Form& f = *p.form;
  if (p.live_ext[e] != 0 || f.ext_lifted[e] != 0 || f.exts[e].unsafeGetTensorImpl()->is_wrapped_number())
    return true;
  for (std::uint32_t c : p.constants)
    if (c == e) return true;
  return false;
}

// The call's value of a plan tensor, where the call has bound it (views from their base);
// undefined where it has not.
at::Tensor live_value(const SyncRun& run, Ref r) {
  switch (r.kind) {
    case Ref::None: return at::Tensor();
    case Ref::Slot: return run.slots[r.idx];
    case Ref::Arg: return r.idx < run.args.size() ? run.args[r.idx] : at::Tensor();
    case Ref::Ext: return run.exts[r.idx];
    case Ref::View: {
      const ViewSpec& v = run.f->views[r.idx];
      const at::Tensor base = live_value(run, v.base);
      if (!base.defined()) return base;
      return base.as_strided(v.sizes, v.strides, base.storage_offset() + v.offset_delta);
    }
  }
  return at::Tensor();
}

// Is `t` the call's value of the plan's `r`? With bind, an external seen for the first time
// is taken from the call (the same persistent tensor, or any value for one Python makes).
bool check_ref(SyncRun& run, Ref r, const at::Tensor& t, bool bind) {
  switch (r.kind) {
    case Ref::None: return !t.defined();
    case Ref::Slot: return t.defined() && run.slots[r.idx].defined() && same_tensor(run.slots[r.idx], t);
    case Ref::Arg: return t.defined() && r.idx < run.args.size() && same_tensor(run.args[r.idx], t);
    case Ref::Ext: {
      if (!t.defined()) return false;
      if (run.bound[r.idx] != 0) return same_tensor(run.exts[r.idx], t);
      const at::Tensor& planned = run.plan->run_exts[r.idx];
      // requires_grad as recorded too: a parameter frozen (or thawed) since changes what
      // autograd builds, and so the backward the plan would run, with the same ATen ops.
      const bool ok = (takes_any_value(*run.plan, r.idx) ? same_meta(planned, t) : same_tensor(planned, t)) &&
                      t.requires_grad() == run.plan->ext_snap[r.idx].requires_grad;
      if (ok && bind) {
        run.exts[r.idx] = t;
        run.bound[r.idx] = 1;
        run.undo.push_back(r.idx);
      }
      return ok;
    }
    case Ref::View: {
      if (!t.defined() || !t.has_storage()) return false;
      const ViewSpec& v = run.f->views[r.idx];
      const at::Tensor base = live_value(run, v.base);
      if (!base.defined() || !base.has_storage()) return false;
      return t.storage().unsafeGetStorageImpl() == base.storage().unsafeGetStorageImpl() &&
             t.scalar_type() == base.scalar_type() && t.sizes() == c10::IntArrayRef(v.sizes) &&
             t.strides() == c10::IntArrayRef(v.strides) &&
             t.storage_offset() == base.storage_offset() + v.offset_delta;
    }
  }
  return false;
}

void set_miss(SyncRun& run, std::string why) { run.miss = std::move(why); }

void fail(SyncRun& run, std::string why) {
  run.failed = true;
  run.why = std::move(why);
  run.slots.clear();  // the rest of the call is eager: nothing more is bound
}

bool tensor_arg(SyncRun& run, const ArgT& a, const c10::IValue& v) {
  if (a.kind == ArgT::Tensor) {
    if (v.isNone()) return check_ref(run, a.refs[0], at::Tensor(), true);
    return v.isTensor() && check_ref(run, a.refs[0], v.toTensor(), true);
  }
  if (a.kind == ArgT::TensorList) {
    if (!v.isTensorList()) return false;
    const auto l = v.toTensorList();
    if (l.size() != a.refs.size()) return false;
    for (std::size_t e = 0; e < l.size(); ++e)
      if (!check_ref(run, a.refs[e], l.get(e), true)) return false;
    return true;
  }
  if (!v.isList()) return false;  // OptTensorList
  const auto& l = v.toListRef();
  if (l.size() != a.refs.size()) return false;
  for (std::size_t e = 0; e < l.size(); ++e) {
    const at::Tensor t = l[e].isTensor() ? l[e].toTensor() : at::Tensor();
    if (!l[e].isTensor() && !l[e].isNone()) return false;
    if (!check_ref(run, a.refs[e], t, true)) return false;
  }
  return true;
}

// The slots a stretch reads that ops before it made must be bound, and the persistent tensors
// it reads that the call has not bound must be the plan's, unchanged (Plan::ExtSnap).
std::string stretch_inputs_ready(const SyncRun& run, std::size_t begin, std::size_t end) {
  const Plan& p = *run.plan;
  const Form& f = *run.f;
  std::function<std::string(Ref)> ready = [&](Ref r) -> std::string {
    switch (r.kind) {
      case Ref::Slot:
        if (p.slot_producer[r.idx] < static_cast<std::int32_t>(begin) && !run.slots[r.idx].defined())
          return "an intermediate it reads was not bound by the call";
        return "";
      case Ref::Arg: return r.idx < run.args.size() ? "" : "a step argument is missing";
      case Ref::Ext: {
        if (run.bound[r.idx] != 0) return "";
        if (takes_any_value(p, r.idx) && !p.form->exts[r.idx].unsafeGetTensorImpl()->is_wrapped_number() &&
            f.ext_lifted[r.idx] == 0)
          return "it reads a tensor Python makes anew each call, not seen yet in this call";
        const Plan::ExtSnap& x = p.ext_snap[r.idx];
        if (x.storage == nullptr) return "";
        const at::Tensor& t = p.run_exts[r.idx];
        const bool same = t.storage().unsafeGetStorageImpl() == x.storage && t.storage_offset() == x.offset &&
                          t.sizes() == c10::IntArrayRef(x.sizes) && t.scalar_type() == x.dtype &&
                          t.requires_grad() == x.requires_grad;
        return same ? "" : "a persistent tensor it reads changed in place (new data, shape, dtype or requires_grad)";
      }
      case Ref::View: return ready(f.views[r.idx].base);
      case Ref::None: return "";
    }
    return "";
  };
  for (std::size_t k = begin; k < end; ++k) {
    if (f.ops[k].skip) continue;
    for (const ArgT& a : f.ops[k].args)
      for (Ref r : a.refs) {
        std::string why = ready(r);
        if (!why.empty()) return describe_op(f.ops[k], k) + ": " + why;
      }
  }
  return "";
}

// The next mark at the plan's cursor, or -1.
std::int64_t mark_here(const SyncRun& run, Form::Mark::Kind kind, std::int64_t tag) {
  const Form& f = *run.f;
  for (std::size_t m = 0; m < f.marks.size(); ++m)
    if (f.marks[m].begin == run.k && f.marks[m].kind == kind && (kind == Form::Mark::Backward || f.marks[m].tag == tag))
      return static_cast<std::int64_t>(m);
  return -1;
}

void run_stretch(SyncRun& run, std::size_t m, at::ArrayRef<double> scalars) {
  const Form::Mark& mk = run.f->marks[m];
  Plan& p = *run.plan;
  for (const Patch& pt : p.patches)  // Python numbers the plan feeds, where the call has not bound its own
    if (pt.ext >= 0 && run.bound[static_cast<std::size_t>(pt.ext)] == 0 && pt.source < scalars.size())
      *p.run_exts[static_cast<std::size_t>(pt.ext)].data_ptr<double>() = scalars[pt.source];
  {
    c10::impl::ExcludeDispatchKeyGuard no_rec(detail::kKey);
    at::AutoDispatchBelowADInplaceOrView below;
    c10::AutoGradMode restore(c10::GradMode::is_enabled());
    run_range(p, mk.begin, mk.end, run.exts, run.slots, run.args, scalars);
  }
  for (std::size_t k = mk.begin; k < mk.end; ++k) run.native_ops += run.f->ops[k].skip ? 0 : 1;
  ++run.native_segments;
  run.k = mk.end;
}

// Nodes of the autograd graph below `roots`: what the engine would run. Returns why the
// engine must run it instead (Python inside: a hook, a custom autograd.Function), or "".
std::string walk_graph(const std::vector<at::Tensor>& roots, std::vector<torch::autograd::Node*>& nodes) {
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  for (const at::Tensor& r : roots) {
    torch::autograd::Node* n = r.grad_fn().get();
    if (n == nullptr) return "backward() was called on a tensor with no autograd graph";
    if (seen.insert(n).second) todo.push_back(n);
  }
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    nodes.push_back(n);
    if (!n->pre_hooks().empty() || !n->post_hooks().empty() || !n->tensor_pre_hooks().empty() ||
        !n->retains_grad_hooks().empty() || n->tensor_post_acc_grad_hooks() != nullptr)
      return "a hook runs inside backward (" + n->name() + ")";
    if (std::strstr(typeid(*n).name(), "PyNode") != nullptr)
      return "a Python autograd.Function runs inside backward (" + n->name() + ")";
    for (const torch::autograd::Edge& e : n->next_edges()) {
      torch::autograd::Node* next = e.function.get();
      if (next != nullptr && seen.insert(next).second) todo.push_back(next);
    }
  }
  return "";
}

void sync_start_op(at::IntArrayRef plan_ids, at::TensorList args) {
  TORCH_CHECK(t_sync == nullptr && t_suspended == nullptr, "a crucible sync-point call is already active on this thread");
  TORCH_CHECK(!plan_ids.empty(), "crucible::sync_start: no plan");
  auto run = std::make_unique<SyncRun>();
  for (std::int64_t id : plan_ids) {
    std::shared_ptr<Plan> p = get_plan(id);
    TORCH_CHECK(p->sync, "crucible plan ", id, " is not a sync-point plan");
    bool idle = false;
    if (!p->busy.compare_exchange_strong(idle, true)) {
      for (const auto& q : run->variants) q->busy.store(false);
      TORCH_CHECK(false, "crucible plan ", id, " is already running on another thread; a plan runs one call at a time");
    }
    run->variants.push_back(std::move(p));
  }
  run->plan = run->variants[0];
  run->f = run->plan->form.get();
  run->slots.assign(run->f->num_slots, at::Tensor());
  run->exts = run->plan->run_exts;
  run->bound.assign(run->exts.size(), 0);
  run->args.assign(args.begin(), args.end());
  if (run->args.size() != run->f->arg_meta.size()) {
    fail(*run, "the call has " + std::to_string(run->args.size()) + " tensor arguments, the plan " +
                   std::to_string(run->f->arg_meta.size()));
  }
  run->capture.capture_only = !is_enabled();
  run->capture.sync = run.get();
  run->key_was_on = is_enabled();
  detail::thread_state().capture = &run->capture;
  set_enabled(true);
  t_sync = std::move(run);
}

bool eager_stretch(SyncRun& run, std::string why) {
  run.eager_stretches.push_back(std::move(why));
  return false;
}

bool sync_backward(at::TensorList roots, at::TensorList seeds, bool retain_graph);

bool sync_backward_op(at::TensorList roots, at::TensorList seeds, bool retain_graph) {
  return with_run_warnings(
      [&] { return sync_backward(roots, seeds, retain_graph); });  // Note [Warnings of a plan run]
}

bool sync_backward(at::TensorList roots, at::TensorList seeds, bool retain_graph) {
  SyncRun* run = t_sync.get();
  if (run == nullptr || run->failed) return false;
  const std::int64_t m = mark_here(*run, Form::Mark::Backward, 0);
  if (m < 0) return eager_stretch(*run, "backward(): the plan has no backward() at op " + std::to_string(run->k));
  const Form::Mark& mk = run->f->marks[static_cast<std::size_t>(m)];
  const Plan::Segment& seg = run->plan->segments[static_cast<std::size_t>(m)];
  if (!seg.native) return eager_stretch(*run, "backward(): " + seg.why);
  if (mk.retain_graph != retain_graph || mk.roots.size() != roots.size() || mk.seeds.size() != seeds.size())
    return eager_stretch(*run, "backward(): called with other arguments than when recorded");
  for (std::size_t j = 0; j < roots.size(); ++j)
    if (!check_ref(*run, mk.roots[j], roots[j], false))
      return eager_stretch(*run, "backward(): called on another tensor than when recorded");
  for (std::size_t j = 0; j < seeds.size(); ++j)
    if (!check_ref(*run, mk.seeds[j], seeds[j], false))
      return eager_stretch(*run, "backward(): given another gradient than when recorded");
  // Each parameter's .grad must be in the state the plan's backward was recorded from.
  for (const Form::GradPre& gp : mk.grad_pre) {
    const at::Tensor& g = run->exts[gp.ext].grad();
    const bool ok = gp.state == Form::GradPre::None     ? !g.defined()
                    : gp.state == Form::GradPre::Unread ? g.defined()
                                                        : g.defined() && same_tensor(g, run->exts[gp.grad_ext]);
    if (!ok)
      return eager_stretch(*run, std::string("backward(): the .grad of a ") + c10::toString(run->exts[gp.ext].scalar_type()) +
                                     dims(run->exts[gp.ext].sizes()) + " parameter is " +
                                     (g.defined() ? "set" : "None") + "; the plan's backward was recorded with it " +
                                     (gp.state == Form::GradPre::None ? "None" : gp.state == Form::GradPre::Unread ? "set" : "set to the tensor it accumulates into"));
  }
  if (std::string why = stretch_inputs_ready(*run, mk.begin, mk.end); !why.empty())
    return eager_stretch(*run, "backward(): " + why);
  std::vector<torch::autograd::Node*> nodes;
  if (std::string why = walk_graph(std::vector<at::Tensor>(roots.begin(), roots.end()), nodes); !why.empty())
    return eager_stretch(*run, "backward(): " + why);
  // The graph's saved tensors go first, as the engine frees each node's after running it: the
  // stretch holds what it reads in its slots and releases each after its last use, so the
  // forward's activations are freed as the backward goes (memory reused, not mapped afresh).
  if (!retain_graph)
    for (torch::autograd::Node* n : nodes) n->release_variables();
  run_stretch(*run, static_cast<std::size_t>(m), {});
  // .grad as the engine leaves it (AccumulateGrad): each parameter's gradient as the recorded
  // backward() returned, so that Python, or an eager rest of the call, sees what eager sees.
  for (const auto& [e, r] : mk.grads_after) run->exts[e].mutable_grad() = live_value(*run, r);
  return true;
}

}  // namespace
}  // namespace replay

namespace replay {
namespace {
// Can the call, matched against its current plan up to op k, go on against `q` (a plan of
// another path of the same step) from op k? Their first k ops must be the same ops with the
// same wiring (so slots, externals and views are numbered alike), q must take from the call
// every scalar the current plan took from it there, and the marks before k must agree.
bool same_prefix(const SyncRun& run, const Plan& q, std::size_t k) {
  const Form& a = *run.f;
  const Form& b = *q.form;
  if (b.ops.size() <= k || b.arg_meta.size() != a.arg_meta.size()) return false;
  for (std::size_t i = 0; i < k; ++i) {
    const OpT& x = a.ops[i];
    const OpT& y = b.ops[i];
    if (!(x.op == y.op) || x.out_sig != y.out_sig || x.grad_mode != y.grad_mode || x.phase != y.phase ||
        x.arg_sig.size() != y.arg_sig.size())
      return false;
    for (std::size_t j = 0; j < x.arg_sig.size(); ++j) {
      const std::uint64_t key = static_cast<std::uint64_t>(i) << 32 | j;
      const bool live_a = run.plan->live_args.contains(key), live_b = q.live_args.contains(key);
      if (live_a && !live_b) return false;
      if (!live_a && !live_b && x.arg_sig[j] != y.arg_sig[j]) return false;
      if (x.args[j].kind != y.args[j].kind) return false;
    }
  }
  auto before = [k](const std::vector<Form::Mark>& ms) {
    std::vector<const Form::Mark*> out;
    for (const Form::Mark& m : ms)
      if (m.begin < k) out.push_back(&m);
    return out;
  };
  const auto ma = before(a.marks), mb = before(b.marks);
  if (ma.size() != mb.size()) return false;
  for (std::size_t i = 0; i < ma.size(); ++i)
    if (ma[i]->begin != mb[i]->begin || ma[i]->end != mb[i]->end || ma[i]->kind != mb[i]->kind || ma[i]->tag != mb[i]->tag)
      return false;
  return true;
}

// Moves the call onto plan variant v (same_prefix holds): the bound tensors carry over.
void switch_to(SyncRun& run, std::size_t v) {
  const std::shared_ptr<Plan>& q = run.variants[v];
  const Form& b = *q->form;
  std::vector<at::Tensor> exts = q->run_exts;
  std::vector<std::uint8_t> bound(exts.size(), 0);
  for (std::size_t e = 0; e < run.bound.size() && e < exts.size(); ++e)
    if (run.bound[e] != 0) {
      exts[e] = run.exts[e];
      bound[e] = 1;
    }
  run.exts = std::move(exts);
  run.bound = std::move(bound);
  run.slots.resize(b.num_slots);
  run.plan = q;
  run.f = &b;
  run.current = v;
}
}  // namespace
}  // namespace replay

namespace detail {
void sync_match_one(replay::SyncRun& run, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                    const std::vector<c10::IValue>& rets, Phase phase);

void sync_match(replay::SyncRun& run, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                const std::vector<c10::IValue>& rets, Phase phase) {
  using namespace replay;
  if (run.failed) return;
  auto attempt = [&]() {
    run.undo.clear();
    run.miss.clear();
    sync_match_one(run, op, args, rets, phase);
    if (run.miss.empty()) return true;
    for (std::uint32_t e : run.undo) {  // the op's own bindings, before it missed
      run.bound[e] = 0;
      run.exts[e] = run.plan->run_exts[e];
    }
    return false;
  };
  if (attempt()) return;
  const std::string why = run.miss;
  const std::size_t was = run.current;
  for (std::size_t v = 0; v < run.variants.size(); ++v) {  // another path of the step from here?
    if (v == was || !same_prefix(run, *run.variants[v], run.k)) continue;
    const std::size_t back = run.current;
    switch_to(run, v);
    if (attempt()) {
      ++run.switches;
      return;
    }
    switch_to(run, back);
  }
  fail(run, why);
}

void sync_match_one(replay::SyncRun& run, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                    const std::vector<c10::IValue>& rets, Phase phase) {
  using namespace replay;
  const Form& f = *run.f;
  if (run.k >= f.ops.size()) return set_miss(run, "the step ran more ops than its plan (" + op_name(op) + " after the last)");
  const std::size_t k = run.k;
  const OpT& o = f.ops[k];
  if (!(o.op == op)) return set_miss(run, describe_op(o, k) + " was next in the plan; the step ran " + op_name(op));
  if (o.grad_mode != c10::GradMode::is_enabled() || o.phase != phase)
    return set_miss(run, describe_op(o, k) + " ran with another grad mode or in another phase");
  if (args.size() != o.args.size()) return set_miss(run, describe_op(o, k) + " got another number of arguments");
  for (std::size_t i = 0; i < args.size(); ++i) {
    const ArgT& a = o.args[i];
    if (a.kind == ArgT::Const) {
      if (run.plan->live_args.contains(static_cast<std::uint64_t>(k) << 32 | i)) continue;
      if (!same_const(a.value, args[i])) {
        std::string was, now;
        const_text(a.value, was);
        const_text(args[i], now);
        return set_miss(run, describe_op(o, k) + " argument '" + arg_name(o, i) + "' is " + now + "; the plan has " + was);
      }
    } else if (!tensor_arg(run, a, args[i])) {
      return set_miss(run, describe_op(o, k) + " argument '" + arg_name(o, i) + "' is not the tensor the plan wires there");
    }
  }
  auto sized_as_recorded = [&](std::uint32_t slot, const at::Tensor& t) {
    return !t.defined() || slot >= f.slot_sizes.size() || t.sizes() == c10::IntArrayRef(f.slot_sizes[slot]);
  };
  for (std::size_t i = 0; i < o.outs.size() && i < rets.size(); ++i) {  // sizes first: nothing bound on a miss
    const OutT& out = o.outs[i];
    if (out.kind == OutT::Tensor && rets[i].isTensor() && !sized_as_recorded(out.slot, rets[i].toTensor()))
      return set_miss(run, describe_op(o, k) + " returned a tensor of sizes " + dims(rets[i].toTensor().sizes()) +
                                "; the plan has " + dims(f.slot_sizes[out.slot]) + " (sizes that depend on data)");
    if (out.kind == OutT::TensorList && rets[i].isTensorList()) {
      const auto l = rets[i].toTensorList();
      for (std::size_t e = 0; e < l.size() && e < out.count; ++e)
        if (!sized_as_recorded(out.slot + static_cast<std::uint32_t>(e), l.get(e)))
          return set_miss(run, describe_op(o, k) + " returned a tensor of other sizes than the plan's");
    }
  }
  for (std::size_t i = 0; i < o.outs.size() && i < rets.size(); ++i) {
    const OutT& out = o.outs[i];
    if (out.kind == OutT::Tensor && rets[i].isTensor()) {
      run.slots[out.slot] = rets[i].toTensor();
    } else if (out.kind == OutT::TensorList && rets[i].isTensorList()) {
      const auto l = rets[i].toTensorList();
      if (l.size() != out.count) return set_miss(run, describe_op(o, k) + " returned another number of tensors");
      for (std::size_t e = 0; e < l.size(); ++e) run.slots[out.slot + e] = l.get(e);
    }
  }
  for (std::uint32_t s : run.plan->sync_release[k]) run.slots[s].reset();
  ++run.matched;
  run.k = k + 1;
}
}  // namespace detail

namespace {
using replay::Form;
using replay::Patch;
using replay::Plan;
// A sync-point plan of form b, whose differences from a call it repeats (a) are known: patch
// points, scalars and tensors Python makes anew each call (live). a_exts: the persistent tensors
// a's runs use.
std::int64_t sync_plan_of(const Form& a, const std::vector<at::Tensor>& a_exts, std::shared_ptr<const Form> b,
                          std::vector<Patch> patches, const std::vector<std::uint64_t>& live_args,
                          const std::vector<std::uint32_t>& live_exts, const std::vector<ScalarSource>& sources_b,
                          std::chrono::steady_clock::time_point t0) {
  using namespace replay;
  const ContentHash key = plan_key(*b, patches);
  // Gradients a whole-step plan binds from .grad (Note [Gradient bindings]): this plan takes
  // them from the call, as any tensor Python makes anew (live_exts).
  std::shared_ptr<Plan> p = new_plan(a, b, std::move(patches), key, sources_b, &a_exts, /*bind_grads=*/false);
  p->sync = true;
  p->live_ext.assign(b->exts.size(), 0);
  for (std::uint32_t e : live_exts) p->live_ext[e] = 1;
  p->live_args.insert(live_args.begin(), live_args.end());
  plan_segments(*p);
  // The .grad states at each backward() (not in the forms' content: a whole-step plan has no
  // use for them) must agree too, or that backward() runs in the engine.
  for (std::size_t m = 0; m < b->marks.size() && m < a.marks.size() && m < p->segments.size(); ++m) {
    auto text = [](const Form::Mark& mk) {
      std::string t;
      for (const auto& g : mk.grad_pre) t += std::to_string(g.ext) + "=" + std::to_string(g.state) + "/" + std::to_string(g.grad_ext) + ",";
      t += "|";
      for (const auto& [e, ref] : mk.grads_after) t += std::to_string(e) + "=" + ref_text(ref) + ",";
      return t;
    };
    if (p->segments[m].native && text(a.marks[m]) != text(b->marks[m])) {
      p->segments[m].native = false;
      p->segments[m].why = "the parameters' .grad were in other states at this backward() in the two recorded calls";
    }
  }
  p->arena_state = Plan::Arena::Off;
  p->arena_note = "a sync-point plan runs stretches of the step with PyTorch's allocator";
  return register_plan(std::move(p), t0);
}
}  // namespace

std::int64_t plan_build_sync(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                             const std::vector<ScalarSource>& sources_b) {
  using namespace replay;
  const auto t0 = std::chrono::steady_clock::now();
  auto [a, b] = forms_of(form_a, form_b, sources_a, sources_b);
  std::vector<Patch> patches;
  std::vector<std::uint64_t> live_args;
  std::vector<std::uint32_t> live_exts;
  const std::string diff =
      compare_forms(*a, *b, &sources_a, &sources_b, &patches, nullptr, nullptr, &live_args, &live_exts);
  if (!diff.empty()) throw std::runtime_error(diff);
  return sync_plan_of(*a, a->exts, b, std::move(patches), live_args, live_exts, sources_b, t0);
}

std::int64_t plan_build_sync_like(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources) {
  using namespace replay;
  const auto t0 = std::chrono::steady_clock::now();
  auto b = get_form(form);
  Like r = compare_like(plan, *b, sources, true);
  return sync_plan_of(*r.a, r.exts, b, std::move(r.patches), r.live_args, r.live_exts, sources, t0);
}

bool plan_same_path(std::int64_t plan, std::int64_t form) {
  using namespace replay;
  auto p = get_plan(plan);
  auto f = get_form(form);
  BusyLock hold(*p);
  std::vector<std::uint64_t> live_args;
  std::vector<std::uint32_t> live_exts;
  return compare_forms(*p->form, *f, nullptr, nullptr, nullptr, nullptr, nullptr, &live_args, &live_exts).empty();
}

bool forms_same_path(std::int64_t form_a, std::int64_t form_b) {
  using namespace replay;
  auto a = get_form(form_a);
  auto b = get_form(form_b);
  std::vector<std::uint64_t> live_args;
  std::vector<std::uint32_t> live_exts;
  return compare_forms(*a, *b, nullptr, nullptr, nullptr, nullptr, nullptr, &live_args, &live_exts).empty();
}

int sync_optimizer(std::int64_t tag, const std::function<std::vector<double>()>& scalars,
                   const std::vector<bool>& guards_ok, bool external) {
  using namespace replay;
  SyncRun* run = t_sync.get();
  if (run == nullptr || run->failed) return 0;
  const std::string what = "optimizer " + std::to_string(tag) + " step(): ";
  if (run->current >= guards_ok.size() || !guards_ok[run->current]) {
    run->stale = true;
    return eager_stretch(*run, what + "the optimizer's hyperparameters or state changed since the plan was recorded");
  }
  const std::int64_t m = mark_here(*run, Form::Mark::OptimizerStep, tag);
  if (m < 0) return eager_stretch(*run, what + "the plan has no such step at op " + std::to_string(run->k));
  const Plan::Segment& seg = run->plan->segments[static_cast<std::size_t>(m)];
  if (!seg.native) return eager_stretch(*run, what + seg.why);
  const Form::Mark& mk = run->f->marks[static_cast<std::size_t>(m)];
  if (external && seg.external) {
    // Note [Optimizer plans]: the call steps aside while the optimizer's own plan runs.
    run->suspended_mark = m;
    set_enabled(run->key_was_on);
    if (detail::ThreadState* ts = detail::t_state_ptr) ts->capture = nullptr;
    t_suspended = std::move(t_sync);
    return 2;
  }
  const std::vector<double> values = scalars();
  if (!run->plan->patches.empty() && values.size() != run->plan->build_sources.size())
    return eager_stretch(*run, what + "the optimizer's scalar sources changed in number");
  if (std::string why = stretch_inputs_ready(*run, mk.begin, mk.end); !why.empty())
    return eager_stretch(*run, what + why);
  run_stretch(*run, static_cast<std::size_t>(m), values);
  return 1;
}

void sync_resume(bool native) {
  using namespace replay;
  TORCH_CHECK(t_suspended != nullptr && t_sync == nullptr, "crucible: sync_resume without a suspended sync-point call");
  t_sync = std::move(t_suspended);
  SyncRun& run = *t_sync;
  detail::thread_state().capture = &run.capture;
  set_enabled(true);
  const Form::Mark& mk = run.f->marks[static_cast<std::size_t>(run.suspended_mark)];
  run.suspended_mark = -1;
  for (std::size_t k = mk.begin; k < mk.end; ++k) {
    for (std::uint32_t s : run.plan->sync_release[k]) run.slots[s].reset();
    if (native && !run.f->ops[k].skip) ++run.native_ops;
  }
  if (native) ++run.native_segments;
  run.k = mk.end;
}

bool sync_set_paused(bool paused) {
  const bool was = c10::impl::tls_is_dispatch_key_excluded(detail::kKey);
  c10::impl::tls_set_dispatch_key_excluded(detail::kKey, paused);
  return was;
}

SyncResult sync_end() {
  using namespace replay;
  std::unique_ptr<SyncRun> run = std::move(t_sync);
  if (run == nullptr) run = std::move(t_suspended);  // the optimizer's own plan raised
  SyncResult r;
  if (run == nullptr) return r;
  set_enabled(run->key_was_on);
  if (detail::ThreadState* ts = detail::t_state_ptr) ts->capture = nullptr;
  r.plan_ops = run->f->ops.size();
  r.matched_ops = run->matched;
  r.native_ops = run->native_ops;
  r.native_segments = run->native_segments;
  r.eager_stretches = std::move(run->eager_stretches);
  r.matched = !run->failed && run->k == run->f->ops.size();
  r.why = run->failed ? run->why
          : run->k != run->f->ops.size()
              ? "the step ran " + std::to_string(run->k) + " of its plan's " + std::to_string(run->f->ops.size()) + " ops"
              : "";
  r.variant = run->current;
  r.stale = run->stale;
  r.switches = run->switches;
  for (const auto& p : run->variants) p->busy.store(false);
  return r;
}

}  // namespace crucible::vessel

TORCH_LIBRARY_FRAGMENT(crucible, m) {
  m.def("sync_start(int[] plans, Tensor[] args) -> ()", &crucible::vessel::replay::sync_start_op);
  m.def("sync_backward(Tensor[] roots, Tensor[] seeds, bool retain_graph) -> bool",
        &crucible::vessel::replay::sync_backward_op);
}
