// Replay.cpp — capture → form → ExecutionPlan → run. See Replay.h and misc/CRUCIBLE.md.
#include "Replay.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include "Capture.h"
#include "Dispatch.h"
#include "ReplayArena.h"
#include "ReplayPlan.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "crucible/core/ContentHash.h"
#include "crucible/core/OpTable.h"

namespace crucible::vessel {
namespace replay {
using detail::Capture;
using detail::CapturedOp;
using detail::kKey;
using detail::thread_state;

bool may_draw_random(std::string_view name) {
  static constexpr std::string_view kRandom[] = {
      "rand",        "bernoulli", "normal", "uniform", "dropout", "multinomial", "poisson",
      "exponential", "geometric", "cauchy", "log_normal", "random", "rrelu", "gamma",
      "binomial",    "dirichlet"};
  for (std::string_view r : kRandom)
    if (name.find(r) != std::string_view::npos) return true;
  return false;
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& s = op.schema();
  return s.overload_name().empty() ? s.name() : s.name() + "." + s.overload_name();
}

std::string arg_name(const OpT& o, std::size_t i) {
  const auto& a = o.op.schema().arguments();
  return i < a.size() ? a[i].name() : "#" + std::to_string(i);
}

std::string describe_op(const OpT& o, std::size_t k) {
  return "op #" + std::to_string(k) + " " + op_name(o.op) + " (" + record::phase_name(o.phase) + ")";
}

std::string dims(c10::IntArrayRef v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string ref_text(Ref r) {
  static const char* k[] = {"none", "slot", "arg", "ext", "view"};
  return r.kind == Ref::None ? "none" : std::string(k[r.kind]) + std::to_string(r.idx);
}

// Canonical text of a constant argument: exact (doubles by their bits) and readable.
void const_text(const c10::IValue& v, std::string& out) {
  if (v.isDouble()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v.toDouble());
    out += buf;
    out += "(float)";
  } else if (v.isInt()) {
    out += std::to_string(v.toInt());
  } else if (v.isBool()) {
    out += v.toBool() ? "True" : "False";
  } else if (v.isNone()) {
    out += "None";
  } else if (v.isString()) {
    out += "'" + v.toStringRef() + "'";
  } else if (v.isList()) {
    out += "[";
    const auto& l = v.toListRef();
    for (std::size_t i = 0; i < l.size(); ++i) {
      if (i) out += ",";
      const_text(l[i], out);
    }
    out += "]";
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    char buf[96];
    std::snprintf(buf, sizeof buf, "(%.17g%+.17gj)", c.real(), c.imag());
    out += buf;
  } else if (v.isDevice()) {
    out += v.toDevice().str();
  } else if (v.isGenerator()) {
    // A generator object is state, named by identity: the same object in both calls.
    char buf[48];
    std::snprintf(buf, sizeof buf, "generator@%p", static_cast<const void*>(v.toGenerator().unsafeGetGeneratorImpl()));
    out += buf;
  } else {
    std::ostringstream os;
    os << v;
    out += os.str() + "<" + v.tagKind() + ">";
  }
}

// The content hash of a form's ops — name, argument texts (`sig` in place of each op's own
// when given), results, grad mode — followed by the strings of `tail`.
ContentHash hash_ops(const std::vector<OpT>& ops, const std::vector<std::vector<std::string>>* sig,
                     std::initializer_list<std::string_view> tail) {
  ContentHasher h;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    h.update_string(op_name(ops[k].op));
    for (const std::string& a : sig != nullptr ? (*sig)[k] : ops[k].arg_sig) h.update_string(a);
    h.update_string(ops[k].out_sig);
    h.update_u8(ops[k].grad_mode ? 1 : 0);
  }
  for (std::string_view t : tail) h.update_string(t);
  return h.digest();
}

// ---------------------------------------------------------------------------------------
// Capture → Form.

// The canonical text of a form's externals, views, outputs, gradient bindings, marks and
// arguments (Form::tail_sig). Without sizes (Note [Size families]): each tensor's rank in place
// of its sizes, strides and offset.
std::string tail_text(const Form& f, bool sizes) {
  auto shape = [sizes](c10::IntArrayRef sz, c10::IntArrayRef st, std::int64_t offset) {
    if (!sizes) return "rank" + std::to_string(sz.size());
    return dims(sz) + dims(st) + "@" + std::to_string(offset);
  };
  std::string t;
  for (std::size_t e = 0; e < f.exts.size(); ++e) {
    const at::Tensor& x = f.exts[e];
    t += "ext" + std::to_string(e) + ":" + std::string(c10::toString(x.scalar_type())) +
         shape(x.sizes(), x.strides(), x.storage_offset()) + x.device().str() + (x.requires_grad() ? " rg" : "") +
         (x.unsafeGetTensorImpl()->is_wrapped_number() ? " wrapped" : "") + (f.ext_lifted[e] ? " lifted" : "") + ";";
  }
  for (std::size_t v = 0; v < f.views.size(); ++v) {
    const ViewSpec& s = f.views[v];
    t += "view" + std::to_string(v) + ":" + ref_text(s.base) + shape(s.sizes, s.strides, s.offset_delta) + ";";
  }
  for (Ref r : f.outputs) t += "out:" + ref_text(r) + ";";
  for (const auto& g : f.grads) t += "grad:ext" + std::to_string(g.first) + "=" + ref_text(g.second) + ";";
  for (const auto& g : f.grad_pre)
    t += "gradpre:ext" + std::to_string(g.ext) + "=" + std::to_string(g.state) + "/" + std::to_string(g.grad_ext) + ";";
  for (const Form::Mark& m : f.marks) {
    t += "mark:" + std::to_string(m.kind) + "/" + std::to_string(m.tag) + "@" + std::to_string(m.begin) + "-" +
         std::to_string(m.end) + (m.retain_graph ? " retain" : "") + "(";
    for (Ref r : m.roots) t += ref_text(r) + ",";
    t += "|";
    for (Ref r : m.seeds) t += ref_text(r) + ",";
    t += ");";
  }
  for (const ArgMeta& m : f.arg_meta)
    t += "arg:" + std::string(c10::toString(m.dtype)) + shape(m.sizes, m.strides, 0) + m.device.str() + ";";
  return t;
}

class FormBuilder {
 public:
  Form f;

  void add_arg(const at::Tensor& t, std::size_t j) {
    check_strided(t, "step argument " + std::to_string(j));
    ArgMeta m{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device(), t.storage_offset()};
    f.arg_meta.push_back(std::move(m));
    define(t, Ref{Ref::Arg, static_cast<std::uint32_t>(j)});
  }

  // Note [Data-sized results]: ops whose result's size depends on tensor values. A whole-step
  // plan would run the ops after one at the sizes of the recorded call (a backward's expand,
  // a view's shape), so a step with one is not replayed whole; a sync-point call checks every
  // result's size against the plan's instead (Sync.cpp).
  static bool data_sized(const CapturedOp& cop) {
    static const char* kNames[] = {"aten::nonzero", "aten::nonzero_static", "aten::masked_select",
                                   "aten::_unique", "aten::_unique2", "aten::unique_dim",
                                   "aten::unique_consecutive", "aten::unique_dim_consecutive",
                                   "aten::bincount", "aten::histc", "aten::repeat_interleave",
                                   "aten::masked_scatter", "aten::argwhere"};
    const std::string& name = cop.op.schema().name();
    for (const char* n : kNames)
      if (name == n) return true;
    if (name.rfind("aten::index", 0) != 0) return false;   // index.Tensor, index_put_: by a mask?
    for (const c10::IValue& v : cop.args) {
      if (!v.isList()) continue;
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined() &&
            (e.toTensor().scalar_type() == at::kBool || e.toTensor().scalar_type() == at::kByte))
          return true;
    }
    return false;
  }

