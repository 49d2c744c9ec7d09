// BuildPlan.cpp — IR001 + IR002 → ExecutionPlan: calls in kernel order, one slot per storage,
// tensors over slots, arena offsets from the graph stage's planner (BuildPlan.h).
#include "crucible/exec/BuildPlan.h"

#include <algorithm>
#include <map>
#include <string>

#include "crucible/core/ScalarType.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/forge/Passes.h"
#include "crucible/graph/ArenaPlacement.h"
#include "crucible/graph/FirstFit.h"

namespace crucible::exec {
namespace {

using forge::Ir001;
using forge::Node;
using forge::Value;

// What the plan needs to know of one storage before it becomes a slot.
struct StorageUse {
  bool external = false;  // some value of it comes from outside (producer kNoNode)
  bool wrapped = false;   // ... and that value is a Python number
  bool escapes = false;   // some value of it is read after the step
  bool first_is_write = false;
  bool written = false;                   // some call writes it
  std::uint32_t first = kNone, last = 0;  // calls
  std::uint64_t bytes = 0;
  std::uint64_t storage = 0;
  std::uint32_t wrapped_value = kNone;  // the value, when wrapped
};

std::string value_text(const Ir001& ir, std::uint32_t v) {
  const Value& val = ir.values[v];
  return "value " + std::to_string(v) + " (storage " + std::to_string(val.storage) +
         (val.producer == forge::kNoNode ? std::string(", external)")
                                         : ", from node " + std::to_string(val.producer) + " " +
                                               ir.nodes[val.producer].op + ")");
}

// The bytes a value's elements reach in its storage (0 when it has none), or an error.
Result<std::uint64_t> value_extent(const Ir001& ir, std::uint32_t v) {
  const Value& val = ir.values[v];
  auto es = element_size(val.dtype);
  if (!es.ok())
    return invalid_input(
        value_text(ir, v) + " has dtype " + std::to_string(val.dtype) + ", of no known size",
        "plan only steps whose tensors have fixed-size dtypes");
  if (val.strides.size() != val.shape.size())
    return invalid_input(value_text(ir, v) + " has " + std::to_string(val.shape.size()) +
                             " dims and " + std::to_string(val.strides.size()) + " strides",
                         "build the IR with build_ir001 (a hand-built IR sets Value::strides)");
  std::int64_t high = val.storage_offset;
  if (high < 0)
    return invalid_input(value_text(ir, v) + " starts at a negative offset",
                         "record the step again");
  for (std::size_t d = 0; d < val.shape.size(); ++d) {
    const forge::Expr* e = val.shape[d];
    if (e->kind != forge::Expr::Kind::Const)
      return invalid_input(value_text(ir, v) + " has a symbolic dim", "instantiate the IR first");
    if (e->value == 0) return std::uint64_t{0};
    if (val.strides[d] < 0)
      return invalid_input(value_text(ir, v) + " has a negative stride", "record the step again");
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(e->value - 1, val.strides[d], &reach) ||
        __builtin_add_overflow(high, reach, &high) || high >= std::int64_t{1} << 58)
      return invalid_input(value_text(ir, v) + " reaches past 2^58 elements",
                           "record the step again");
  }
  return (static_cast<std::uint64_t>(high) + 1) * *es;
}

// A VIEW node whose every output lies in the storage of one of its inputs does no work.
bool is_pure_view(const Ir001& ir, const Node& n) {
  if (n.kind != CKernel::View || n.outputs.empty()) return false;
  for (std::uint32_t o : n.outputs) {
    const std::uint64_t s = ir.values[o].storage;
    bool aliases = false;
    for (std::uint32_t i : n.inputs) aliases |= s != 0 && ir.values[i].storage == s;
    if (!aliases) return false;
  }
  return true;
}

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

Result<ExecutionPlan> build_plan(const Ir001& ir, const forge::Ir002& ir2, const PlanOptions& opt) {
  if (ir.symbolic)
    return invalid_input("build_plan: the IR is symbolic",
                         "instantiate it, from a recording at the batch to run");
  if (!ir.recorded_geometry)
    return invalid_input(
        "build_plan: the IR's strides, offsets and storage sizes are one recording's, its shapes "
        "another batch's (symbolize_batch, instantiate)",
        "build the plan from a recording at the batch to run");
  if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0 ||
      opt.alignment > (std::uint64_t{1} << 30))
    return invalid_input("build_plan: alignment " + std::to_string(opt.alignment) +
                             " is not a power of two up to 2^30",
                         "use 16, 64, 256, ...");
  if (ir2.kernels.size() != ir2.groups.size())
    return invalid_input("build_plan: IR002 has " + std::to_string(ir2.kernels.size()) +
                             " kernels for " + std::to_string(ir2.groups.size()) + " groups",
                         "pass the IR002 that lower() made");
  const std::size_t nv = ir.values.size();
  std::vector<bool> escapes(nv, false);
  if (opt.escaping) {
    for (std::uint32_t v : *opt.escaping) {
      if (v >= nv)
        return invalid_input("build_plan: escaping value " + std::to_string(v) + " is out of range",
                             "name values of this IR");
      escapes[v] = true;
    }
  } else {
    for (std::size_t v = 0; v < nv; ++v) escapes[v] = ir.values[v].live_out;
  }