  // A plan runs on CPU tensors only: a step whose inputs and parameters are on the CPU can still
  // make device tensors inside (x.cuda(), a device tensor held in a global), and autograd runs
  // their backward on its device threads, where this capture does not follow.
  static void check_cpu(const c10::IValue& v, const CapturedOp& cop, std::size_t k) {
    auto check = [&](const at::Tensor& t) {
      if (!t.defined() || t.device().is_cpu()) return;
      throw std::runtime_error("op #" + std::to_string(k) + " " + cop.op.schema().operator_name().name +
                               " ran on a tensor on " + t.device().str() + "; crucible.compile replays CPU "
                               "steps only (autograd runs a device backward on threads its capture does "
                               "not follow), so this step runs eagerly");
    };
    if (v.isTensor()) check(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec()) check(t);
    else if (v.isList())
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) check(e.toTensor());
  }

  void add_op(CapturedOp& cop) {
    const std::size_t k = f.ops.size();
    for (const c10::IValue& v : cop.args) check_cpu(v, cop, k);
    for (const c10::IValue& v : cop.rets) check_cpu(v, cop, k);
    OpT o(cop.op);
    o.grad_mode = cop.grad_mode;
    o.phase = cop.phase;
    o.skip = cop.op.schema().name() == "aten::_local_scalar_dense";
    o.data_sized = data_sized(cop);
    for (std::size_t i = 0; i < cop.args.size(); ++i) o.args.push_back(make_arg(cop.args[i], o, k, i));
    std::size_t sized = 0;  // the next entry of cop.ret_sizes
    auto op_time_sizes = [&](const at::Tensor& t) {
      return sized < cop.ret_sizes.size() ? cop.ret_sizes[sized++] : t.sizes().vec();
    };
    for (std::size_t i = 0; i < cop.rets.size(); ++i) {
      const c10::IValue& r = cop.rets[i];
      OutT out;
      if (r.isTensor()) {
        out.kind = OutT::Tensor;
        out.slot = f.num_slots++;
        out.count = 1;
        if (r.toTensor().defined()) define(r.toTensor(), Ref{Ref::Slot, out.slot});
        slot_whole_.resize(f.num_slots, 0);
        const at::Tensor& t = r.toTensor();
        if (t.defined())
          slot_meta_[out.slot] = std::string(c10::toString(t.scalar_type())) + dims(t.sizes()) + dims(t.strides());
        f.slot_sizes.resize(f.num_slots);
        f.slot_sizes[out.slot] = op_time_sizes(t);
        f.slot_strides.resize(f.num_slots);
        if (t.defined() && t.layout() == at::kStrided && t.sizes() == c10::IntArrayRef(f.slot_sizes[out.slot]))
          f.slot_strides[out.slot] = t.strides().vec();
        slot_whole_[out.slot] = t.defined() && t.layout() == at::kStrided && t.has_storage() && t.storage_offset() == 0 &&
                                t.is_non_overlapping_and_dense() &&
                                t.storage().nbytes() == static_cast<std::size_t>(t.numel()) * t.element_size();
      } else if (r.isTensorList()) {
        const auto list = r.toTensorList();
        out.kind = OutT::TensorList;
        out.slot = f.num_slots;
        out.count = static_cast<std::uint32_t>(list.size());
        f.num_slots += out.count;
        f.slot_sizes.resize(f.num_slots);
        f.slot_strides.resize(f.num_slots);
        for (std::size_t e = 0; e < list.size(); ++e) {
          const at::Tensor t = list.get(e);
          if (t.defined()) define(t, Ref{Ref::Slot, out.slot + static_cast<std::uint32_t>(e)});
          f.slot_sizes[out.slot + e] = op_time_sizes(t);
          if (t.defined() && t.layout() == at::kStrided && t.sizes() == c10::IntArrayRef(f.slot_sizes[out.slot + e]))
            f.slot_strides[out.slot + e] = t.strides().vec();
        }
      }
      o.outs.push_back(out);
      o.out_sig += std::to_string(out.kind) + ":" + std::to_string(out.slot) + "x" + std::to_string(out.count) + ";";
    }
    f.ops.push_back(std::move(o));
  }

  // Note [Unwritten allocations]: ATen code that computes without dispatching (max_pool1d on
  // the CPU without grad: at::empty, then its own loop) leaves the form an allocation that no
  // recorded op writes, and a plan would hand out that memory unwritten. A form in which an op
  // reads, or the step returns, memory an allocation-only op made before any recorded op wrote
  // it (an argument the schema marks written, in place or out=) is refused; a view's result
  // shares its base's state, and taking a view reads nothing.
  void check_unwritten() const {
    static const char* kAlloc[] = {"aten::empty", "aten::empty_like", "aten::empty_strided",
                                   "aten::empty_permuted", "aten::new_empty", "aten::new_empty_strided"};
    std::vector<std::uint32_t> root(f.num_slots);
    for (std::uint32_t s = 0; s < f.num_slots; ++s) root[s] = s;
    auto find = [&](std::uint32_t s) {
      while (root[s] != s) s = root[s];
      return s;
    };
    std::vector<std::int64_t> made_by(f.num_slots, -1);  // per root: the allocation, while unwritten
    auto slot_of = [&](Ref r) -> std::int64_t {
      while (r.kind == Ref::View) r = f.views[r.idx].base;
      return r.kind == Ref::Slot && r.idx < f.num_slots ? static_cast<std::int64_t>(find(r.idx)) : -1;
    };
    auto unwritten = [&](std::int64_t s, const std::string& who) {
      const OpT& a = f.ops[static_cast<std::size_t>(made_by[static_cast<std::size_t>(s)])];
      throw std::runtime_error(
          who + " memory that " + a.op.schema().name() + " made and no recorded op wrote: ATen " +
          "computed it without dispatching an op (as max_pool1d without grad does on the CPU), " +
          "so a plan would give that memory unwritten; this step runs eagerly");
    };
    // the alias set a result or argument names (a list's: its elements')
    auto sets = [](const c10::AliasInfo* a) -> const std::unordered_set<c10::Symbol>* {
      if (a == nullptr) return nullptr;
      if (!a->beforeSets().empty()) return &a->beforeSets();
      return a->containedTypes().empty() ? nullptr : &a->containedTypes()[0].beforeSets();
    };
    for (std::size_t k = 0; k < f.ops.size(); ++k) {
      const OpT& o = f.ops[k];
      const c10::FunctionSchema& schema = o.op.schema();
      const std::string& name = schema.name();
      // ops that read only their tensors' sizes and dtype (empty_like, zeros_like, new_zeros...)
      const bool meta_only = name.ends_with("_like") || name.rfind("aten::new_", 0) == 0;
      for (std::size_t i = 0; i < o.args.size(); ++i) {
        const auto* alias = i < schema.arguments().size() ? schema.arguments()[i].alias_info() : nullptr;
        const bool write = alias != nullptr && alias->isWrite();
        if ((alias != nullptr && !write) || (meta_only && !write)) continue;  // aliased or sized, not read
        for (Ref r : o.args[i].refs) {
          const std::int64_t s = slot_of(r);
          if (s < 0 || made_by[static_cast<std::size_t>(s)] < 0) continue;
          if (!write) unwritten(s, describe_op(o, k) + " reads");
          made_by[static_cast<std::size_t>(s)] = -1;
        }
      }
      const bool alloc = std::any_of(std::begin(kAlloc), std::end(kAlloc),
                                     [&](const char* n) { return name == n; });
      for (std::size_t i = 0; i < o.outs.size(); ++i) {
        const OutT& out = o.outs[i];
        if (out.kind == OutT::Ignore) continue;
        // a result that aliases an argument (a view, an in-place op's self, the pieces split or
        // unbind return; unsafe_split's and unsafe_chunk's, unannotated, too) is that argument
        const auto* ret = sets(i < schema.returns().size() ? schema.returns()[i].alias_info() : nullptr);
        std::int64_t base = -1;
        for (std::size_t j = 0; j < schema.arguments().size() && j < o.args.size() && base < 0; ++j) {
          const auto* a = sets(schema.arguments()[j].alias_info());
          const bool aliases = ret != nullptr ? a != nullptr && *a == *ret : name.rfind("aten::unsafe_", 0) == 0 && j == 0;
          if (aliases && o.args[j].refs.size() == 1) base = slot_of(o.args[j].refs[0]);
        }
        for (std::uint32_t e = out.slot; e < out.slot + out.count; ++e) {
          if (base >= 0 && static_cast<std::uint32_t>(base) != e) {
            root[e] = static_cast<std::uint32_t>(base);
          } else if (alloc && out.kind == OutT::Tensor) {
            // an empty allocation holds nothing to write
            const auto& sz = f.slot_sizes[e];
            if (std::find(sz.begin(), sz.end(), 0) == sz.end()) made_by[e] = static_cast<std::int64_t>(k);
          }
        }
      }
    }
    for (std::size_t j = 0; j < f.outputs.size(); ++j) {
      const std::int64_t s = slot_of(f.outputs[j]);
      if (s >= 0 && made_by[static_cast<std::size_t>(s)] >= 0)
        unwritten(s, "the step's output " + std::to_string(j) + " is");
    }
  }

  void add_output(const at::Tensor& t, std::size_t j) {
    if (!t.defined()) {
      f.outputs.push_back(Ref{});
      return;
    }
    check_strided(t, "step output " + std::to_string(j));
    f.outputs.push_back(resolve(t, f.ops.size(), j));
  }

  // A gradient as the ops name it: a slot or a view of one (bound as .grad), an external or an
  // argument (persistent: updated in place, nothing to bind), or none (no op of the call
  // touched it).
  Ref grad_ref(const at::Tensor& g) {
    auto it = by_view_.find(view_key(g));
    if (it != by_view_.end()) return it->second;
    auto st = by_storage_.find(g.storage().unsafeGetStorageImpl());
    if (st == by_storage_.end()) return Ref{};
    return make_view(g, st->second);
  }

  // The .grad of each parameter as a backward() mark ended (CaptureMark::grads_after), named as
  // the ops made so far name them; kept until add_marks makes the marks.
  void add_grads_after(const detail::CaptureMark& m) {
    std::vector<std::pair<std::uint32_t, Ref>> out;
    for (const auto& [impl, g] : m.grads_after) {
      if (!g.defined() || g.layout() != at::kStrided || !g.has_storage()) continue;
      std::int64_t ext = -1;
      for (std::size_t e = 0; e < f.exts.size() && ext < 0; ++e)
        if (f.exts[e].unsafeGetTensorImpl() == impl) ext = static_cast<std::int64_t>(e);
      if (ext < 0) continue;
      const Ref r = grad_ref(g);
      if (r.kind == Ref::Slot || r.kind == Ref::View) out.emplace_back(static_cast<std::uint32_t>(ext), r);
    }
    std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });  // by external, not by address
    grads_after_.emplace(&m, std::move(out));
  }

  // Where backward() and optimizer steps ran (Form::Mark): the tensors backward() was given,
  // named as the ops name them.
  void add_marks(const std::vector<detail::CaptureMark>& marks) {
    for (const detail::CaptureMark& cm : marks) {
      if (cm.open) continue;  // the call raised inside it: no mark
      Form::Mark m;
      m.kind = static_cast<Form::Mark::Kind>(cm.kind);
      m.tag = cm.tag;
      m.begin = cm.begin;
      m.end = cm.end;
      m.retain_graph = cm.retain_graph;
      for (std::size_t j = 0; j < cm.roots.size(); ++j) m.roots.push_back(resolve(cm.roots[j], cm.begin, j));
      for (std::size_t j = 0; j < cm.seeds.size(); ++j) m.seeds.push_back(resolve(cm.seeds[j], cm.begin, j));
      auto ga = grads_after_.find(&cm);
      if (ga != grads_after_.end()) m.grads_after = std::move(ga->second);
      f.marks.push_back(std::move(m));
      mark_grads_.emplace_back(cm.grads.begin(), cm.grads.end());
    }
  }

  // Gradients the engine stored into a leaf's .grad (AccumulateGrad is not an op).
  void add_grad_bindings() {
    const std::size_t n = f.exts.size();
    for (std::size_t e = 0; e < n; ++e) {
      const at::Tensor& p = f.exts[e];
      if (!p.requires_grad() || !p.is_leaf()) continue;
      const at::Tensor& g = p.grad();
      if (!g.defined() || g.layout() != at::kStrided || !g.has_storage()) continue;
      const Ref r = grad_ref(g);
      if (r.kind != Ref::Slot && r.kind != Ref::View) continue;  // none: no op of the call touched it
      f.grads.emplace_back(static_cast<std::uint32_t>(e), r);
    }
  }

  // pre: each parameter's .grad when the call began (impl → gradient, undefined if none).
  void add_grad_pre(const absl::flat_hash_map<const c10::TensorImpl*, at::Tensor>& pre) {
    grad_pre_into(pre, f.grad_pre);
    for (std::size_t m = 0; m < f.marks.size() && m < mark_grads_.size(); ++m)
      grad_pre_into(mark_grads_[m], f.marks[m].grad_pre);
  }

  void grad_pre_into(const absl::flat_hash_map<const c10::TensorImpl*, at::Tensor>& pre,
                     std::vector<Form::GradPre>& out) {
    for (std::size_t e = 0; e < f.exts.size(); ++e) {
      const at::Tensor& p = f.exts[e];
      if (!p.requires_grad() || !p.is_leaf()) continue;
      auto it = pre.find(p.unsafeGetTensorImpl());
      if (it == pre.end()) continue;
      Form::GradPre gp{static_cast<std::uint32_t>(e), Form::GradPre::None, 0};
      const at::Tensor& g = it->second;
      if (g.defined()) {
        // Read when the ops took that very gradient tensor from outside (AccumulateGrad adds
        // into it); the capture holds it, so its TensorImpl identifies it.
        gp.state = Form::GradPre::Unread;
        for (std::size_t x = 0; x < f.exts.size(); ++x) {
          if (f.exts[x].unsafeGetTensorImpl() == g.unsafeGetTensorImpl()) {
            gp.state = Form::GradPre::Read;
            gp.grad_ext = static_cast<std::uint32_t>(x);
            break;
          }
        }
      }
      out.push_back(gp);
    }
  }

  void finish() {
    slot_whole_.resize(f.num_slots, 0);
    f.slot_sizes.resize(f.num_slots);
    f.slot_strides.resize(f.num_slots);
    elide_grad_copies();
    eliminate_dead_ops();
    // Slot lifetimes: a slot is released after its last use (views keep their base).
    std::vector<long> last(f.num_slots, -1);
    std::function<void(Ref, long)> mark = [&](Ref r, long k) {
      if (r.kind == Ref::Slot) last[r.idx] = std::max(last[r.idx], k);
      else if (r.kind == Ref::View) mark(f.views[r.idx].base, k);
    };
    for (std::size_t k = 0; k < f.ops.size(); ++k)
      if (!f.ops[k].skip)
        for (const ArgT& a : f.ops[k].args)
          for (Ref r : a.refs) mark(r, static_cast<long>(k));
    for (Ref r : f.outputs) mark(r, LONG_MAX);
    for (const auto& g : f.grads) mark(g.second, LONG_MAX);
    for (const Form::Mark& m : f.marks) {  // a sync-point call checks them as backward() begins
      const long at = m.begin < f.ops.size() ? static_cast<long>(m.begin) : LONG_MAX;
      for (Ref r : m.roots) mark(r, at);
      for (Ref r : m.seeds) mark(r, at);
    }
    for (std::size_t k = 0; k < f.ops.size(); ++k) {
      for (const OutT& o : f.ops[k].outs)
        for (std::uint32_t s = o.slot; s < o.slot + o.count; ++s)
          if (last[s] < 0) f.ops[k].release.push_back(s);  // never used: dropped at once
    }
    for (std::uint32_t s = 0; s < f.num_slots; ++s)
      if (last[s] >= 0 && last[s] != LONG_MAX) f.ops[static_cast<std::size_t>(last[s])].release.push_back(s);

    // Canonical text and content hash: ops, wiring, constants, metadata; no data pointers.
    f.tail_sig = tail_text(f, true);
    f.hash = hash_ops(f.ops, nullptr, {f.tail_sig});
  }

 // The capture's lifted constants (Note [Lifted constants]): externals compared by value.
  void set_lifted(const std::vector<at::Tensor>& lifted) {
    for (const at::Tensor& t : lifted) lifted_.insert(t.unsafeGetTensorImpl());
  }

 private:
  absl::flat_hash_set<const c10::TensorImpl*> lifted_;
  std::vector<absl::flat_hash_map<const c10::TensorImpl*, at::Tensor>> mark_grads_;  // per mark: .grad as it began
  std::vector<std::uint8_t> slot_whole_;  // per slot: a whole, dense tensor at offset 0 of its own storage
  absl::flat_hash_map<std::uint32_t, std::string> slot_meta_;  // per slot: dtype, sizes, strides (Note [Gradient copies])
  absl::flat_hash_map<const detail::CaptureMark*, std::vector<std::pair<std::uint32_t, Ref>>> grads_after_;
  absl::flat_hash_map<std::string, Ref> by_view_;
  struct Base {
    Ref ref;
    c10::ScalarType dtype;
    std::int64_t offset;
  };
  absl::flat_hash_map<const c10::StorageImpl*, Base> by_storage_;

  // An op whose results nothing reads, that mutates nothing and draws no random numbers
  // (profiler handles, unused views) does not run in the plan. Random ops always run: they
  // advance the generator exactly as eager does.
  // Also kept: checks (_assert_async and friends), which have no results but must run.
  static bool must_run(const std::string& name) {
    return name.find("assert") != std::string::npos || replay::may_draw_random(name);
  }

  // Note [Gradient copies]: AccumulateGrad takes a new gradient over as the parameter's .grad
  // when nothing else holds it, and copies it (new_empty_strided + copy_ with the parameter's
  // layout) when something does. A captured call holds every result, so the capture always
  // shows the copy, where an uncaptured call takes the gradient over (resnet18: 62 copies of
  // 11M floats, 44 MB a step). A copy whose source is a whole, dense tensor with the layout of
  // the copy, read by nothing but the copy, is elided: what read the copy reads the source.
  void elide_grad_copies() {
    std::vector<std::int32_t> producer(f.num_slots, -1);
    for (std::size_t k = 0; k < f.ops.size(); ++k)
      for (const OutT& o : f.ops[k].outs)
        for (std::uint32_t s = o.slot; s < o.slot + o.count; ++s) producer[s] = static_cast<std::int32_t>(k);
    std::vector<int> uses(f.num_slots, 0);
    std::function<void(Ref)> count = [&](Ref r) {
      if (r.kind == Ref::Slot) ++uses[r.idx];
      else if (r.kind == Ref::View) count(f.views[r.idx].base);
    };
    for (const OpT& o : f.ops)
      for (const ArgT& a : o.args)
        for (Ref r : a.refs) count(r);
    for (Ref r : f.outputs) count(r);
    for (const Form::Mark& m : f.marks) {
      for (Ref r : m.roots) count(r);
      for (Ref r : m.seeds) count(r);
    }
    std::vector<std::int64_t> alias(f.num_slots, -1);
    for (std::size_t k = 0; k < f.ops.size(); ++k) {
      OpT& b = f.ops[k];
      if (op_name(b.op) != "aten::copy_" || b.args.size() != 3 || b.outs.size() != 1 ||
          b.args[0].kind != ArgT::Tensor || b.args[1].kind != ArgT::Tensor) continue;
      const Ref dst = b.args[0].refs[0], src = b.args[1].refs[0];
      if (dst.kind != Ref::Slot || src.kind != Ref::Slot || producer[dst.idx] < 0) continue;
      OpT& a = f.ops[static_cast<std::size_t>(producer[dst.idx])];
      if (op_name(a.op) != "aten::new_empty_strided" || a.args.empty() || a.args[0].kind != ArgT::Tensor ||
          a.args[0].refs[0].kind != Ref::Slot || a.args[0].refs[0].idx != src.idx) continue;
      if (a.phase != record::Phase::Backward || b.phase != record::Phase::Backward) continue;
      if (uses[src.idx] != 2 || uses[dst.idx] != 1 || !slot_whole_[src.idx] || !slot_whole_[dst.idx]) continue;
      if (slot_meta_.count(src.idx) == 0 || slot_meta_.count(dst.idx) == 0 ||
          slot_meta_[src.idx] != slot_meta_[dst.idx]) continue;
      alias[dst.idx] = src.idx;
      alias[b.outs[0].slot] = src.idx;
      a.skip = b.skip = true;
    }
    auto remap = [&](Ref& r) {
      if (r.kind == Ref::Slot && alias[r.idx] >= 0) r.idx = static_cast<std::uint32_t>(alias[r.idx]);
    };
    for (OpT& o : f.ops) {
      if (o.skip) continue;
      for (ArgT& a : o.args)
        for (Ref& r : a.refs) remap(r);
    }
    for (ViewSpec& v : f.views) remap(v.base);
    for (Ref& r : f.outputs) remap(r);
    for (auto& g : f.grads) remap(g.second);
    for (Form::Mark& m : f.marks) {
      for (Ref& r : m.roots) remap(r);
      for (Ref& r : m.seeds) remap(r);
      for (auto& g : m.grads_after) remap(g.second);
    }
  }

  void eliminate_dead_ops() {
    std::vector<int> uses(f.num_slots, 0);
    std::function<void(Ref, int)> count = [&](Ref r, int d) {
      if (r.kind == Ref::Slot) uses[r.idx] += d;
      else if (r.kind == Ref::View) count(f.views[r.idx].base, d);
    };
    for (const OpT& o : f.ops)
      if (!o.skip)
        for (const ArgT& a : o.args)
          for (Ref r : a.refs) count(r, 1);
    for (Ref r : f.outputs) count(r, 1);
    for (const auto& g : f.grads) count(g.second, 1);
    for (const Form::Mark& m : f.marks) {
      for (Ref r : m.roots) count(r, 1);
      for (Ref r : m.seeds) count(r, 1);
      for (const auto& g : m.grads_after) count(g.second, 1);
    }
    for (std::size_t k = f.ops.size(); k-- > 0;) {
      OpT& o = f.ops[k];
      if (o.skip || o.op.schema().is_mutable() || must_run(o.op.schema().name())) continue;
      bool used = false;
      for (const OutT& out : o.outs)
        for (std::uint32_t s = out.slot; s < out.slot + out.count; ++s) used |= uses[s] > 0;
      if (used) continue;
      o.skip = true;
      for (const ArgT& a : o.args)
        for (Ref r : a.refs) count(r, -1);
    }
  }

  static std::string layout_text(c10::Layout l) {
    std::ostringstream os;
    os << l;
    return os.str();
  }

  static void check_strided(const at::Tensor& t, const std::string& where) {
    if (t.layout() != at::kStrided || !t.has_storage())
      throw std::runtime_error(where + " is a " + layout_text(t.layout()) +
                               " tensor without strided storage; a compiled step handles strided "
                               "(dense) tensors only, so this step runs eagerly");
  }

  static std::string view_key(const at::Tensor& t) {
    std::string k;
    const auto* st = t.storage().unsafeGetStorageImpl();
    const std::int64_t head[3] = {reinterpret_cast<std::int64_t>(st), t.storage_offset(),
                                  static_cast<std::int64_t>(t.scalar_type())};
    k.append(reinterpret_cast<const char*>(head), sizeof head);
    for (std::int64_t d : t.sizes()) k.append(reinterpret_cast<const char*>(&d), sizeof d);
    k.push_back('|');
    for (std::int64_t d : t.strides()) k.append(reinterpret_cast<const char*>(&d), sizeof d);
    return k;
  }

  void define(const at::Tensor& t, Ref r) {
    if (t.layout() != at::kStrided || !t.has_storage()) return;  // refused where it is used
    by_view_[view_key(t)] = r;
    by_storage_.try_emplace(t.storage().unsafeGetStorageImpl(), Base{r, t.scalar_type(), t.storage_offset()});
  }

  Ref make_view(const at::Tensor& t, const Base& b) {
    if (b.dtype != t.scalar_type())
      throw std::runtime_error(std::string("a tensor of dtype ") + c10::toString(t.scalar_type()) +
                               " shares storage with one of dtype " + c10::toString(b.dtype) +
                               " without a recorded op between them; a compiled step cannot rebuild "
                               "that view, so this step runs eagerly");
    f.views.push_back(ViewSpec{b.ref, t.sizes().vec(), t.strides().vec(), t.storage_offset() - b.offset});
    const Ref r{Ref::View, static_cast<std::uint32_t>(f.views.size() - 1)};
    by_view_[view_key(t)] = r;
    return r;
  }

  Ref resolve(const at::Tensor& t, std::size_t op, std::size_t arg) {
    if (!t.defined()) return Ref{};
    auto it = by_view_.find(view_key(t));
    if (it != by_view_.end()) return it->second;
    auto st = by_storage_.find(t.storage().unsafeGetStorageImpl());
    if (st != by_storage_.end()) return make_view(t, st->second);
    const Ref r{Ref::Ext, static_cast<std::uint32_t>(f.exts.size())};
    f.exts.push_back(t);
    f.ext_use.push_back(Use{op, arg});
    f.ext_lifted.push_back(lifted_.contains(t.unsafeGetTensorImpl()) ? 1 : 0);
    define(t, r);
    return r;
  }

  ArgT make_arg(const c10::IValue& v, OpT& o, std::size_t k, std::size_t i) {
    ArgT a;
    std::string sig;
    auto tensor_ref = [&](const at::Tensor& t) {
      if (t.defined()) check_strided(t, describe_op(o, k) + " argument '" + arg_name(o, i) + "'");
      if (t.defined()) o.tensor_ptrs.push_back(reinterpret_cast<std::uintptr_t>(t.data_ptr()));
      const Ref r = resolve(t, k, i);
      a.refs.push_back(r);
      sig += ref_text(r) + ",";
    };
    if (v.isTensor()) {
      a.kind = ArgT::Tensor;
      tensor_ref(v.toTensor());
    } else if (v.isTensorList()) {
      a.kind = ArgT::TensorList;
      const auto list = v.toTensorList();
      sig = "list[";
      for (std::size_t e = 0; e < list.size(); ++e) tensor_ref(list.get(e));
      sig += "]";
    } else if (v.isList() && has_tensor(v)) {
      a.kind = ArgT::OptTensorList;
      sig = "optlist[";
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) tensor_ref(e.toTensor());
        else if (e.isNone()) tensor_ref(at::Tensor());
        else
          throw std::runtime_error(describe_op(o, k) + " argument '" + arg_name(o, i) +
                                   "' mixes tensors with a " + e.tagKind() + "; this step runs eagerly");
      }
      sig += "]";
    } else if (has_tensor(v)) {
      throw std::runtime_error(describe_op(o, k) + " argument '" + arg_name(o, i) + "' holds tensors inside a " +
                               v.tagKind() + ", which a compiled step does not rebuild; this step runs eagerly");
    } else {
      a.kind = ArgT::Const;
      a.value = v;
      const_text(v, sig);
    }
    o.arg_sig.push_back(std::move(sig));
    return a;
  }

  static bool has_tensor(const c10::IValue& v) {
    if (v.isTensor() || v.isTensorList()) return true;
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (has_tensor(e)) return true;
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements())
        if (has_tensor(e)) return true;
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict())
        if (has_tensor(kv.key()) || has_tensor(kv.value())) return true;
    }
    return false;
  }
};