  ExecutionPlan p;
  p.alignment = opt.alignment;
  // Calls, in kernel order.
  std::vector<std::uint32_t> call_of(ir.nodes.size(), kNone);
  std::vector<bool> placed(ir.nodes.size(), false);
  std::map<std::string, std::uint32_t, std::less<>> op_ids;
  for (const forge::KernelNode& k : ir2.kernels) {
    if (k.group >= ir2.groups.size())
      return invalid_input("build_plan: a kernel names group " + std::to_string(k.group),
                           "pass the IR002 that lower() made");
    Kernel kn{k.group, k.kernel, k.recipe, static_cast<std::uint32_t>(p.calls.size()), 0};
    for (std::uint32_t n : ir2.groups[k.group].nodes) {
      if (n >= ir.nodes.size() || placed[n])
        return invalid_input("build_plan: node " + std::to_string(n) + " of group " +
                                 std::to_string(k.group) + " is out of range or in two groups",
                             "pass the IR001 the IR002 was lowered from");
      placed[n] = true;
      const Node& node = ir.nodes[n];
      if (is_pure_view(ir, node)) {
        ++p.elided_views;
        continue;
      }
      if ((!node.input_args.empty() && node.input_args.size() != node.inputs.size()) ||
          (!node.output_args.empty() && node.output_args.size() != node.outputs.size()))
        return invalid_input("build_plan: node " + std::to_string(n) + " " + node.op +
                                 " has argument positions for some of its tensors only",
                             "one ArgPosition per input and output, or none");
      Call c;
      c.node = n;
      c.op = op_ids.emplace(node.op, static_cast<std::uint32_t>(op_ids.size())).first->second;
      c.schema_hash = node.schema_hash;
      c.kind = node.kind;
      c.phase = node.phase;
      c.grad_mode = node.grad_mode;
      call_of[n] = static_cast<std::uint32_t>(p.calls.size());
      p.calls.push_back(c);
      ++kn.call_count;
    }
    p.kernels.push_back(kn);
  }
  for (std::size_t n = 0; n < ir.nodes.size(); ++n)
    if (!placed[n])
      return invalid_input(
          "build_plan: node " + std::to_string(n) + " " + ir.nodes[n].op + " is in no kernel",
          "pass the IR001 the IR002 was lowered from");
  p.op_names.resize(op_ids.size());
  for (const auto& [name, id] : op_ids) p.op_names[id] = name;

  // Storages: who touches them, and when. Keys: the storage id, or ~value for a value with none.
  std::map<std::uint64_t, StorageUse> uses;
  auto key_of = [&](std::uint32_t v) {
    return ir.values[v].storage != 0 ? ir.values[v].storage : ~std::uint64_t{v};
  };
  auto note_value = [&](std::uint32_t v) -> Status {
    const Value& val = ir.values[v];
    StorageUse& u = uses[key_of(v)];
    u.storage = val.storage;
    if (val.producer == forge::kNoNode) {
      u.external = true;
      if (val.wrapped_number) u.wrapped = true, u.wrapped_value = v;
    } else if (val.storage == 0) {
      return invalid_input("build_plan: " + value_text(ir, v) + " has no storage",
                           "plan only steps of dense tensors (no sparse or meta tensors)");
    }
    u.escapes = u.escapes || escapes[v];
    auto extent = value_extent(ir, v);
    if (!extent.ok()) return extent.status();
    u.bytes = std::max({u.bytes, *extent, val.storage_nbytes});
    return ok_status();
  };
  // Every value of every node says what its storage is (the parameter a view of it stands for
  // is external even when only the view's node, which has no call, reads it); calls say when.
  for (const Node& node : ir.nodes)
    for (int output = 0; output < 2; ++output)
      for (std::uint32_t v : output ? node.outputs : node.inputs)
        if (Status st = note_value(v); !st.ok()) return st;
  for (std::uint32_t c = 0; c < p.calls.size(); ++c) {
    const Node& node = ir.nodes[p.calls[c].node];
    for (int output = 0; output < 2; ++output)
      for (std::uint32_t v : output ? node.outputs : node.inputs) {
        StorageUse& u = uses[key_of(v)];
        if (u.first == kNone) u.first = c, u.first_is_write = output == 1;
        u.last = c;
        u.written = u.written || output == 1;
      }
  }
  std::vector<std::uint32_t> result_values;
  for (std::uint32_t v = 0; v < nv; ++v) {
    const Value& val = ir.values[v];
    const bool state_write = val.live_out && val.producer != forge::kNoNode &&
                             uses.contains(key_of(v)) && uses[key_of(v)].external;
    if (!escapes[v] && !state_write) continue;
    if (Status st = note_value(v); !st.ok()) return st;
    result_values.push_back(v);
  }

  // Slots, placed live over whole kernels (Note [Kernel lifetimes]).
  std::map<std::uint64_t, std::uint32_t> slot_of;
  std::uint64_t arena_total = 0;
  for (auto& [key, u] : uses) {
    Slot s;
    s.storage = u.storage;
    s.first = u.first == kNone ? 0 : u.first;
    s.last = u.first == kNone ? 0 : u.last;
    s.bytes = u.bytes;
    if (u.external && u.wrapped && !u.written && !u.escapes) {
      const Value& val = ir.values[u.wrapped_value];
      s.kind = SlotKind::Constant;
      s.dtype = val.dtype;
      s.value = val.wrapped_value;
      s.first = 0;
    } else if (u.external) {
      s.kind = SlotKind::Input;
      s.binding = static_cast<std::uint32_t>(p.inputs.size());
      p.inputs.push_back(static_cast<std::uint32_t>(p.slots.size()));
    } else if (!u.first_is_write) {
      return invalid_input("build_plan: call " + std::to_string(u.first) + " (" +
                               ir.nodes[p.calls[u.first].node].op + ") reads storage " +
                               std::to_string(u.storage) + " before any call writes it",
                           "the IR is inconsistent: verify() it before planning");
    } else if (u.escapes) {
      s.kind = SlotKind::Output;
      s.binding = static_cast<std::uint32_t>(p.outputs.size());
      p.outputs.push_back(static_cast<std::uint32_t>(p.slots.size()));
    }
    if (s.kind == SlotKind::Arena || s.kind == SlotKind::Constant) {
      s.bytes = align_up(std::max<std::uint64_t>(s.bytes, 1), opt.alignment);
      if (s.bytes > graph::kMaxPlacedBytes - arena_total)
        return invalid_input("build_plan: the step's tensors add up to more than 2^62 bytes",
                             "record the step again");
      arena_total += s.bytes;
    }
    slot_of[key] = static_cast<std::uint32_t>(p.slots.size());
    p.slots.push_back(s);
  }
  auto layout = place_arena(p, plan_memory_use(p));
  if (!layout.ok()) return layout.status();
  for (std::size_t s = 0; s < p.slots.size(); ++s) p.slots[s].offset = layout->offsets[s];
  p.arena_bytes = layout->arena_bytes;