// ---------------------------------------------------------------------------------------
// Two forms of one signature: does the second repeat the first? "" when it does, else the
// first difference, said for a user.
//
// A scalar that differs between the two calls is a patch point when a known source gives
// both values exactly (bit for bit): Python's replica of a recognized optimizer's scalar
// arithmetic, named by the op and argument it feeds (Replay.h, ScalarSource). The plan
// then takes that source's value at every run.

bool same_bits(double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; }

// The data pointers of the persistent tensors op k reads, directly or through the op that
// produced one of its inputs (Adam's div reads sqrt(exp_avg_sq)): what a source's anchor
// (its parameter or state tensor) must be among.
std::vector<std::uintptr_t> anchors_of(const Form& f, std::size_t k) {
  std::vector<std::uintptr_t> out = f.ops[k].tensor_ptrs;
  for (const ArgT& a : f.ops[k].args)
    for (Ref r : a.refs) {
      if (r.kind != Ref::Slot) continue;
      for (std::size_t j = k; j-- > 0;) {  // the producer of that slot
        bool found = false;
        for (const OutT& o : f.ops[j].outs) found |= r.idx >= o.slot && r.idx < o.slot + o.count;
        if (found) {
          out.insert(out.end(), f.ops[j].tensor_ptrs.begin(), f.ops[j].tensor_ptrs.end());
          break;
        }
      }
    }
  return out;
}

std::int64_t match_source(const Form& b, std::size_t k, const std::string& arg, double va, double vb,
                          const std::vector<ScalarSource>* sa, const std::vector<ScalarSource>* sb) {
  if (sa == nullptr || sb == nullptr || sa->size() != sb->size()) return -1;
  const std::string op = op_name(b.ops[k].op);
  std::vector<std::uintptr_t> anchors;
  bool have_anchors = false;
  for (std::size_t j = 0; j < sa->size(); ++j) {
    const ScalarSource& x = (*sa)[j];
    if (x.op != op || x.arg != arg || !same_bits(x.value, va) || !same_bits((*sb)[j].value, vb)) continue;
    if ((*sb)[j].anchor != 0) {  // tied to a tensor: the op must read it
      if (!have_anchors) {
        anchors = anchors_of(b, k);
        have_anchors = true;
      }
      if (std::find(anchors.begin(), anchors.end(), (*sb)[j].anchor) == anchors.end()) continue;
    }
    return static_cast<std::int64_t>(j);
  }
  return -1;
}

// a_exts: the tensors to compare b's externals with (default a.exts; a plan passes the ones
// its runs use). rebind: when given, a persistent tensor of b that is another object than
// a's (same metadata: a loaded optimizer state, a replaced parameter) is accepted and listed.
// Note [Size families]: two calls of one step whose arguments differ in some sizes (a sequence
// length, a short last batch). Each argument dimension that differs is a symbol, known by its
// value in either call; an integer the two calls differ in is a size when one of the symbols
// explains it with one unknown fitted on one call and checked on the other: S + d, c*S (c
// rational: S/2, 64*S) or c*S*T. Two values always fit a line, so a free affine fit would
// explain anything; these one-parameter fits do not (3 and 5 beside S = 12 and 14 fit S - 9;
// beside S = 12 and 16, nothing). Values past 2^40 are only ever equal (slice ends as INT64_MAX),
// and no symbol is past it: the products below stay in 128 bits.
constexpr std::int64_t kMaxSize = std::int64_t{1} << 40;

bool size_explained(std::int64_t x, std::int64_t y, const SizeSymbols& syms) {
  if (x == y) return true;
  if (x > kMaxSize || x < -kMaxSize || y > kMaxSize || y < -kMaxSize) return false;
  using W = __int128;
  for (std::size_t i = 0; i < syms.size(); ++i) {
    const auto [a, b] = syms[i];
    if (x - a == y - b || W(x) * b == W(y) * a) return true;
    for (std::size_t j = i; j < syms.size(); ++j) {
      const auto [c, d] = syms[j];
      if (W(x) * b * d == W(y) * a * c) return true;
    }
  }
  return false;
}

std::string size_symbols(const Form& a, const Form& b, SizeSymbols& out) {
  out.clear();
  if (a.arg_meta.size() != b.arg_meta.size()) return "the step takes another number of tensor arguments";
  for (std::size_t j = 0; j < a.arg_meta.size(); ++j) {
    const ArgMeta& x = a.arg_meta[j];
    const ArgMeta& y = b.arg_meta[j];
    if (x.sizes.size() != y.sizes.size() || x.dtype != y.dtype || x.device != y.device)
      return "step argument " + std::to_string(j) + " has another rank, dtype or device";
    for (std::size_t d = 0; d < x.sizes.size(); ++d) {
      if (x.sizes[d] == y.sizes[d]) continue;
      if (x.sizes[d] > kMaxSize || y.sizes[d] > kMaxSize)
        return "step argument " + std::to_string(j) + " dimension " + std::to_string(d) + " is past 2^40";
      // 0 and 1 change what broadcasting and empty tensors do: such sizes are never symbols
      if (x.sizes[d] < 2 || y.sizes[d] < 2)
        return "step argument " + std::to_string(j) + " dimension " + std::to_string(d) + " is " +
               std::to_string(x.sizes[d]) + " in one call and " + std::to_string(y.sizes[d]) +
               " in the other (sizes 0 and 1 are specialized)";
      out.emplace_back(x.sizes[d], y.sizes[d]);
    }
  }
  if (out.empty()) return "no argument size differs";
  return "";
}

namespace {
bool ints_explained(const c10::IValue& x, const c10::IValue& y, const SizeSymbols& syms) {
  if (x.isInt() && y.isInt()) return size_explained(x.toInt(), y.toInt(), syms);
  if (!x.isIntList() || !y.isIntList()) return false;
  const auto u = x.toIntVector();
  const auto v = y.toIntVector();
  if (u.size() != v.size()) return false;
  for (std::size_t i = 0; i < u.size(); ++i)
    if (!size_explained(u[i], v[i], syms)) return false;
  return true;
}
}  // namespace

// Note [Gradient bindings]: a step that reads its parameters' gradients without making them
// (an optimizer's step() compiled alone, with backward() run before the call) reads whatever
// tensor .grad holds as the call begins: the same one each call when gradients are zeroed in
// place, a new one each call after zero_grad(set_to_none=True). Such a gradient (a Read
// GradPre) whose tensor is its whole storage is no persistent tensor of the plan: a whole-step
// plan binds it from the parameter's .grad before each run, which must have the recorded
// sizes, strides, offset, dtype, device and requires_grad, be its whole storage too, and share
// no memory with a persistent tensor or with another bound gradient where they did not share it
// when recorded (else the run's guard fails and the step is recorded again). Between runs the
// plan, its form included, holds the gradient's metadata only (meta_only), so the gradient is
// freed as eager frees it. A gradient that is part of a larger storage (a flat gradient buffer,
// whose other parts are other parameters' gradients, views the plan reaches through it) stays a
// persistent tensor. A sync-point plan takes gradients from the call instead (live_exts).

// A tensor with t's dtype, sizes, strides and offset over no memory.
at::Tensor meta_only(const at::Tensor& t) {
  if (!t.is_cpu()) return t;
  c10::Storage none(c10::Storage::use_byte_size_t(), 0, c10::GetDefaultCPUAllocator(), /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(none), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

// Whether t is the whole of its storage (or a meta_only tensor): a gradient a plan may bind.
bool whole_storage(const at::Tensor& t) {
  const std::size_t bytes = t.storage().nbytes();
  return bytes == 0 || (t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
                        bytes == static_cast<std::size_t>(t.numel()) * t.itemsize());
}

std::int64_t grad_param(const Form& f, std::uint32_t e) {
  for (const Form::GradPre& gp : f.grad_pre)
    if (gp.state == Form::GradPre::Read && gp.grad_ext == e) return gp.ext;
  return -1;
}

std::string compare_forms(const Form& a, const Form& b, const std::vector<ScalarSource>* sa,
                          const std::vector<ScalarSource>* sb, std::vector<Patch>* patches,
                          const std::vector<at::Tensor>* a_exts, std::vector<std::uint32_t>* rebind,
                          std::vector<std::uint64_t>* live_args, std::vector<std::uint32_t>* live_exts,
                          const SizeSymbols* sizes) {
  // live_args/live_exts (a sync-point plan): a scalar or a tensor made by Python that differs
  // with no source is taken from each call instead of refusing the plan.
  const char* eager = " Crucible never guesses a value: this step runs eagerly.";
  const std::size_t n = std::min(a.ops.size(), b.ops.size());
  for (std::size_t k = 0; k < n; ++k) {
    const OpT& x = a.ops[k];
    const OpT& y = b.ops[k];
    if (op_name(x.op) != op_name(y.op))
      return "the step ran different ops in two calls: " + describe_op(x, k) + " in one, " + op_name(y.op) +
             " in the other. Its Python code takes a different path from call to call (a branch on a "
             "tensor's value, or on state Crucible does not guard), so it cannot be replayed;"
             " this step runs eagerly.";
    for (std::size_t i = 0; i < x.arg_sig.size() && i < y.arg_sig.size(); ++i) {
      if (x.arg_sig[i] == y.arg_sig[i]) continue;
      if (x.args[i].kind == ArgT::Const && y.args[i].kind == ArgT::Const) {
        if (sizes != nullptr && ints_explained(x.args[i].value, y.args[i].value, *sizes)) continue;
        // A position a sync-point plan already takes from each call (listed in live_args by
        // compare_like before the comparison) stays so at any size.
        const std::uint64_t pos = static_cast<std::uint64_t>(k) << 32 | i;
        if (sizes != nullptr && live_args != nullptr &&
            std::find(live_args->begin(), live_args->end(), pos) != live_args->end())
          continue;
        if (sizes != nullptr && (x.args[i].value.isInt() || x.args[i].value.isIntList()))
          return describe_op(x, k) + " argument '" + arg_name(x, i) + "' was " + x.arg_sig[i] + " at one size and " +
                 y.arg_sig[i] + " at the other: no size of the arguments explains it (S + d, c*S, c*S*T)";
        if (x.args[i].value.isDouble() && y.args[i].value.isDouble()) {
          const std::int64_t j = match_source(b, k, arg_name(x, i), x.args[i].value.toDouble(),
                                              y.args[i].value.toDouble(), sa, sb);
          if (j >= 0 && patches != nullptr) {
            patches->push_back(Patch{static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(i), -1,
                                     static_cast<std::uint32_t>(j)});
            continue;
          }
        }
        if (live_args != nullptr) {
          live_args->push_back(pos);
          continue;
        }
        return describe_op(x, k) + " argument '" + arg_name(x, i) + "' was " + x.arg_sig[i] + " in one call and " +
               y.arg_sig[i] + " in the next: a scalar that changes between calls and has no known source "
               "(Python computed it from a tensor's value, or from a variable that changes).";
      }
      return describe_op(x, k) + " argument '" + arg_name(x, i) + "' is wired differently in two calls (" +
             x.arg_sig[i] + " vs " + y.arg_sig[i] + ")." + eager;
    }
    if (x.out_sig != y.out_sig || x.grad_mode != y.grad_mode)
      return describe_op(x, k) + " has different results or grad mode in two calls." + eager;
  }
  if (a.ops.size() != b.ops.size())
    return "the step ran " + std::to_string(a.ops.size()) + " ops in one call and " + std::to_string(b.ops.size()) +
           " in the next: its Python code takes a different path from call to call, so it cannot be "
           "replayed; this step runs eagerly.";
  if (a.exts.size() != b.exts.size() ||
      (sizes == nullptr ? a.tail_sig != b.tail_sig : tail_text(a, false) != tail_text(b, false)))
    return "the step's outputs, gradients or the tensors it reads from outside differ in shape, dtype or "
           "wiring between two calls." + std::string(eager);
  // Externals: the same tensors (parameters, state), or made afresh with equal values.
  c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
  at::AutoDispatchBelowADInplaceOrView below;
  for (std::size_t e = 0; e < a.exts.size(); ++e) {
    const at::Tensor& x = a_exts != nullptr ? (*a_exts)[e] : a.exts[e];
    const at::Tensor& y = b.exts[e];
    if (x.storage().unsafeGetStorageImpl() == y.storage().unsafeGetStorageImpl()) continue;
    if (live_exts == nullptr && grad_param(a, e) >= 0 && grad_param(a, e) == grad_param(b, e) &&
        x.sizes() == y.sizes() && x.strides() == y.strides() && x.storage_offset() == y.storage_offset() &&
        x.scalar_type() == y.scalar_type() && whole_storage(x) && whole_storage(y))
      continue;   // Note [Gradient bindings]: bound from the parameter's .grad each run
    if (a.ext_lifted[e] != 0 && b.ext_lifted[e] != 0) {   // Note [Lifted constants]: by value
      if (x.sizes() == y.sizes() && x.strides() == y.strides() && x.scalar_type() == y.scalar_type() &&
          x.equal(y))
        continue;
      if (live_exts != nullptr) {
        live_exts->push_back(static_cast<std::uint32_t>(e));
        continue;
      }
      const Use u = b.ext_use[e];
      return (u.op < b.ops.size() ? describe_op(b.ops[u.op], u.op) : std::string("an op")) +
             " writes a tensor the step built from Python data (torch.tensor(...)) that held other "
             "values in two calls: data that changes between calls, with no op to replay. Pass it to "
             "the step as an argument." + std::string(eager);
    }
    if (rebind != nullptr && !x.unsafeGetTensorImpl()->is_wrapped_number() &&
        !y.unsafeGetTensorImpl()->is_wrapped_number()) {
      rebind->push_back(static_cast<std::uint32_t>(e));
      continue;
    }
    // A Python number (a wrapped 0-d tensor made afresh each call) is a scalar like any
    // other: constant when equal. Any other tensor made outside the recorded ops is data
    // Python produced (from_numpy, a tensor built below the dispatcher): never baked in.
    const bool wrapped = x.unsafeGetTensorImpl()->is_wrapped_number() && y.unsafeGetTensorImpl()->is_wrapped_number() &&
                         x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type();
    if (wrapped && x.equal(y)) continue;
    const Use u = b.ext_use[e];
    const bool in_op = u.op < b.ops.size();
    if (wrapped && in_op && x.scalar_type() == at::kDouble) {
      const std::int64_t j = match_source(b, u.op, arg_name(b.ops[u.op], u.arg),
                                          x.item<double>(), y.item<double>(), sa, sb);
      if (j >= 0 && patches != nullptr) {
        patches->push_back(Patch{0, 0, static_cast<std::int64_t>(e), static_cast<std::uint32_t>(j)});
        continue;
      }
    }
    if (live_exts != nullptr) {
      live_exts->push_back(static_cast<std::uint32_t>(e));
      continue;
    }
    std::string where = in_op ? describe_op(b.ops[u.op], u.op) + " argument '" + arg_name(b.ops[u.op], u.arg) + "'"
                              : "step output " + std::to_string(u.arg);
    if (wrapped) {
      std::string xs, ys;
      const_text(x.item(), xs);
      const_text(y.item(), ys);
      return where + " was the Python number " + xs + " in one call and " + ys +
             " in the next: a scalar that changes between calls and has no known source." + eager;
    }
    return where + " reads a tensor that no recorded op produced and that is not a step argument, "
           "parameter, buffer, gradient or optimizer state: a different tensor in each call, made by "
           "Python outside the ops Crucible records (torch.from_numpy, torch.tensor data). Pass it to "
           "the step as an argument." + eager;
  }
  return "";
}

// ---------------------------------------------------------------------------------------

struct Registry {
  std::mutex mu;
  std::int64_t next = 1;
  std::map<std::int64_t, std::shared_ptr<const Form>> forms;
  std::map<std::int64_t, std::shared_ptr<Plan>> plans;
  ReplayCounters counters;                 // under mu, except runs:
  std::atomic<std::uint64_t> runs{0};      // counted on every run without the mutex
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked: plans may run during static destruction
  return *r;
}

thread_local absl::flat_hash_map<const c10::TensorImpl*, at::Tensor> t_pre_grads;  // crucible::note_grads
thread_local std::unique_ptr<Capture> t_active;
thread_local std::unique_ptr<Capture> t_stopped;
thread_local bool t_key_was_on = false;

// Set by run_op's guard: whether the thread's last plan run stopped at its guard (see run_op).
thread_local bool t_guard_failed = false;

std::shared_ptr<const Form> get_form(std::int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.forms.find(id);
  if (it == r.forms.end()) throw std::runtime_error("no captured form " + std::to_string(id));
  return it->second;
}

std::shared_ptr<Plan> get_plan(std::int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.plans.find(id);
  if (it == r.plans.end()) throw std::runtime_error("no plan " + std::to_string(id) + " (released?)");
  return it->second;
}

// ---- the custom ops: the only calls that carry tensors between Python and C++ -----------
// Before a captured call: the .grad of each parameter Python knows, as the call begins.
void note_grads_op(at::TensorList params) {
  t_pre_grads.clear();
  for (const at::Tensor& p : params)
    if (p.defined()) t_pre_grads[p.unsafeGetTensorImpl()] = p.grad();
}

std::int64_t capture_finish_op(at::TensorList args, at::TensorList outputs) {
  std::unique_ptr<Capture> cap = std::move(t_stopped);
  TORCH_CHECK(cap != nullptr, "crucible::capture_finish without a stopped capture on this thread");
  c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
  FormBuilder b;
  b.set_lifted(cap->lifted);
  for (std::size_t j = 0; j < args.size(); ++j) b.add_arg(args[j], j);
  try {
    for (std::size_t k = 0; k <= cap->ops.size(); ++k) {
      for (const detail::CaptureMark& m : cap->marks)  // .grad as each backward() left it, named as of then
        if (!m.open && m.end == k) b.add_grads_after(m);
      if (k < cap->ops.size()) b.add_op(cap->ops[k]);
    }
    for (std::size_t j = 0; j < outputs.size(); ++j) b.add_output(outputs[j], j);
    b.add_marks(cap->marks);
    b.add_grad_bindings();
    b.add_grad_pre(t_pre_grads);
    t_pre_grads.clear();
    b.check_unwritten();
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, e.what());
  }
  cap.reset();  // the call's intermediates are freed here
  b.finish();
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const std::int64_t id = r.next++;
  r.forms.emplace(id, std::make_shared<const Form>(std::move(b.f)));
  ++r.counters.forms;
  return id;
}

// `exts` is the plan's run_exts: the form's externals, with the Python numbers it patches
// replaced by its own copies (the form keeps the values of the call it was captured from).
at::Tensor value_of(const Form& f, const std::vector<at::Tensor>& exts, const std::vector<at::Tensor>& slots,
                    at::TensorList args, Ref r, const std::vector<ViewSpec>* views) {
  switch (r.kind) {
    case Ref::None: return at::Tensor();
    case Ref::Slot: return slots[r.idx];
    case Ref::Arg: return args[r.idx];
    case Ref::Ext: return exts[r.idx];
    case Ref::View: {
      const ViewSpec& v = views != nullptr ? (*views)[r.idx] : f.views[r.idx];
      const at::Tensor base = value_of(f, exts, slots, args, v.base, views);
      return base.as_strided(v.sizes, v.strides, base.storage_offset() + v.offset_delta);
    }
  }
  return at::Tensor();
}

// Note [Bound sizes]: the results of op k of a plan bound to new sizes against the sizes and
// strides its binding predicts for them (defined with the binding, below).
void check_bound_sizes(const Form& f, const SizeBinding& b, std::size_t k, const OutT& out,
                       const std::vector<at::Tensor>& slots);

void run_range(const Plan& p, std::size_t begin, std::size_t end, const std::vector<at::Tensor>& exts,
               std::vector<at::Tensor>& slots, at::TensorList args, at::ArrayRef<double> scalars) {
  const Form& f = *p.form;
  const SizeBinding* bound = p.bound.get();  // Note [Bound sizes]
  const std::vector<ViewSpec>* views = bound != nullptr ? &bound->views : nullptr;
  const bool own_release = !p.sync_release.empty();
  torch::jit::Stack stack;
  bool grad = c10::GradMode::is_enabled();
  for (std::size_t k = begin; k < end; ++k) {
    const OpT& o = f.ops[k];
    if (o.skip) continue;
    if (o.grad_mode != grad) c10::GradMode::set_enabled(grad = o.grad_mode);
    stack.clear();
    std::int32_t patch = p.op_patch[k];
    std::int32_t sized = bound != nullptr ? bound->op_first[k] : -1;
    for (std::size_t i = 0; i < o.args.size(); ++i) {
      const ArgT& a = o.args[i];
      switch (a.kind) {
        case ArgT::Const:
          if (patch >= 0 && static_cast<std::size_t>(patch) < p.patches.size() && p.patches[patch].op == k &&
              p.patches[patch].arg == i && p.patches[patch].ext < 0) {
            stack.emplace_back(scalars[p.patches[patch].source]);
            ++patch;
          } else if (sized >= 0 && static_cast<std::size_t>(sized) < bound->args.size() &&
                     bound->args[sized].first == (static_cast<std::uint64_t>(k) << 32 | i)) {
            stack.push_back(bound->args[sized].second);
            ++sized;
          } else {
            stack.push_back(a.value);
          }
          break;
        case ArgT::Tensor: stack.emplace_back(value_of(f, exts, slots, args, a.refs[0], views)); break;
        case ArgT::TensorList: {
          c10::List<at::Tensor> l;
          l.reserve(a.refs.size());
          for (Ref r : a.refs) l.push_back(value_of(f, exts, slots, args, r, views));
          stack.emplace_back(std::move(l));
          break;
        }
        case ArgT::OptTensorList: {
          c10::List<c10::optional<at::Tensor>> l;
          l.reserve(a.refs.size());
          for (Ref r : a.refs) {
            if (r.kind == Ref::None) l.push_back(c10::nullopt);
            else l.push_back(value_of(f, exts, slots, args, r, views));
          }
          stack.emplace_back(std::move(l));
          break;
        }
      }
    }
    o.op.callBoxed(&stack);
    for (std::size_t i = 0; i < o.outs.size() && i < stack.size(); ++i) {
      const OutT& out = o.outs[i];
      if (out.kind == OutT::Tensor) {
        slots[out.slot] = std::move(stack[i]).toTensor();
      } else if (out.kind == OutT::TensorList) {
        const auto list = stack[i].toTensorList();
        TORCH_CHECK(list.size() == out.count, op_name(o.op), " returned ", list.size(),
                    " tensors in the plan, ", out.count, " when captured");
        for (std::size_t e = 0; e < list.size(); ++e) slots[out.slot + e] = list.get(e);
      }
      if (p.check_sizes && bound != nullptr && out.kind != OutT::Ignore) check_bound_sizes(f, *bound, k, out, slots);
    }
    for (std::uint32_t s : own_release ? p.sync_release[k] : o.release) slots[s].reset();
  }
}

void exec_changed(Plan& p) {
  if (p.arena_state != Plan::Arena::Ready || p.arena.exec_keep == nullptr) return;
  p.arena = ArenaPlan{};
  p.arena_state = Plan::Arena::Unplanned;
}

// The arena after a served run that did not follow the profiled one (or stopped part way):
// off for good; when one of its blocks is still held, its memory is never reused, and when that
// memory is the exec Runner's (Note [One arena]) the Runner takes a fresh arena.
void settle_arena(Plan& p, bool alive, bool failed) {
  ++p.arena_mismatches;
  p.arena_state = Plan::Arena::Off;
  p.arena_note = alive    ? "an arena block outlived a run (retired; its memory is kept)"
                 : failed ? "a run stopped part way"
                          : "a run's allocations did not follow the profiled run (sizes or order)";
  if (!alive) return;
  // Blocks in the exec arena of the Runner that runs next: it must not write there again.
  const bool in_exec = p.arena.exec_served > 0 && p.exec != nullptr &&
                       p.arena.exec_keep.get() == static_cast<void*>(p.exec.get());
  retire_arena(p.arena);
  if (in_exec) {
    try {
      p.exec->renew_arena();
    } catch (const std::exception& e) {  // no memory for a fresh one: the plan runs its ATen ops
      p.exec_note = std::string("the exec stage's arena could not be renewed: ") + e.what();
      p.exec.reset();
    }
  }
}

namespace {
// Note [Warnings of a plan run]
// Eager's Python binding of an ATen op turns the warnings its kernels give (TORCH_WARN) into
// Python warnings: a UserWarning (or DeprecationWarning) that a filter can silence, record or make
// an error. An op called through torch.ops, as crucible::run is, prints them to stderr instead. A
// plan run (and a sync-point plan's native backward, sync_backward_op) collects the warnings its
// calling thread's kernels give and hands them, after the run, to the sink the Python extension
// sets (set_warning_sink), which warns in Python as eager's binding does: the message, with "
// (Triggered internally at FILE:LINE.)" unless the warning is verbatim; a warning a filter makes an
// error raises it then. A run that raises hands them over before its error goes on (a warning made
// an error is dropped: the run's own error is raised). Without a sink they go to the thread's
// handler of before the run (stderr by default). As in eager, a warning given on one of ATen's
// worker threads goes to that thread's handler.
std::atomic<WarningSink> g_warning_sink{nullptr};

std::vector<at::Tensor> run_plan(std::int64_t plan_id, at::TensorList args,
                                 at::ArrayRef<double> scalars);
}  // namespace

void hand_over_warnings(std::vector<c10::Warning>& got, bool run_failed) {
  if (got.empty()) return;
  const WarningSink sink = g_warning_sink.load();
  if (sink == nullptr) {
    for (const c10::Warning& w : got) c10::WarningUtils::get_warning_handler()->process(w);
    got.clear();
    return;
  }
  std::vector<RunWarning> out;
  out.reserve(got.size());
  for (const c10::Warning& w : got) {
    RunWarning r;
    r.deprecation = std::holds_alternative<c10::DeprecationWarning>(w.type());
    r.message = w.msg();
    const c10::SourceLocation& at = w.source_location();
    if (!w.verbatim() && at.file != nullptr)
      r.message += " (Triggered internally at " + std::string(at.file) + ":" +
                   std::to_string(at.line) + ".)";
    out.push_back(std::move(r));
  }
  got.clear();
  sink(out, run_failed);
}

std::vector<at::Tensor> run_op(std::int64_t plan_id, at::TensorList args, at::ArrayRef<double> scalars) {
  return with_run_warnings([&] { return run_plan(plan_id, args, scalars); });
}

namespace {
std::vector<at::Tensor> run_plan(std::int64_t plan_id, at::TensorList args,
                                 at::ArrayRef<double> scalars) {
  t_guard_failed = false;  // set below only by a failure before anything was seen outside the run
  std::shared_ptr<Plan> p = get_plan(plan_id);
  bool idle = false;
  TORCH_CHECK(p->busy.compare_exchange_strong(idle, true),
              "crucible plan ", plan_id, " is already running on another thread; a plan runs one call at a time");
  struct Unbusy {
    Plan& p;
    ~Unbusy() { p.busy.store(false); }
  } unbusy{*p};
  const Form& f = *p->form;
  const std::vector<ArgMeta>& arg_meta = p->bound != nullptr ? p->bound->arg_meta : f.arg_meta;
  const std::vector<ViewSpec>* views = p->bound != nullptr ? &p->bound->views : nullptr;
  TORCH_CHECK(args.size() == arg_meta.size(), "crucible plan ", plan_id, " takes ", arg_meta.size(),
              " tensor arguments, got ", args.size());
  for (std::size_t j = 0; j < args.size(); ++j) {
    const ArgMeta& m = arg_meta[j];
    TORCH_CHECK(args[j].defined() && args[j].sizes() == c10::IntArrayRef(m.sizes) &&
                    args[j].strides() == c10::IntArrayRef(m.strides) && args[j].scalar_type() == m.dtype &&
                    args[j].device() == m.device,
                "crucible plan ", plan_id, ": tensor argument ", j, " does not match the plan (",
                "expected ", c10::toString(m.dtype), dims(m.sizes), " on ", m.device.str(),
                "); crucible.compile guards this and builds another plan");
  }
  // The run's guard on the persistent tensors and the parameters' .grad (see ExtSnap and
  // GradPre). A failure sets the thread's guard-failure flag (take_guard_failure) before the
  // error: crucible.compile then checks the plan against a recorded call instead (nothing has
  // run yet).
  struct Unbind {  // Note [Gradient bindings]: the gradients are not held past the run
    Plan& p;
    ~Unbind() {
      for (std::size_t i = 0; i < p.grad_binds.size(); ++i) p.run_exts[p.grad_binds[i].first] = p.grad_idle[i];
    }
  } unbind{*p};
  if (!p->grad_binds.empty()) {
    absl::flat_hash_map<const c10::StorageImpl*, std::uint32_t> first_on;  // storage -> first binding on it
    for (std::uint32_t i = 0; i < p->grad_binds.size(); ++i) {
      const auto [ge, pe] = p->grad_binds[i];
      const at::Tensor& g = p->run_exts[pe].grad();
      const at::Tensor& want = f.exts[ge];
      bool ok = g.defined() && g.layout() == at::kStrided && g.has_storage() && g.sizes() == want.sizes() &&
                g.strides() == want.strides() && g.storage_offset() == want.storage_offset() &&
                g.scalar_type() == want.scalar_type() && g.device() == want.device() && !g.is_conj() &&
                !g.is_neg() && g.requires_grad() == want.requires_grad() && whole_storage(g);
      // Storage shared where it was shared when recorded, and with no persistent tensor: the
      // exec plan was planned over those storages.
      if (ok) {
        const c10::StorageImpl* st = g.storage().unsafeGetStorageImpl();
        const auto [it, fresh] = first_on.emplace(st, i);
        ok = !p->persistent.contains(st) && (fresh ? p->grad_alias[i] == i : p->grad_alias[i] == it->second);
      }
      t_guard_failed = !ok;
      TORCH_CHECK(ok, "a parameter's .grad is not what it was when the step was recorded (None; other sizes, "
                  "strides, offset, dtype or device; part of a larger storage; or sharing memory it did not "
                  "share then)");
      p->run_exts[ge] = g;
    }
  }
  for (std::size_t e = 0; e < p->ext_snap.size(); ++e) {
    const Plan::ExtSnap& x = p->ext_snap[e];
    if (x.storage == nullptr) continue;
    const at::Tensor& t = p->run_exts[e];
    const bool same = t.storage().unsafeGetStorageImpl() == x.storage && t.storage_offset() == x.offset &&
                      t.sizes() == c10::IntArrayRef(x.sizes) && t.scalar_type() == x.dtype &&
                      t.requires_grad() == x.requires_grad;
    t_guard_failed = !same;
    TORCH_CHECK(same, "a persistent tensor of the plan (", c10::toString(t.scalar_type()), dims(t.sizes()),
                ") changed in place: new data, shape, dtype or requires_grad");
  }
  for (const Form::GradPre& gp : f.grad_pre) {
    const at::Tensor& g = p->run_exts[gp.ext].grad();
    const bool ok = gp.state == Form::GradPre::None     ? !g.defined()
                    : gp.state == Form::GradPre::Unread ? g.defined()
                                                        : g.unsafeGetTensorImpl() == p->run_exts[gp.grad_ext].unsafeGetTensorImpl();
    t_guard_failed = !ok;
    TORCH_CHECK(ok, "a parameter's .grad is not what it was when the step was recorded ",
                "(set to None, accumulated into, or replaced)");
  }
  TORCH_CHECK(scalars.size() == p->build_sources.size() || (p->patches.empty() && scalars.empty()),
              "crucible plan ", plan_id, " takes ", p->build_sources.size(), " scalar source values, got ",
              scalars.size());
  for (const Patch& pt : p->patches)  // Python numbers the plan feeds to ops: set in place
    if (pt.ext >= 0) *p->run_exts[static_cast<std::size_t>(pt.ext)].data_ptr<double>() = scalars[pt.source];
  // Allocations of this thread: logged on the first run (the arena is planned from them),
  // served from the arena afterwards.
  std::optional<AllocScope> alloc;
  std::shared_ptr<AllocLog> profile;
  if (p->arena_state == Plan::Arena::Unplanned) {
    std::string why = ensure_arena_allocator();
    if (!why.empty()) {
      p->arena_state = Plan::Arena::Off;
      p->arena_note = std::move(why);
    } else {
      profile = new_alloc_log();
      alloc.emplace(AllocScope::profile(profile));
    }
  } else if (p->arena_state == Plan::Arena::Ready) {
    alloc.emplace(AllocScope::serve(p->arena));
  }
  c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
  at::AutoDispatchBelowADInplaceOrView below;  // no autograd bookkeeping: the plan has the backward
  c10::AutoGradMode restore(c10::GradMode::is_enabled());
  std::vector<at::Tensor>& slots = p->slots;
  slots.assign(f.num_slots, at::Tensor());
  // A .grad the step discards unread (zero_grad(set_to_none=True) at its start) and replaces
  // (a grad binding sets the new one after the run) is dropped before the run, as eager drops
  // it before its backward: its memory can then serve the new gradient (ExecReplay's outputs
  // of the last run) when nothing else holds it, and a run that fails part way (an index past a
  // table at a bound size) leaves no .grad, as eager's call would. One the step leaves alone
  // stays.
  std::vector<std::pair<std::uint32_t, at::Tensor>> dropped;  // given back if the call runs eagerly instead
  for (const Form::GradPre& gp : f.grad_pre)
    if (gp.state == Form::GradPre::Unread &&
        std::any_of(f.grads.begin(), f.grads.end(), [&](const auto& g) { return g.first == gp.ext; }))
      dropped.emplace_back(gp.ext, std::exchange(p->run_exts[gp.ext].mutable_grad(), at::Tensor()));
  // The exec stage planned its memory from the recorded arguments' offsets in their storages.
  bool offsets_ok = true;
  for (std::size_t j = 0; j < args.size(); ++j) offsets_ok &= args[j].storage_offset() == arg_meta[j].offset;
  if (p->exec != nullptr && offsets_ok) {
    try {
      p->exec->run(f, p->run_exts, slots, args, scalars);
    } catch (...) {
      // A run that stopped part way leaves the arena unplanned (profiling) or off (served):
      // what it allocated did not follow a whole run.
      if (alloc.has_value()) {
        const bool alive = profile == nullptr && alloc->arena_blocks_alive();
        alloc.reset();
        if (profile == nullptr) settle_arena(*p, alive, true);
      }
      throw;
    }
  } else {
    try {
      run_range(*p, 0, f.ops.size(), p->run_exts, slots, args, scalars);
    } catch (...) {
      if (t_guard_failed)  // nothing seen outside the run (check_bound_sizes): as before it
        for (auto& [e, g] : dropped) p->run_exts[e].mutable_grad() = std::move(g);
      throw;
    }
  }
  for (const auto& [e, r] : f.grads) {
    at::Tensor g = value_of(f, p->run_exts, slots, args, r, views);
    p->run_exts[e].mutable_grad() = std::move(g);
  }
  std::vector<at::Tensor> outs;
  outs.reserve(f.outputs.size());
  for (Ref r : f.outputs) outs.push_back(value_of(f, p->run_exts, slots, args, r, views));
  slots.assign(f.num_slots, at::Tensor());
  if (profile != nullptr) {
    alloc.reset();
    if (p->exec != nullptr) {  // Note [One arena]
      ExecArena ea = p->exec->arena_view();
      ea.keep = p->exec;
      p->arena = finish_profile(*profile, &ea);
    } else {
      p->arena = finish_profile(*profile);
    }
    p->arena_state = Plan::Arena::Ready;
  } else if (alloc.has_value()) {
    const bool alive = alloc->arena_blocks_alive();
    const bool mismatch = alive || alloc->mismatched() || alloc->requests() != p->arena.sizes.size();
    alloc.reset();
    if (mismatch) settle_arena(*p, alive, false);
    else ++p->arena_runs;
  }
  p->check_sizes = false;  // Note [Bound sizes]: one run made every result as predicted
  p->runs.fetch_add(1, std::memory_order_relaxed);
  registry().runs.fetch_add(1, std::memory_order_relaxed);
  p->recorded.reset();  // Note [Gradient bindings]: its gradients go with the first run
  return outs;
}
}  // namespace

}  // namespace replay
using namespace replay;