  // Tensors, made on first use.
  std::vector<std::uint32_t> tensor_of(nv, kNone);
  auto tensor = [&](std::uint32_t v) {
    if (tensor_of[v] != kNone) return tensor_of[v];
    const Value& val = ir.values[v];
    TensorRef t;
    t.slot = slot_of.at(key_of(v));
    t.dtype = val.dtype;
    t.flags = val.wrapped_number ? kWrappedNumber : 0;
    t.ndim = static_cast<std::uint16_t>(val.shape.size());
    t.dims = static_cast<std::uint32_t>(p.dims.size());
    t.value = v;
    t.offset = val.storage_offset;
    for (const forge::Expr* d : val.shape) p.dims.push_back(d->value);
    p.dims.insert(p.dims.end(), val.strides.begin(), val.strides.end());
    tensor_of[v] = static_cast<std::uint32_t>(p.tensors.size());
    p.tensors.push_back(t);
    return tensor_of[v];
  };
  for (Call& c : p.calls) {
    const Node& node = ir.nodes[c.node];
    c.in_begin = static_cast<std::uint32_t>(p.args.size());
    c.in_count = static_cast<std::uint32_t>(node.inputs.size());
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const forge::ArgPosition at = node.input_args.empty()
                                        ? forge::ArgPosition{static_cast<std::uint32_t>(k), 0}
                                        : node.input_args[k];
      p.args.push_back(Arg{tensor(node.inputs[k]), at.arg, at.list});
    }
    c.out_begin = static_cast<std::uint32_t>(p.args.size());
    c.out_count = static_cast<std::uint32_t>(node.outputs.size());
    for (std::size_t k = 0; k < node.outputs.size(); ++k) {
      const forge::ArgPosition at = node.output_args.empty()
                                        ? forge::ArgPosition{static_cast<std::uint32_t>(k), 0}
                                        : node.output_args[k];
      p.args.push_back(Arg{tensor(node.outputs[k]), at.arg, at.list});
    }
    c.scalar_begin = static_cast<std::uint32_t>(p.scalars.size());
    c.scalar_count = static_cast<std::uint32_t>(node.scalars.size());
    p.scalars.insert(p.scalars.end(), node.scalars.begin(), node.scalars.end());
  }
  for (std::uint32_t v : result_values) p.results.push_back(tensor(v));

  // Patch points.
  for (const PlanOptions::ScalarPatch& sp : opt.scalar_patches) {
    const std::uint32_t c = sp.node < call_of.size() ? call_of[sp.node] : kNone;
    if (c == kNone || sp.scalar >= p.calls[c].scalar_count)
      return invalid_input("build_plan: scalar patch '" + sp.name + "' names scalar " +
                               std::to_string(sp.scalar) + " of node " + std::to_string(sp.node) +
                               ", which has no call or no such scalar",
                           "name a node that runs and the position of the scalar in its scalars");
    p.patches.push_back(
        PatchPoint{PatchKind::Scalar, p.calls[c].scalar_begin + sp.scalar, sp.name});
  }
  for (const PlanOptions::ConstantPatch& cp : opt.constant_patches) {
    const bool known = cp.value < nv && tensor_of[cp.value] != kNone;
    const std::uint32_t s = known ? p.tensors[tensor_of[cp.value]].slot : kNone;
    if (s == kNone || p.slots[s].kind != SlotKind::Constant)
      return invalid_input("build_plan: constant patch '" + cp.name + "' names value " +
                               std::to_string(cp.value) +
                               ", which is not a Python number a call reads",
                           "name a wrapped-number input of a call");
    p.patches.push_back(PatchPoint{PatchKind::Constant, s, cp.name});
  }
  if (Status st = verify_plan(p); !st.ok())
    return bad_state("build_plan made a plan that fails verification: " + message_of(st),
                     "this is a planner bug: report it with the step");
  return p;
}

Result<SteppedPlan> plan_step(const record::Trace& t, std::span<const std::size_t> ops,
                              forge::ExprPool& pool, const forge::RuleSet& rules,
                              const forge::Policy& policy, const PlanOptions& options,
                              double budget_micros) {
  auto ir = forge::build_ir001(t, ops, pool);
  if (!ir.ok()) return ir.status();
  auto fe = forge::run_front_end(std::move(*ir), rules, policy, budget_micros);
  if (!fe.ok()) return fe.status();
  auto plan = build_plan(fe->ir, fe->plan, options);
  if (!plan.ok()) return plan.status();
  return SteppedPlan{std::move(fe->ir), std::move(fe->plan), std::move(*plan)};
}

}  // namespace crucible::exec