void set_warning_sink(WarningSink sink) { replay::g_warning_sink.store(sink); }

bool take_guard_failure() {
  const bool failed = t_guard_failed;
  t_guard_failed = false;
  return failed;
}

void capture_start(bool capture_only) {
  if (t_active != nullptr) throw std::runtime_error("a crucible.compile capture is already active on this thread");
  // Autocast (and other thread-local dispatch modes) sit below the recording key: the ops
  // are recorded before they cast, and a replay would run them without the cast.
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (!tls.excluded_.has(c10::DispatchKey::AutocastCPU) || !tls.excluded_.has(c10::DispatchKey::AutocastCUDA))
    throw std::runtime_error(
        "crucible.compile cannot record a step that runs under torch.autocast yet (the recorded ops "
        "would replay without their casts); this step runs eagerly");
  t_active = std::make_unique<Capture>();
  t_active->capture_only = capture_only;
  t_stopped.reset();
  t_key_was_on = is_enabled();
  thread_state().capture = t_active.get();
  set_enabled(true);
}

void capture_mark_op(std::int64_t kind, std::int64_t tag, bool retain_graph, at::TensorList roots,
                     at::TensorList seeds) {
  TORCH_CHECK(kind == Form::Mark::Backward || kind == Form::Mark::OptimizerStep, "crucible::capture_mark: kind ", kind);
  if (t_active == nullptr) return;  // not capturing on this thread
  detail::CaptureMark m;
  m.kind = static_cast<std::uint8_t>(kind);
  m.tag = tag;
  m.begin = static_cast<std::uint32_t>(t_active->ops.size());
  m.retain_graph = retain_graph;
  m.roots.assign(roots.begin(), roots.end());
  m.seeds.assign(seeds.begin(), seeds.end());
  if (kind == Form::Mark::Backward)  // each parameter's .grad as backward() begins (Form::Mark::grad_pre)
    for (const auto& [impl, pre] : t_pre_grads) m.grads.emplace_back(impl, impl->grad());
  t_active->marks.push_back(std::move(m));
}

void capture_mark_end() {
  if (t_active == nullptr) return;
  for (auto it = t_active->marks.rbegin(); it != t_active->marks.rend(); ++it) {
    if (!it->open) continue;
    it->open = false;
    it->end = static_cast<std::uint32_t>(t_active->ops.size());
    if (it->kind == Form::Mark::Backward)
      for (const auto& [impl, pre] : t_pre_grads) it->grads_after.emplace_back(impl, impl->grad());
    return;
  }
}

void capture_stop() {
  set_enabled(t_key_was_on);
  if (detail::ThreadState* ts = detail::t_state_ptr) ts->capture = nullptr;  // no state to make just to clear
  t_stopped = std::move(t_active);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  ++r.counters.captures;
}

void capture_discard() {
  if (t_active != nullptr) set_enabled(t_key_was_on);
  if (detail::ThreadState* ts = detail::t_state_ptr) ts->capture = nullptr;
  t_active.reset();
  t_stopped.reset();
}

FormInfo form_info(std::int64_t id) {
  auto f = get_form(id);
  return FormInfo{f->ops.size(), f->hash.hex()};
}

// Note [Releasing under the registry lock]: a form or plan holds tensors, and a tensor with a
// Python object may give up the GIL and take it again as it dies (THPVariable_clear). Dropped
// while r.mu is held, that waits for the GIL while another Python thread holds the GIL and waits
// for r.mu (capture_stop, get_form): a deadlock, seen under ASan with two threads compiling. So
// the registry hands the object out under the lock and it dies after the lock is released.
void form_release(std::int64_t id) {
  std::shared_ptr<const Form> dying;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.forms.find(id);
    if (it == r.forms.end()) return;
    dying = std::move(it->second);
    r.forms.erase(it);
  }
}

namespace replay {
void snapshot_exts(Plan& p) {
  p.ext_snap.clear();
  for (const at::Tensor& t : p.run_exts) {
    const bool grad_bound = std::any_of(p.grad_binds.begin(), p.grad_binds.end(),
                                        [&](const auto& g) { return g.first == p.ext_snap.size(); });
    if (grad_bound || t.unsafeGetTensorImpl()->is_wrapped_number()) {  // checked as it is bound
      p.ext_snap.push_back(Plan::ExtSnap{nullptr, 0, {}, t.scalar_type(), false});
      continue;
    }
    p.ext_snap.push_back(Plan::ExtSnap{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(),
                                       t.scalar_type(), t.requires_grad()});
  }
  p.persistent.clear();
  for (const Plan::ExtSnap& x : p.ext_snap)
    if (x.storage != nullptr) p.persistent.insert(x.storage);
}

// A copy of a Python number (a 0-d CPU tensor) made without an op: binding a size makes a plan's
// own copies of them, and an op through the dispatcher costs microseconds each.
at::Tensor own_number(const at::Tensor& t) {
  if (!t.is_cpu() || t.dim() != 0 || !t.is_contiguous()) {
    at::Tensor c = t.clone();
    c.unsafeGetTensorImpl()->set_wrapped_number(true);
    return c;
  }
  const std::size_t bytes = t.itemsize();
  c10::Storage st(c10::Storage::use_byte_size_t(), bytes, c10::GetDefaultCPUAllocator(), /*resizable=*/false);
  std::memcpy(st.mutable_data(), t.const_data_ptr(), bytes);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(st), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(c10::IntArrayRef{}, c10::IntArrayRef{});
  impl->set_wrapped_number(true);
  return at::Tensor(std::move(impl));
}

// Patches sorted (wrapped-number externals first, then by op and argument) and each op's
// first patch indexed, as run_op walks them.
void index_patches(Plan& p) {
  std::sort(p.patches.begin(), p.patches.end(), [](const Patch& x, const Patch& y) {
    return std::tie(x.ext, x.op, x.arg) < std::tie(y.ext, y.op, y.arg);
  });
  p.op_patch.assign(p.form->ops.size(), -1);
  for (std::size_t i = p.patches.size(); i-- > 0;)
    if (p.patches[i].ext < 0) p.op_patch[p.patches[i].op] = static_cast<std::int32_t>(i);
  if (p.run_exts.empty()) p.run_exts = p.form->exts;
  c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
  at::AutoDispatchBelowADInplaceOrView below;
  for (const Patch& pt : p.patches) {
    if (pt.ext < 0) continue;
    at::Tensor& t = p.run_exts[static_cast<std::size_t>(pt.ext)];
    if (t.unsafeGetTensorImpl() != p.form->exts[static_cast<std::size_t>(pt.ext)].unsafeGetTensorImpl()) continue;
    t = own_number(t);  // the plan's own Python number, written before each run
  }
}

// A new call's form against the plan's: "" when every difference is at a patch point fed by
// a source with the new call's value (found: each such point, old and new).
std::string diff_against_plan(const Plan& p, const Form& f, const std::vector<ScalarSource>& sources,
                              std::vector<Patch>* found, std::vector<std::uint32_t>* rebind = nullptr) {
  if (sources.size() != p.build_sources.size())
    return "the optimizer's scalar sources changed in number since the plan was built";
  // The plan's form holds the values of the call it was captured from; at its patch points
  // those are what the sources gave then. Persistent tensors: the ones the runs use (after a
  // rebind, not the form's).
  std::vector<at::Tensor> exts = p.form->exts;
  for (std::size_t e = 0; e < exts.size() && e < p.run_exts.size(); ++e)
    if (!exts[e].unsafeGetTensorImpl()->is_wrapped_number()) exts[e] = p.run_exts[e];
  return compare_forms(*p.form, f, &p.build_sources, &sources, found, &exts, rebind);
}

ContentHash plan_key(const Form& f, const std::vector<Patch>& patches) {
  c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);  // item() below: not an op of anyone's trace
  at::AutoDispatchBelowADInplaceOrView below;
  // The form's content with the patched scalars masked: the same plan at any step count.
  std::vector<std::vector<std::string>> sig;
  sig.reserve(f.ops.size());
  for (const OpT& o : f.ops) sig.push_back(o.arg_sig);
  std::string masked_exts;
  std::vector<bool> patched_ext(f.exts.size(), false);
  for (const Patch& p : patches) {
    if (p.ext < 0) {
      sig[p.op][p.arg] = "patch" + std::to_string(p.source);
    } else {
      masked_exts += "ext" + std::to_string(p.ext) + "=patch" + std::to_string(p.source) + ";";
      patched_ext[static_cast<std::size_t>(p.ext)] = true;
    }
  }
  // Python numbers the plan does not patch are constants of the plan: their values belong to
  // its content (a step given 0.5 and one given 0.25 are different plans).
  // Lifted constants the same, by the hash of their bytes.
  for (std::size_t e = 0; e < f.exts.size(); ++e) {
    if (f.ext_lifted[e] != 0) {
      const at::Tensor c = f.exts[e].contiguous();
      ContentHasher h;
      h.update_bytes(c.data_ptr(), c.nbytes());
      masked_exts += "ext" + std::to_string(e) + "=lifted:" + h.digest().hex() + ";";
      continue;
    }
    if (patched_ext[e] || !f.exts[e].unsafeGetTensorImpl()->is_wrapped_number()) continue;
    masked_exts += "ext" + std::to_string(e) + "=";
    const_text(f.exts[e].item(), masked_exts);
    masked_exts += ";";
  }
  return hash_ops(f.ops, &sig, {f.tail_sig, masked_exts});
}

std::pair<std::shared_ptr<const Form>, std::shared_ptr<const Form>> forms_of(
    std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
    const std::vector<ScalarSource>& sources_b) {
  auto a = get_form(form_a);
  auto b = get_form(form_b);
  if (sources_a.size() != sources_b.size())
    throw std::runtime_error("crucible: scalar sources of the two recorded calls differ in number");
  return {std::move(a), std::move(b)};
}

std::shared_ptr<Plan> new_plan(const Form& a, std::shared_ptr<const Form> b, std::vector<Patch> patches,
                               const ContentHash& key, const std::vector<ScalarSource>& sources_b,
                               const std::vector<at::Tensor>* a_exts, bool bind_grads) {
  auto p = std::make_shared<Plan>();
  p->key = key;
  p->patches = std::move(patches);
  const std::vector<at::Tensor>& ax = a_exts != nullptr ? *a_exts : a.exts;
  for (const Form::GradPre& gp : b->grad_pre)  // Note [Gradient bindings]
    if (bind_grads && gp.state == Form::GradPre::Read && grad_param(a, gp.grad_ext) == static_cast<std::int64_t>(gp.ext) &&
        whole_storage(b->exts[gp.grad_ext]))
      p->grad_binds.emplace_back(gp.grad_ext, gp.ext);
  auto bound = [&](std::size_t e) {
    return std::any_of(p->grad_binds.begin(), p->grad_binds.end(), [&](const auto& g) { return g.first == e; });
  };
  for (std::size_t e = 0; e < ax.size(); ++e)
    if (ax[e].storage().unsafeGetStorageImpl() != b->exts[e].storage().unsafeGetStorageImpl() && !bound(e))
      p->constants.push_back(static_cast<std::uint32_t>(e));
  if (!p->grad_binds.empty()) {  // Note [Gradient bindings]: the plan's form holds their metadata only
    auto own = std::make_shared<Form>(*b);
    for (std::size_t i = 0; i < p->grad_binds.size(); ++i) {
      const std::uint32_t ge = p->grad_binds[i].first;
      std::uint32_t alias = static_cast<std::uint32_t>(i);
      for (std::size_t j = 0; j < i && alias == i; ++j)
        if (b->exts[p->grad_binds[j].first].storage().unsafeGetStorageImpl() == b->exts[ge].storage().unsafeGetStorageImpl())
          alias = p->grad_alias[j];
      p->grad_alias.push_back(alias);
      p->grad_idle.push_back(meta_only(b->exts[ge]));
      own->exts[ge] = p->grad_idle.back();
    }
    p->recorded = std::move(b);
    b = std::move(own);
  }
  p->form = std::move(b);
  index_patches(*p);
  snapshot_exts(*p);
  p->build_sources = sources_b;
  return p;
}

std::int64_t register_plan(std::shared_ptr<Plan> p, std::chrono::steady_clock::time_point t0) {
  p->build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const std::int64_t id = r.next++;
  r.plans.emplace(id, std::move(p));
  ++r.counters.plan_builds;
  return id;
}
}  // namespace replay

namespace {
// The plan of form b, whose patch points are known (a: a call it repeats, for the constants
// made afresh each call; a_exts: the persistent tensors a's runs use): the registry's plan of
// the same content over the same persistent tensors, or a new one.
std::int64_t plan_of(const Form& a, const std::vector<at::Tensor>& a_exts, std::shared_ptr<const Form> b,
                     std::vector<Patch> patches, const std::vector<ScalarSource>& sources_b,
                     const std::string& runs_on, std::chrono::steady_clock::time_point t0) {
  for (std::size_t k = 0; k < b->ops.size(); ++k)   // Note [Data-sized results]
    if (b->ops[k].data_sized)
      throw std::runtime_error(describe_op(b->ops[k], k) + " makes a tensor whose size depends on tensor values; "
                               "a whole-step plan would run the ops after it at the recorded sizes, so the "
                               "step is not replayed whole");
  const ContentHash key = [&] {
    ContentHasher h;
    const ContentHash form_key = plan_key(*b, patches);
    h.update_u64(form_key.lo);
    h.update_u64(form_key.hi);
    h.update_string(runs_on);
    return h.digest();
  }();
  Registry& r = registry();
  {
    // Content-addressed: the same key over the same persistent tensors is the same plan.
    std::lock_guard<std::mutex> g(r.mu);
    for (const auto& [id, p] : r.plans) {
      const Form& f = *p->form;
      if (p->key != key || f.exts.size() != b->exts.size() || p->build_sources.size() != sources_b.size()) continue;
      bool idle = false;
      if (!p->busy.compare_exchange_strong(idle, true)) continue;  // running: not a candidate now
      bool same = true;
      for (std::size_t e = 0; e < f.exts.size() && same; ++e)
        same = p->run_exts[e].storage().unsafeGetStorageImpl() == b->exts[e].storage().unsafeGetStorageImpl() ||
               f.exts[e].unsafeGetTensorImpl()->is_wrapped_number() || f.ext_lifted[e] != 0 ||  // by value: in the key
               std::any_of(p->grad_binds.begin(), p->grad_binds.end(), [&](const auto& g) {  // Note [Gradient bindings]
                 return g.first == e && grad_param(*b, static_cast<std::uint32_t>(e)) == g.second &&
                        whole_storage(b->exts[e]);
               });
      p->busy.store(false);
      if (same) {
        ++r.counters.plan_cache_hits;
        ++p->refs;
        return id;
      }
    }
  }
  return register_plan(new_plan(a, b, std::move(patches), key, sources_b, &a_exts), t0);
}
}  // namespace

std::int64_t plan_build(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                        const std::vector<ScalarSource>& sources_b, const std::string& runs_on) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [a, b] = forms_of(form_a, form_b, sources_a, sources_b);
  std::vector<Patch> patches;
  const std::string diff = compare_forms(*a, *b, &sources_a, &sources_b, &patches);
  if (!diff.empty()) throw std::runtime_error(diff);
  return plan_of(*a, a->exts, b, std::move(patches), sources_b, runs_on, t0);
}

namespace replay {
Like compare_like(std::int64_t plan, const Form& b, const std::vector<ScalarSource>& sources, bool sync) {
  auto p = get_plan(plan);
  Like r;
  BusyLock hold(*p);
  if (p->sync != sync)
    throw std::runtime_error(sync ? "not a sync-point plan" : "a sync-point plan is not a whole step's");
  if (sources.size() != p->build_sources.size())
    throw std::runtime_error("the optimizer's scalar sources changed in number since the plan was built");
  r.a = p->form;
  r.exts = r.a->exts;  // as diff_against_plan: the persistent tensors the runs use
  for (std::size_t e = 0; e < r.exts.size() && e < p->run_exts.size(); ++e)
    if (!r.exts[e].unsafeGetTensorImpl()->is_wrapped_number()) r.exts[e] = p->run_exts[e];
  SizeSymbols syms;
  // A sync-point plan: what it takes from each call stays taken from each call (an integer
  // among them need not be explained by a size).
  if (sync) r.live_args.assign(p->live_args.begin(), p->live_args.end());
  std::string why = size_symbols(*r.a, b, syms);
  if (why.empty())
    why = compare_forms(*r.a, b, &p->build_sources, &sources, &r.patches, &r.exts, nullptr,
                        sync ? &r.live_args : nullptr, sync ? &r.live_exts : nullptr, &syms);
  if (!why.empty()) throw std::runtime_error(why);
  // The plan's patch points whose sources gave the two calls one value (a learning rate that
  // changed between the plan's recorded calls, not since) stay patch points, each checked to
  // hold its source's value in this call as a patch point found by comparison would.
  for (const Patch& q : p->patches) {
    const bool found = std::any_of(r.patches.begin(), r.patches.end(), [&](const Patch& x) {
      return x.ext == q.ext && (q.ext >= 0 || (x.op == q.op && x.arg == q.arg));
    });
    if (found) continue;
    std::optional<double> v;
    if (q.ext >= 0) {
      const at::Tensor& t = b.exts[static_cast<std::size_t>(q.ext)];
      c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
      at::AutoDispatchBelowADInplaceOrView below;
      if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.scalar_type() == at::kDouble) v = t.item<double>();
    } else if (q.op < b.ops.size() && q.arg < b.ops[q.op].args.size() &&
               b.ops[q.op].args[q.arg].kind == ArgT::Const && b.ops[q.op].args[q.arg].value.isDouble()) {
      v = b.ops[q.op].args[q.arg].value.toDouble();
    }
    if (!v || q.source >= sources.size() || !same_bits(*v, sources[q.source].value))
      throw std::runtime_error("a patch point of the plan does not hold its source's value at this size");
    r.patches.push_back(q);
  }
  for (std::uint32_t e = 0; e < p->live_ext.size(); ++e)
    if (p->live_ext[e] != 0 && std::find(r.live_exts.begin(), r.live_exts.end(), e) == r.live_exts.end())
      r.live_exts.push_back(e);
  return r;
}
}  // namespace replay

namespace {
// Note [Bound sizes]: a recorded form at other sizes that plan `id`'s form repeats.
// Its metadata only: the recorded call's tensors (a gradient it read) are not held for it.
void set_sibling(std::int64_t id, const std::shared_ptr<const Form>& f) {
  auto p = get_plan(id);
  BusyLock hold(*p);
  if (p->sibling != nullptr) return;
  auto m = std::make_shared<Form>(*f);
  for (at::Tensor& t : m->exts) t = meta_only(t);
  p->sibling = std::move(m);
}
}  // namespace

std::int64_t plan_build_like(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources,
                             const std::string& runs_on) {
  const auto t0 = std::chrono::steady_clock::now();
  auto b = get_form(form);
  Like r = compare_like(plan, *b, sources, false);
  const std::int64_t id = plan_of(*r.a, r.exts, b, std::move(r.patches), sources, runs_on, t0);
  set_sibling(id, r.a);
  set_sibling(plan, b);   // the template's sibling too, where it had none (plan_info's shapes)
  return id;
}

std::int64_t plan_build_pair(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                             const std::vector<ScalarSource>& sources_b, const std::string& runs_on) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [a, b] = forms_of(form_a, form_b, sources_a, sources_b);
  SizeSymbols syms;
  std::string why = size_symbols(*a, *b, syms);
  std::vector<Patch> patches;
  if (why.empty())
    why = compare_forms(*a, *b, &sources_a, &sources_b, &patches, nullptr, nullptr, nullptr, nullptr, &syms);
  if (!why.empty()) throw std::runtime_error(why);
  const std::int64_t id = plan_of(*a, a->exts, b, std::move(patches), sources_b, runs_on, t0);
  set_sibling(id, a);
  return id;
}

// Note [Bound sizes]: a whole-step plan for new sizes without recording a call. A plan d and its
// sibling (a recorded call at other sizes it repeats op for op: the template it was derived from,
// or the call it was paired with, Note [Size families]) differ only in integers — op arguments,
// view geometry, result sizes and strides, argument metadata — each either equal in both (a
// constant) or explained by the argument sizes that differ with a one-parameter fit (S + d, c*S,
// c*S*T). The plan for sizes C shares d's form and holds a SizeBinding: each explained integer
// evaluated at C, where all fits that explain it must give one integer, else C is refused (13
// where the fit is S/2). What to evaluate is found once per plan (BindTemplate). This is only
// sound where the step's sizes are such functions of its arguments' sizes:
//   - Python's decisions on sizes are guarded by crucible.compile (Note [Symbolic sizes] in
//     _sizes.py): the plan is asked for only when every size Python read, compared or computed
//     holds at C as it held when recorded;
//   - ATen's own size arithmetic is linear or a product (pointwise, matmul, reductions, views,
//     cat, norms, losses, optimizers) for every op of the form; convolutions, pooling and slices
//     (which clamp their start and end) are checked at C by ATen's formula (window_sizes),
//     skipped ops included; a form with another op that divides or rounds sizes (chunk, split by
//     size, unfold, an arange with a step, an FFT), one whose library chooses a result's size (a
//     workspace: oneDNN's LSTM), an op the op table does not know, or one whose sizes depend on
//     data is not bound (`unbound_op` says which);
//   - the first run checks every result's sizes and strides against the binding's (run_range,
//     check_bound_sizes). A mismatch (a size function outside the fits that fits both recorded
//     sizes: oneDNN's LSTM workspace is 118784 elements at lengths 13 and 14, 122880 at 15)
//     stops the run at that op; when no op up to it drew random numbers or wrote any tensor
//     (effect_free_through), it is a guard failure and crucible.compile runs the call eagerly and
//     records it as the size's own, else the call raises the error and the size is recorded at
//     its next call.
// The bound plan has d's patch points, persistent tensors, gradient bindings and scalar sources.
// It runs its ATen ops; crucible.compile gives it an exec stage at its size's second call
// (Note [Bound exec plans], ExecReplay.cpp). plan_check compares a recorded call at its sizes
// with the binding (bound_diff): verify_every verifies bound plans too.
namespace {
// The value at sizes `c` of an integer that was x at the symbols' first values and y at their
// second: every fit of size_explained that holds must give the same integer, else none.
std::optional<std::int64_t> size_at(std::int64_t x, std::int64_t y, const SizeSymbols& syms,
                                     const std::vector<std::int64_t>& c) {
  if (x == y) return x;
  if (x > kMaxSize || x < -kMaxSize || y > kMaxSize || y < -kMaxSize) return std::nullopt;
  using W = __int128;
  std::optional<W> v;
  bool bad = false;
  auto take = [&](W num, W den) {
    if (den == 0 || num % den != 0) {
      bad = true;
      return;
    }
    const W q = num / den;
    if (q > kMaxSize || q < -kMaxSize || (v && *v != q)) bad = true;
    v = q;
  };
  for (std::size_t i = 0; i < syms.size(); ++i) {
    const auto [a, b] = syms[i];
    if (x - a == y - b) take(W(c[i]) + (x - a), 1);
    if (W(x) * b == W(y) * a) take(W(x) * c[i], a);
    for (std::size_t j = i; j < syms.size(); ++j) {
      const auto [e, g] = syms[j];
      if (W(x) * b * g == W(y) * a * e) take(W(x) * c[i] * c[j], W(a) * e);
    }
  }
  if (bad || !v) return std::nullopt;
  return static_cast<std::int64_t>(*v);
}

}  // namespace

namespace {
// An integer that is x at the symbols' first values and y at their second, as text over the
// symbols' names (one name per distinct pair: "S0"): a symbol's own pair is the symbol, else its
// first fit ("S0 + 2", "4*S0", "1/2*S0", "S0*S0"); x itself where it does not differ, "y?" (the
// plan's own value) where no fit explains it.
std::string size_text(std::int64_t x, std::int64_t y, const SizeSymbols& syms, const std::vector<std::string>& names) {
  if (x == y) return std::to_string(x);
  auto times = [](std::int64_t num, std::int64_t den, const std::string& term) {
    const std::int64_t g = std::gcd(num, den);
    num /= g;
    den /= g;
    if (den < 0) num = -num, den = -den;
    if (den == 1) return num == 1 ? term : std::to_string(num) + "*" + term;
    return std::to_string(num) + "/" + std::to_string(den) + "*" + term;
  };
  for (std::size_t i = 0; i < syms.size(); ++i)
    if (syms[i] == std::pair{x, y}) return names[i];
  if (x <= kMaxSize && x >= -kMaxSize && y <= kMaxSize && y >= -kMaxSize) {
    using W = __int128;
    for (std::size_t i = 0; i < syms.size(); ++i) {
      const auto [a, b] = syms[i];
      if (x - a == y - b) {
        const std::int64_t d = x - a;
        return names[i] + (d > 0 ? " + " + std::to_string(d) : d < 0 ? " - " + std::to_string(-d) : "");
      }
      if (W(x) * b == W(y) * a) return times(x, a, names[i]);
      for (std::size_t j = i; j < syms.size(); ++j) {
        const auto [e, g] = syms[j];
        if (W(x) * b * g == W(y) * a * e && W(a) * e <= kMaxSize) return times(x, a * e, names[i] + "*" + names[j]);
      }
    }
  }
  return std::to_string(y) + "?";
}
}  // namespace

namespace replay {
std::optional<std::int64_t> size_at_sizes(std::int64_t x, std::int64_t y, const SizeSymbols& syms,
                                          const std::vector<std::int64_t>& c) {
  return size_at(x, y, syms, c);
}
}  // namespace replay

namespace {
// Why the sizes of form f's results are not all linear functions or products of its arguments'
// sizes and integer arguments as ATen computes them ("" when they are).
// Note [Bound sizes]: the sizes ATen gives the result of a convolution or a pooling op (their
// one division and rounding), from its input's and its arguments; nullopt for other ops.
std::optional<std::vector<std::int64_t>> window_sizes(const OpT& o, const std::vector<std::int64_t>& in,
                                                      const std::vector<std::int64_t>* weight) {
  const std::string name = op_name(o.op);
  auto ints = [&](std::size_t i) -> std::vector<std::int64_t> {
    if (i >= o.args.size() || o.args[i].kind != ArgT::Const || !o.args[i].value.isIntList()) return {};
    return o.args[i].value.toIntVector();
  };
  auto at = [](const std::vector<std::int64_t>& v, std::size_t d, std::int64_t dflt) {
    return v.empty() ? dflt : v.size() == 1 ? v[0] : d < v.size() ? v[d] : dflt;
  };
  std::vector<std::int64_t> out;
  if (name == "aten::convolution" && weight != nullptr && in.size() >= 3 && weight->size() == in.size()) {
    const auto stride = ints(3), pad = ints(4), dil = ints(5), opad = ints(7);
    const bool transposed = o.args.size() > 6 && o.args[6].value.isBool() && o.args[6].value.toBool();
    const std::int64_t groups = o.args.size() > 8 && o.args[8].value.isInt() ? o.args[8].value.toInt() : 1;
    out = {in[0], transposed ? (*weight)[1] * groups : (*weight)[0]};
    for (std::size_t d = 0; d + 2 < in.size(); ++d) {
      const std::int64_t k = (*weight)[d + 2], s = at(stride, d, 1), p = at(pad, d, 0), dl = at(dil, d, 1);
      if (s <= 0) return std::nullopt;
      out.push_back(transposed ? (in[d + 2] - 1) * s - 2 * p + dl * (k - 1) + at(opad, d, 0) + 1
                               : (in[d + 2] + 2 * p - dl * (k - 1) - 1) / s + 1);
    }
    return out;
  }
  if (name == "aten::slice.Tensor" && o.args.size() >= 5 && o.args[1].value.isInt()) {
    // ATen's slice: start and end clamped into the dimension, then a rounded division by the step
    const std::int64_t dim = o.args[1].value.toInt() < 0 ? o.args[1].value.toInt() + static_cast<std::int64_t>(in.size())
                                                          : o.args[1].value.toInt();
    if (dim < 0 || dim >= static_cast<std::int64_t>(in.size()) || !o.args[4].value.isInt()) return std::nullopt;
    const std::int64_t n = in[static_cast<std::size_t>(dim)], step = o.args[4].value.toInt();
    if (step <= 0) return std::nullopt;
    std::int64_t start = o.args[2].value.isInt() ? o.args[2].value.toInt() : 0;
    std::int64_t end = o.args[3].value.isInt() ? o.args[3].value.toInt() : std::numeric_limits<std::int64_t>::max();
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<std::int64_t>(start, 0, n);
    end = std::clamp<std::int64_t>(end, start, n);
    out = in;
    out[static_cast<std::size_t>(dim)] = (end - start + step - 1) / step;
    return out;
  }
  const bool maxp = name == "aten::max_pool2d_with_indices" || name == "aten::max_pool2d";
  const bool avgp = name == "aten::avg_pool2d";
  if ((maxp || avgp) && (in.size() == 3 || in.size() == 4)) {
    const auto kernel = ints(1), stride_a = ints(2), pad = ints(3);
    const auto dil = maxp ? ints(4) : std::vector<std::int64_t>{};
    const std::size_t ci = maxp ? 5 : 4;
    const bool ceil = o.args.size() > ci && o.args[ci].value.isBool() && o.args[ci].value.toBool();
    const auto stride = stride_a.empty() ? kernel : stride_a;
    out.assign(in.begin(), in.end() - 2);
    for (std::size_t d = 0; d < 2; ++d) {
      const std::int64_t n = in[in.size() - 2 + d], k = at(kernel, d, 1), s = at(stride, d, 1), p = at(pad, d, 0),
                         dl = at(dil, d, 1);
      if (s <= 0) return std::nullopt;
      const std::int64_t span = n + 2 * p - dl * (k - 1) - 1 + (ceil ? s - 1 : 0);
      std::int64_t m = span / s + 1;  // ATen's pooling_output_shape
      if (ceil && (m - 1) * s >= n + p) --m;
      out.push_back(m);
    }
    return out;
  }
  return std::nullopt;
}

// Ops whose results' sizes window_sizes computes (checked at each bound size by ATen's formula).
bool has_window_rule(std::string_view base) {
  return base == "convolution" || base == "max_pool2d_with_indices" || base == "max_pool2d" || base == "avg_pool2d" ||
         base == "slice";
}

// Ops of the Conv and Pooling kinds whose results' sizes need no division (a backward gives its
// input's sizes; an adaptive pool its output_size argument): linear like any other.
bool window_linear(std::string_view base) {
  return base.find("backward") != std::string_view::npos || base.find("adaptive") != std::string_view::npos;
}

std::string unbound_op(const Form& f) {
  static const std::string_view kDivides[] = {"chunk", "unsafe_chunk", "split", "unsafe_split", "tensor_split",
                                              "unfold", "unfold_backward", "im2col", "col2im", "diagonal",
                                              "diag", "tril_indices", "triu_indices", "set_",
                                              "_pack_padded_sequence", "_pad_packed_sequence", "stft", "istft"};
  // A workspace whose size is the library's choice (oneDNN's LSTM: 118784 elements at lengths 13
  // and 14, 122880 at 15), or a result padded to its block size.
  static const std::string_view kWorkspace[] = {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward", "mkldnn_rnn",
                                                "_cudnn_rnn", "_cudnn_rnn_backward", "miopen_rnn",
                                                "miopen_rnn_backward", "_scaled_dot_product_efficient_attention",
                                                "_efficient_attention_forward"};
  // CRUCIBLE_BIND_TRUST_OPS=a,b: kWorkspace ops bound anyway (tests of the first run's check).
  const char* trust_env = std::getenv("CRUCIBLE_BIND_TRUST_OPS");
  const std::string trust = trust_env != nullptr ? "," + std::string(trust_env) + "," : "";
  for (std::size_t k = 0; k < f.ops.size(); ++k) {
    const OpT& o = f.ops[k];
    const std::string name = op_name(o.op);
    const std::string_view base = op_base_name(name);
    const OpClass c = classify_op(name);
    std::string why;
    if (std::none_of(o.outs.begin(), o.outs.end(), [](const OutT& x) { return x.kind != OutT::Ignore; }))
      continue;  // no tensor result: no sizes
    if (((c.kind == CKernel::Conv || c.kind == CKernel::Pooling) && !has_window_rule(base) && !window_linear(base)) ||
        c.kind == CKernel::Collective)
      why = "its result's sizes are divided and rounded from its input's";
    else if (c.kind == CKernel::Opaque && (c.reason == kNotInOpTable || c.reason.find("FFT") != std::string_view::npos ||
                                           c.reason.find("fft") != std::string_view::npos || o.data_sized))
      why = std::string("how its result's sizes follow from its input's is not known (") + std::string(c.reason) + ")";
    else if (base.find("upsample") != std::string_view::npos || base.find("interpolate") != std::string_view::npos ||
             std::find(std::begin(kDivides), std::end(kDivides), base) != std::end(kDivides))
      why = "its result's sizes are divided or rounded from its input's or arguments";
    else if (std::find(std::begin(kWorkspace), std::end(kWorkspace), base) != std::end(kWorkspace) &&
             trust.find("," + std::string(base) + ",") == std::string::npos)
      why = "the library it calls chooses the size of a result (a workspace)";
    else if (base == "arange" && o.args.size() >= 3 && o.args[2].kind == ArgT::Const &&
             !(o.args[2].value.isInt() && (o.args[2].value.toInt() == 1 || o.args[2].value.toInt() == -1)) &&
             (o.args[2].value.isInt() || o.args[2].value.isDouble()))
      why = "an arange with a step: its length is a rounded division";
    if (!why.empty()) return describe_op(o, k) + ": " + why;
  }
  return "";
}
}  // namespace

}  // namespace crucible::vessel

// What binding sizes from a plan needs, found once per plan: the forms, the symbols, every
// integer that differs between them (where and its two values), and the convolutions and
// pooling ops whose sizes are checked by their own formula. The integers that differ take few
// distinct value pairs (a length 12 -> 11 in hundreds of places): each pair is evaluated once
// per binding (`pairs`), every position reads its pair's value by index (`Idx`).
struct crucible::vessel::replay::BindTemplate {
  static constexpr std::uint32_t kSame = UINT32_MAX;     // equal in both forms: the form's value
  static constexpr std::uint32_t kBad = UINT32_MAX - 1;  // the two forms' lists differ in length
  using Idx = std::vector<std::uint32_t>;                // per element: an index into pairs, kSame or kBad
  std::string refusal;  // non-empty: no size is bound from this plan
  std::shared_ptr<const Form> a, b;
  SizeSymbols syms;
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;  // distinct (a's value, b's value) that differ
  // while it is made (make_bind_template)
  absl::flat_hash_map<std::pair<std::int64_t, std::int64_t>, std::uint32_t> pair_of;
  struct ArgPos {
    std::uint32_t op = 0, arg = 0;
    bool list = false;
    std::vector<std::int64_t> y;  // b's value
    Idx at;
  };
  std::vector<ArgPos> args;
  struct ViewPos {
    std::uint32_t view = 0;
    Idx sizes, strides;
    std::uint32_t offset = kSame;
  };
  std::vector<ViewPos> views;                           // views that differ
  std::vector<std::uint32_t> slot_sizes, slot_strides;  // slots that differ...
  std::vector<Idx> slot_size_at, slot_stride_at;        // ...and how (parallel to them)
  std::vector<Idx> arg_stride_at;                       // per step argument
  std::vector<std::uint32_t> windowed;                  // ops window_sizes checks

  std::uint32_t index(std::int64_t x, std::int64_t y) {
    if (x == y) return kSame;
    auto [it, fresh] = pair_of.try_emplace(std::pair{x, y}, static_cast<std::uint32_t>(pairs.size()));
    if (fresh) pairs.emplace_back(x, y);
    return it->second;
  }
  Idx indices(c10::IntArrayRef x, c10::IntArrayRef y) {
    if (x.size() != y.size()) return Idx(std::max<std::size_t>(y.size(), 1), kBad);
    Idx out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = index(x[i], y[i]);
    return out;
  }
  // y's elements at a binding's values of the pairs (nullopt: no single integer there); false
  // where one has none.
  static bool fill(const Idx& at, c10::IntArrayRef y, const std::vector<std::optional<std::int64_t>>& values,
                   std::vector<std::int64_t>& out) {
    if (at.size() != y.size()) return false;
    out.resize(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (at[i] == kSame) {
        out[i] = y[i];
      } else if (at[i] < values.size() && values[at[i]]) {
        out[i] = *values[at[i]];
      } else {
        return false;
      }
    }
    return true;
  }
};

namespace crucible::vessel {
namespace replay {
// A slot's sizes (or strides) at a binding's sizes: the form's, or evaluated from the two recorded
// calls where they differ (empty strides: not checked).
void bound_slot(const SizeBinding& bind, const Form& f, std::uint32_t s, bool strides, std::vector<std::int64_t>& out) {
  const BindTemplate& t = *bind.from;
  const std::vector<std::uint32_t>& differ = strides ? t.slot_strides : t.slot_sizes;
  const auto& form = strides ? f.slot_strides : f.slot_sizes;
  const auto it = std::lower_bound(differ.begin(), differ.end(), s);
  if (it == differ.end() || *it != s) {
    out = form[s];
    return;
  }
  const auto& a = strides ? t.a->slot_strides[s] : t.a->slot_sizes[s];
  const auto& b = strides ? t.b->slot_strides[s] : t.b->slot_sizes[s];
  const auto& at = (strides ? t.slot_stride_at : t.slot_size_at)[static_cast<std::size_t>(it - differ.begin())];
  if (a.empty() || b.empty() || !BindTemplate::fill(at, b, bind.values, out)) out.clear();
}

// Whether ops [0, k] of f (op k has run too) left everything outside the run as it was: none
// drew random numbers (the generator would have moved on; an attention kernel may, with its
// dropout) and none wrote any tensor in place or through out= — a view an op returned may alias
// a persistent tensor or a step argument (a KV cache's slice), so no write is taken for local.
// Then a run stopped at op k may be replaced by an eager call of the step.
bool effect_free_through(const Form& f, std::size_t k) {
  for (std::size_t i = 0; i <= k && i < f.ops.size(); ++i) {
    const OpT& o = f.ops[i];
    if (o.skip) continue;
    const std::string name = op_name(o.op);
    if (may_draw_random(name) || name.find("attention") != std::string::npos) return false;
    const auto& schema_args = o.op.schema().arguments();
    for (std::size_t a = 0; a < o.args.size() && a < schema_args.size(); ++a) {
      const auto* alias = schema_args[a].alias_info();
      if (alias != nullptr && alias->isWrite()) return false;
    }
  }
  return true;
}

void check_bound_sizes(const Form& f, const SizeBinding& b, std::size_t k, const OutT& out,
                       const std::vector<at::Tensor>& slots) {
  std::vector<std::int64_t> want, want_st;
  for (std::uint32_t s = out.slot; s < out.slot + out.count; ++s) {
    const at::Tensor& t = slots[s];
    if (!t.defined() || s >= f.slot_sizes.size() || s >= f.slot_strides.size()) continue;
    bound_slot(b, f, s, false, want);
    bound_slot(b, f, s, true, want_st);
    const bool sizes_ok = t.sizes() == c10::IntArrayRef(want);
    const bool strides_ok = want_st.empty() || t.layout() != at::kStrided || t.strides() == c10::IntArrayRef(want_st);
    if (sizes_ok && strides_ok) continue;
    // Nothing the ops before it did is seen outside the run: the call is run eagerly instead
    // (crucible.compile records it as the size's own, take_guard_failure). Else it stops here.
    const bool recoverable = effect_free_through(f, k);
    t_guard_failed = recoverable;
    TORCH_CHECK(false, "crucible: a plan bound to new sizes without a recorded call expected ",
                describe_op(f.ops[k], k), " to make a tensor of sizes ", dims(want),
                want_st.empty() ? "" : " strides " + dims(want_st),
                ", and ATen made ", dims(t.sizes()), " strides ", dims(t.strides()),
                ": the step's sizes are not the functions of its arguments' sizes that two recorded sizes "
                "suggested. ",
                recoverable ? "No op before it changed anything outside the call: the call runs eagerly and is "
                              "recorded as this size's instead."
                            : "The call stopped at that op (the ops before it ran, as eagerly). Please report "
                              "this; crucible.compile(step, new_sizes=\"record\") records every new size instead.");
  }
}
}  // namespace replay

namespace {
using replay::BindTemplate;

// Two recorded sizes tell a function of one varying size apart from a constant; of two sizes that
// vary independently they do not (batch 8 and length 5, then 5 and 8: B*S is 40 in both calls,
// and a constant to the fits). Sizes are bound only where every dimension that varies varies
// with one pair of values (a sequence length in the inputs and the targets).
std::string independent_sizes(const SizeSymbols& syms) {
  for (const auto& s : syms)
    if (s != syms[0])
      return "two argument sizes vary independently between the recorded calls (" + std::to_string(syms[0].first) +
             " -> " + std::to_string(syms[0].second) + ", " + std::to_string(s.first) + " -> " +
             std::to_string(s.second) + "): two recorded sizes cannot tell their functions apart, so no size is "
             "bound from them";
  return "";
}

std::shared_ptr<const BindTemplate> make_bind_template(std::shared_ptr<const Form> fa, std::shared_ptr<const Form> fb,
                                                       const std::vector<Patch>& patches) {
  auto t = std::make_shared<BindTemplate>();
  t->a = fa;
  t->b = fb;
  struct DropPairMap {  // bindings read `pairs` by index only, on every way out
    BindTemplate& t;
    ~DropPairMap() { decltype(t.pair_of)().swap(t.pair_of); }
  } drop{*t};
  const Form& a = *fa;
  const Form& b = *fb;
  t->refusal = size_symbols(a, b, t->syms);
  if (!t->refusal.empty()) return t;
  t->refusal = independent_sizes(t->syms);
  if (!t->refusal.empty()) return t;
  if (a.ops.size() != b.ops.size() || a.views.size() != b.views.size() || a.num_slots != b.num_slots ||
      a.slot_sizes.size() != b.slot_sizes.size() || a.slot_strides.size() != b.slot_strides.size() ||
      a.arg_meta.size() != b.arg_meta.size()) {
    t->refusal = "the two recorded calls are not of one step";
    return t;
  }
  t->refusal = unbound_op(b);
  if (!t->refusal.empty()) return t;
  for (std::uint32_t k = 0; k < b.ops.size(); ++k) {
    const OpT& x = a.ops[k];
    const OpT& y = b.ops[k];
    if (op_name(x.op) != op_name(y.op) || x.args.size() != y.args.size()) {
      t->refusal = "the two recorded calls are not of one step";
      return t;
    }
    if (has_window_rule(op_base_name(op_name(y.op))))
      t->windowed.push_back(k);   // skipped ops too: Python may have read their sizes
    for (std::uint32_t i = 0; i < y.args.size(); ++i) {
      if (x.arg_sig[i] == y.arg_sig[i] || y.args[i].kind != ArgT::Const) continue;
      if (std::any_of(patches.begin(), patches.end(), [&](const Patch& q) { return q.ext < 0 && q.op == k && q.arg == i; }))
        continue;  // a patch point: each run's value comes from its source
      const c10::IValue& u = x.args[i].value;
      const c10::IValue& v = y.args[i].value;
      BindTemplate::ArgPos pos{k, i, false, {}, {}};
      if (u.isInt() && v.isInt()) {
        pos.y = {v.toInt()};
        pos.at = {t->index(u.toInt(), v.toInt())};
      } else if (u.isIntList() && v.isIntList() && u.toIntVector().size() == v.toIntVector().size()) {
        pos.list = true;
        pos.y = v.toIntVector();
        pos.at = t->indices(u.toIntVector(), pos.y);
      } else {
        t->refusal = describe_op(y, k) + " argument '" + arg_name(y, i) + "' differs between the two recorded calls "
                     "and is no size";
        return t;
      }
      t->args.push_back(std::move(pos));
    }
  }
  for (std::uint32_t v = 0; v < b.views.size(); ++v) {
    const ViewSpec& x = a.views[v];
    const ViewSpec& y = b.views[v];
    if (x.sizes.size() != y.sizes.size() || x.strides.size() != y.strides.size()) {
      t->refusal = "the two recorded calls are not of one step";
      return t;
    }
    if (x.sizes != y.sizes || x.strides != y.strides || x.offset_delta != y.offset_delta)
      t->views.push_back({v, t->indices(x.sizes, y.sizes), t->indices(x.strides, y.strides),
                          t->index(x.offset_delta, y.offset_delta)});
  }
  for (std::uint32_t s = 0; s < b.slot_sizes.size(); ++s) {
    if (a.slot_sizes[s] != b.slot_sizes[s]) {
      t->slot_sizes.push_back(s);
      t->slot_size_at.push_back(t->indices(a.slot_sizes[s], b.slot_sizes[s]));
    }
    if (a.slot_strides[s] != b.slot_strides[s]) {
      t->slot_strides.push_back(s);
      t->slot_stride_at.push_back(t->indices(a.slot_strides[s], b.slot_strides[s]));
    }
  }
  for (std::size_t j = 0; j < b.arg_meta.size(); ++j)
    t->arg_stride_at.push_back(t->indices(a.arg_meta[j].strides, b.arg_meta[j].strides));
  return t;
}
}  // namespace

std::int64_t plan_bind_sizes(std::int64_t plan, at::TensorList args, c10::IntArrayRef sibling_sizes) {
  const auto t0 = std::chrono::steady_clock::now();
  auto pd = get_plan(plan);
  std::shared_ptr<const BindTemplate> tp;
  auto p = std::make_shared<Plan>();
  {
    BusyLock hd(*pd);
    if (pd->sync) throw std::runtime_error("a sync-point plan runs its Python: its sizes are not bound");
    if (pd->sibling == nullptr) throw std::runtime_error("the plan has no recorded call at other sizes");
    std::vector<std::int64_t> sib;  // the sizes the caller's guard was made from must be the sibling's
    for (const ArgMeta& m : pd->sibling->arg_meta) sib.insert(sib.end(), m.sizes.begin(), m.sizes.end());
    if (c10::IntArrayRef(sib) != sibling_sizes)
      throw std::runtime_error("the plan's recorded call at other sizes is another than the one its guard was made "
                               "from (a plan shared between steps)");
    if (pd->bind_template == nullptr) pd->bind_template = make_bind_template(pd->sibling, pd->form, pd->patches);
    tp = pd->bind_template;
    if (!tp->refusal.empty()) throw std::runtime_error(tp->refusal);
    p->form = pd->form;
    p->run_exts = pd->run_exts;
    p->patches = pd->patches;
    p->build_sources = pd->build_sources;
    p->constants = pd->constants;
    p->grad_binds = pd->grad_binds;
    p->grad_idle = pd->grad_idle;
    p->grad_alias = pd->grad_alias;
    p->sibling = pd->sibling;
    p->key = pd->key;
    p->ext_snap = pd->ext_snap;  // the same persistent tensors (a Python number: checked as it is set)
    p->persistent = pd->persistent;
  }
  const BindTemplate& t = *tp;
  const Form& a = *t.a;
  const Form& b = *t.b;
  // The symbols' values at C: the argument dimensions the two recorded calls differ in.
  std::vector<std::int64_t> c;
  if (args.size() != b.arg_meta.size()) throw std::runtime_error("the step takes another number of tensor arguments");
  auto sb = std::make_shared<SizeBinding>();
  SizeBinding& bind = *sb;
  bind.arg_meta = b.arg_meta;
  for (std::size_t j = 0; j < b.arg_meta.size(); ++j) {
    const ArgMeta& x = a.arg_meta[j];
    const ArgMeta& y = b.arg_meta[j];
    const at::Tensor& arg = args[j];
    if (!arg.defined() || arg.dim() != static_cast<std::int64_t>(y.sizes.size()) || arg.scalar_type() != y.dtype ||
        arg.device() != y.device)
      throw std::runtime_error("step argument " + std::to_string(j) + " has another rank, dtype or device");
    for (std::size_t d = 0; d < y.sizes.size(); ++d) {
      const std::int64_t s = arg.size(static_cast<std::int64_t>(d));
      if (x.sizes[d] == y.sizes[d]) {
        if (s != y.sizes[d])
          throw std::runtime_error("step argument " + std::to_string(j) + " dimension " + std::to_string(d) +
                                   " is " + std::to_string(s) + ", and " + std::to_string(y.sizes[d]) +
                                   " in both recorded sizes");
        continue;
      }
      if (s < 2 || s > kMaxSize)
        throw std::runtime_error("step argument " + std::to_string(j) + " dimension " + std::to_string(d) + " is " +
                                 std::to_string(s) + " (sizes 0 and 1 are specialized, and none past 2^40)");
      c.push_back(s);
    }
  }
  auto fail = [](const std::string& what) {
    throw std::runtime_error(what + " has no single integer value at these sizes from the recorded two");
  };
  // Every integer that differs, evaluated at C: each distinct pair once.
  bind.values.resize(t.pairs.size());
  for (std::size_t i = 0; i < t.pairs.size(); ++i) bind.values[i] = size_at(t.pairs[i].first, t.pairs[i].second, t.syms, c);
  bind.op_first.assign(b.ops.size(), -1);
  bind.args.reserve(t.args.size());
  std::vector<std::int64_t> tmp;
  for (const BindTemplate::ArgPos& pos : t.args) {
    if (!BindTemplate::fill(pos.at, pos.y, bind.values, tmp))
      fail(describe_op(b.ops[pos.op], pos.op) + " argument '" + arg_name(b.ops[pos.op], pos.arg) + "'");
    if (bind.op_first[pos.op] < 0) bind.op_first[pos.op] = static_cast<std::int32_t>(bind.args.size());
    bind.args.emplace_back(static_cast<std::uint64_t>(pos.op) << 32 | pos.arg,
                           pos.list ? c10::IValue(tmp) : c10::IValue(tmp[0]));
  }
  bind.views = b.views;
  for (const BindTemplate::ViewPos& vp : t.views) {
    const ViewSpec& y = b.views[vp.view];
    ViewSpec& out = bind.views[vp.view];
    std::int64_t off = y.offset_delta;
    bool off_ok = true;
    if (vp.offset != BindTemplate::kSame) {
      off_ok = vp.offset < bind.values.size() && bind.values[vp.offset].has_value();
      if (off_ok) off = *bind.values[vp.offset];
    }
    if (!BindTemplate::fill(vp.sizes, y.sizes, bind.values, out.sizes) ||
        !BindTemplate::fill(vp.strides, y.strides, bind.values, out.strides) || !off_ok)
      fail("view " + std::to_string(vp.view));
    out.offset_delta = off;
  }
  // The results' sizes and strides must have values here (checked on the first run: evaluated
  // again then, not kept).
  bind.from = tp;
  for (std::size_t i = 0; i < t.slot_sizes.size(); ++i)
    if (!BindTemplate::fill(t.slot_size_at[i], b.slot_sizes[t.slot_sizes[i]], bind.values, tmp))
      fail("result " + std::to_string(t.slot_sizes[i]));
  for (std::size_t i = 0; i < t.slot_strides.size(); ++i) {
    const std::uint32_t s = t.slot_strides[i];
    if (!a.slot_strides[s].empty() && !b.slot_strides[s].empty() &&
        !BindTemplate::fill(t.slot_stride_at[i], b.slot_strides[s], bind.values, tmp))
      fail("result " + std::to_string(s) + "'s strides");
  }
  // Convolutions and pooling: the sizes their one division gives at C must be the fitted ones.
  std::vector<std::int64_t> got;
  auto sizes_of = [&](Ref r, std::vector<std::int64_t>& out) -> bool {
    switch (r.kind) {
      case Ref::Slot: bound_slot(bind, b, r.idx, false, out); return true;
      case Ref::View: out = bind.views[r.idx].sizes; return true;
      case Ref::Arg: out = args[r.idx].sizes().vec(); return true;
      case Ref::Ext: out = b.exts[r.idx].sizes().vec(); return true;
      case Ref::None: return false;
    }
    return false;
  };
  std::vector<std::int64_t> input, weight;
  for (std::uint32_t k : t.windowed) {
    OpT o = b.ops[k];   // with its integers as bound here
    for (std::int32_t i = bind.op_first[k]; i >= 0 && static_cast<std::size_t>(i) < bind.args.size() &&
                                            bind.args[i].first >> 32 == k;
         ++i)
      o.args[bind.args[i].first & 0xffffffffu].value = bind.args[i].second;
    if (o.args.empty() || o.args[0].kind != ArgT::Tensor || o.outs.empty() || o.outs[0].kind != OutT::Tensor) continue;
    if (!sizes_of(o.args[0].refs[0], input)) continue;
    const bool has_weight = o.args.size() > 1 && o.args[1].kind == ArgT::Tensor && sizes_of(o.args[1].refs[0], weight);
    const auto want = window_sizes(o, input, has_weight ? &weight : nullptr);
    if (!want) continue;
    bound_slot(bind, b, o.outs[0].slot, false, got);
    if (*want != got)
      throw std::runtime_error(describe_op(o, k) + " makes " + dims(*want) + " at these sizes, where the recorded "
                               "sizes suggest " + dims(got) + " (a rounded division)");
  }
  for (std::size_t j = 0; j < b.arg_meta.size(); ++j) {
    ArgMeta& m = bind.arg_meta[j];
    if (!BindTemplate::fill(t.arg_stride_at[j], b.arg_meta[j].strides, bind.values, m.strides))
      fail("step argument " + std::to_string(j) + "'s strides");
    m.sizes = args[j].sizes().vec();
    if (args[j].strides() != c10::IntArrayRef(m.strides))
      throw std::runtime_error("step argument " + std::to_string(j) + " has strides " + dims(args[j].strides()) +
                               " where the recorded sizes had " + dims(m.strides) + " at these sizes");
  }
  p->bound = std::move(sb);
  {  // its own content address: d's at these sizes (never taken for d's plan by plan_of)
    ContentHasher h;
    h.update_u64(p->key.lo);
    h.update_u64(p->key.hi);
    h.update_string("bound");
    for (std::int64_t v : c) h.update_u64(static_cast<std::uint64_t>(v));
    p->key = h.digest();
  }
  // d's persistent tensors (rebound ones included); its Python numbers the plan's own copies
  for (std::size_t e = 0; e < p->run_exts.size(); ++e)
    if (p->run_exts[e].unsafeGetTensorImpl()->is_wrapped_number()) p->run_exts[e] = p->form->exts[e];
  index_patches(*p);
  p->check_sizes = true;
  p->exec_note = "sizes bound without a recorded call (Note [Bound sizes]): the plan runs its ATen ops";
  return register_plan(std::move(p), t0);
}

namespace {
// Note [Bound sizes]: a call recorded at a bound plan's sizes against the plan: the same step as
// the form the plan shares (a call at other sizes, Note [Size families]), and every integer —
// op arguments, views, results' sizes, arguments' metadata — the one the binding gives.
std::string bound_diff(const Plan& p, const Form& f, const std::vector<ScalarSource>& sources, std::vector<Patch>* found) {
  const Form& d = *p.form;
  const SizeBinding& b = *p.bound;
  SizeSymbols syms;
  std::string why = size_symbols(d, f, syms);
  if (why.empty()) {
    std::vector<at::Tensor> exts = d.exts;
    for (std::size_t e = 0; e < exts.size() && e < p.run_exts.size(); ++e)
      if (!exts[e].unsafeGetTensorImpl()->is_wrapped_number()) exts[e] = p.run_exts[e];
    why = compare_forms(d, f, &p.build_sources, &sources, found, &exts, nullptr, nullptr, nullptr, &syms);
  }
  if (!why.empty()) return why;
  std::string want;
  for (std::size_t k = 0; k < d.ops.size(); ++k) {
    std::int32_t at = b.op_first[k];
    for (std::size_t i = 0; i < d.ops[k].args.size(); ++i) {
      const ArgT& a = d.ops[k].args[i];
      if (a.kind != ArgT::Const) continue;
      const bool patched = std::any_of(p.patches.begin(), p.patches.end(),
                                       [&](const Patch& q) { return q.ext < 0 && q.op == k && q.arg == i; });
      const bool bound = at >= 0 && static_cast<std::size_t>(at) < b.args.size() &&
                         b.args[at].first == (static_cast<std::uint64_t>(k) << 32 | i);
      if (patched) {
        if (bound) ++at;
        continue;
      }
      want.clear();
      if (bound) const_text(b.args[at++].second, want);
      else want = d.ops[k].arg_sig[i];
      if (want != f.ops[k].arg_sig[i])
        return describe_op(d.ops[k], k) + " argument '" + arg_name(d.ops[k], i) + "' is " + f.ops[k].arg_sig[i] +
               " in the call and " + want + " in the plan bound to its sizes";
    }
  }
  for (std::size_t v = 0; v < d.views.size(); ++v) {
    const ViewSpec& x = b.views[v];
    const ViewSpec& y = f.views[v];
    if (x.sizes != y.sizes || x.strides != y.strides || x.offset_delta != y.offset_delta)
      return "view " + std::to_string(v) + " is " + dims(y.sizes) + dims(y.strides) + " in the call and " +
             dims(x.sizes) + dims(x.strides) + " in the plan bound to its sizes";
  }
  std::vector<std::int64_t> sz;
  for (std::uint32_t s = 0; s < d.slot_sizes.size() && s < f.slot_sizes.size(); ++s) {
    bound_slot(b, d, s, false, sz);
    if (sz != f.slot_sizes[s])
      return "result " + std::to_string(s) + " is " + dims(f.slot_sizes[s]) + " in the call and " + dims(sz) +
             " in the plan bound to its sizes";
  }
  for (std::size_t j = 0; j < b.arg_meta.size() && j < f.arg_meta.size(); ++j)
    if (b.arg_meta[j].sizes != f.arg_meta[j].sizes || b.arg_meta[j].strides != f.arg_meta[j].strides)
      return "step argument " + std::to_string(j) + " is not of the plan's sizes";
  return "";
}
}  // namespace

std::string plan_check(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources) {
  auto p = get_plan(plan);
  auto f = get_form(form);
  BusyLock hold(*p);
  std::vector<Patch> found;
  const std::string diff = p->bound != nullptr ? bound_diff(*p, *f, sources, &found)
                                               : diff_against_plan(*p, *f, sources, &found);
  if (!diff.empty()) return diff;
  for (const Patch& pt : found) {
    bool expected = false;
    for (const Patch& q : p->patches)
      expected |= pt.op == q.op && pt.arg == q.arg && pt.ext == q.ext && pt.source == q.source;
    if (!expected)
      return "a scalar changed where the plan has no patch point (" +
             (pt.ext < 0 ? describe_op(p->form->ops[pt.op], pt.op) + " argument '" + arg_name(p->form->ops[pt.op], pt.arg) + "'"
                         : std::string("a Python number")) + ")";
  }
  return "";
}

std::string plan_update(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources,
                        std::size_t* added, std::size_t* rebound) {
  auto p = get_plan(plan);
  auto f = get_form(form);
  BusyLock hold(*p);
  std::vector<Patch> found;
  std::vector<std::uint32_t> rebind;
  const std::string diff = diff_against_plan(*p, *f, sources, &found, &rebind);
  if (!diff.empty()) return diff;
  *added = 0;
  for (const Patch& pt : found) {
    bool known = false;
    for (const Patch& q : p->patches) known |= pt.op == q.op && pt.arg == q.arg && pt.ext == q.ext;
    if (!known) {
      p->patches.push_back(pt);
      ++*added;
    }
  }
  if (*added != 0) {
    index_patches(*p);
    p->key = plan_key(*p->form, p->patches);
    if (p->exec != nullptr) {  // its patch points were mapped when it was built
      p->exec.reset();
      exec_changed(*p);
      p->exec_note = "dropped: a hyperparameter became a patch point after the exec plan was built "
                     "(the plan runs its ATen ops; crucible.compile records the step again after reset())";
    }
  }
  for (std::uint32_t e : rebind) p->run_exts[e] = f->exts[e];
  snapshot_exts(*p);  // also takes in requires_grad or dtype changes the recorded call agreed with
  *rebound = rebind.size();
  return "";
}

void plan_set_exec_note(std::int64_t id, const std::string& note) {
  auto p = get_plan(id);
  BusyLock hold(*p);
  p->exec_note = note;
}

void plan_set_arena(std::int64_t id, bool on) {
  auto p = get_plan(id);
  BusyLock hold(*p);
  if (!on) {
    p->arena_state = Plan::Arena::Off;
    p->arena_note = "turned off (crucible.compile(arena=False); a bound size until its exec stage runs)";
  } else if (p->arena_state == Plan::Arena::Off && p->arena_mismatches == 0) {
    p->arena_state = Plan::Arena::Unplanned;
  }
}

namespace {
thread_local std::optional<AllocScope> t_measure;
thread_local std::shared_ptr<AllocLog> t_measure_log;
}  // namespace

void alloc_measure_start() {
  const std::string why = ensure_arena_allocator();
  if (!why.empty()) throw std::runtime_error(why);
  if (t_measure.has_value()) throw std::runtime_error("an allocation measurement is already running on this thread");
  t_measure_log = new_alloc_log();
  t_measure.emplace(AllocScope::profile(t_measure_log));
}

std::pair<std::size_t, std::size_t> alloc_measure_stop() {
  if (!t_measure.has_value()) throw std::runtime_error("no allocation measurement is running on this thread");
  t_measure.reset();
  const std::size_t allocations = close_log(*t_measure_log);
  const std::size_t peak = log_peak(*t_measure_log);
  t_measure_log.reset();
  return {peak, allocations};
}

void plan_release(std::int64_t id) {
  std::shared_ptr<Plan> dying;  // Note [Releasing under the registry lock]
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.plans.find(id);
    if (it == r.plans.end() || --it->second->refs > 0) return;
    dying = std::move(it->second);
    r.plans.erase(it);
  }
}

PlanInfo plan_info(std::int64_t id) {
  auto p = get_plan(id);
  BusyLock hold(*p);
  const Form& f = *p->form;
  PlanInfo i;
  for (std::size_t k = 0; k < f.ops.size(); ++k) {
    const OpT& o = f.ops[k];
    if (o.op.schema().name() == "aten::_local_scalar_dense" && o.phase != record::Phase::Optimizer)
      i.value_reads.push_back(describe_op(o, k));
    if (o.skip) continue;
    ++i.ops;
    i.op_names.push_back(op_name(o.op) + " (" + record::phase_name(o.phase) + ")");
  }
  {  // each kernel call's results' sizes, over the varying sizes where the plan has a sibling
    SizeSymbols syms;
    const Form* a = p->sibling.get();
    if (a == nullptr || !size_symbols(*a, f, syms).empty() || a->ops.size() != f.ops.size() ||
        a->slot_sizes.size() != f.slot_sizes.size())
      a = nullptr;
    std::vector<std::string> names;
    std::vector<std::pair<std::int64_t, std::int64_t>> seen;
    for (const auto& pr : syms) {
      auto it = std::find(seen.begin(), seen.end(), pr);
      if (it == seen.end()) {
        seen.push_back(pr);
        names.push_back("S" + std::to_string(seen.size() - 1));
      } else {
        names.push_back(names[static_cast<std::size_t>(it - seen.begin())]);
      }
    }
    for (std::size_t k = 0; k < f.ops.size(); ++k) {
      if (f.ops[k].skip) continue;
      std::string text;
      for (const OutT& out : f.ops[k].outs) {
        if (out.kind == OutT::Ignore) continue;
        const std::uint32_t n = out.kind == OutT::Tensor ? 1 : out.count;
        std::string one = out.kind == OutT::TensorList ? "[" : "";
        for (std::uint32_t s = out.slot; s < out.slot + n && s < f.slot_sizes.size(); ++s) {
          const auto& y = f.slot_sizes[s];
          const std::vector<std::int64_t>* x = a != nullptr ? &a->slot_sizes[s] : nullptr;
          if (x != nullptr && x->size() != y.size()) x = nullptr;
          std::string dims_text = "[";
          for (std::size_t d = 0; d < y.size(); ++d)
            dims_text += (d ? ", " : "") + (x != nullptr ? size_text((*x)[d], y[d], syms, names) : std::to_string(y[d]));
          one += (s > out.slot ? ", " : "") + dims_text + "]";
        }
        if (out.kind == OutT::TensorList) one += "]";
        text += (text.empty() ? "" : ", ") + one;
      }
      i.shapes.push_back(std::move(text));
    }
  }
  i.slots = f.num_slots;
  i.externals = f.exts.size() - p->constants.size();
  i.constants = p->constants.size();
  for (std::uint32_t e : p->constants) {
    const Use u = f.ext_use[e];
    const at::Tensor& t = f.exts[e];
    std::string what = std::string(c10::toString(t.scalar_type())) + dims(t.sizes()) +
                       (t.unsafeGetTensorImpl()->is_wrapped_number() ? " (a Python number)" : "");
    i.constant_uses.push_back(u.op < f.ops.size() ? describe_op(f.ops[u.op], u.op) + " '" + arg_name(f.ops[u.op], u.arg) + "': " + what
                                                  : "output " + std::to_string(u.arg) + ": " + what);
  }
  i.views = f.views.size();
  i.grad_bindings = f.grads.size();
  for (const Form::GradPre& g : f.grad_pre)
    i.grad_checks.push_back(g.state == Form::GradPre::None ? "none" : g.state == Form::GradPre::Read ? "accumulate" : "any");
  i.args = f.arg_meta.size();
  i.outputs = f.outputs.size();
  i.arena = p->arena_state == Plan::Arena::Ready ? "ready"
            : p->arena_state == Plan::Arena::Unplanned ? "unplanned" : "off: " + p->arena_note;
  i.arena_bytes = p->arena.arena_bytes;
  i.arena_lower_bound = p->arena.lower_bound;
  i.arena_served = p->arena.served;
  i.arena_in_exec = p->arena.exec_served;
  i.arena_escaping = p->arena.escaping;
  i.arena_runs = p->arena_runs;
  i.arena_mismatches = p->arena_mismatches;
  i.patches = p->patches.size();
  i.sources = p->build_sources.size();
  i.runs = p->runs.load();
  i.hash = f.hash.hex();
  i.build_ms = p->build_ms;
  i.sync = p->sync;
  for (std::size_t m = 0; m < f.marks.size() && m < p->segments.size(); ++m) {
    const Form::Mark& mk = f.marks[m];
    std::string what = mk.kind == Form::Mark::Backward ? "backward()" : "optimizer " + std::to_string(mk.tag) + " step()";
    what += " (ops " + std::to_string(mk.begin) + "-" + std::to_string(mk.end) + "): ";
    i.segments.push_back(what + (p->segments[m].native ? "native" : "eager: " + p->segments[m].why));
  }
  i.live_args = p->live_args.size();
  for (std::uint8_t x : p->live_ext) i.live_exts += x;
  if (p->exec != nullptr) {
    i.exec = p->exec->backend();
    i.exec_numerics = p->exec->numerics();
    i.exec_summary = p->exec->summary();
    i.exec_kernels = p->exec->kernels();
    i.exec_calls = p->exec->calls();
    i.exec_generated_calls = p->exec->generated_calls();
    i.exec_generated_ops = p->exec->generated_ops();
  }
  i.exec_note = p->exec_note;
  return i;
}

ReplayCounters replay_counters() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  ReplayCounters c = r.counters;
  c.runs = r.runs.load(std::memory_order_relaxed);
  return c;
}

}  // namespace crucible::vessel

TORCH_LIBRARY(crucible, m) {
  m.def("note_grads(Tensor[] params) -> ()", &crucible::vessel::note_grads_op);
  m.def("capture_finish(Tensor[] args, Tensor[] outputs) -> int", &crucible::vessel::capture_finish_op);
  m.def("run(int plan, Tensor[] args, float[] scalars) -> Tensor[]", &crucible::vessel::run_op);
  m.def("plan_bind_sizes(int plan, Tensor[] args, int[] sibling_sizes) -> int",
        &crucible::vessel::plan_bind_sizes);
  m.def("capture_mark(int kind, int tag, bool retain_graph, Tensor[] roots, Tensor[] seeds) -> ()",
        &crucible::vessel::capture_mark_op);
}
