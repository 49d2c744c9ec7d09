// Runner.cpp — binds a run's memory, writes constants and patches, runs the kernels in order.
#include "crucible/exec/Runner.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"
#include "crucible/exec/VerifyPlan.h"

namespace crucible::exec {
namespace {

// Writes a Python number into a 0-d tensor of `dtype`, as c10 converts a double (at == nullptr:
// only says whether it can). Only the dtypes a Python number takes (bool, int, float) and their
// narrower kin.
bool write_number(void* at, std::int8_t dtype, double v) {
  auto put = [&](auto x) {
    if (at != nullptr) std::memcpy(at, &x, sizeof x);
    return true;
  };
  // An integer out of its type's range (or NaN) is refused, not converted (undefined in C++).
  auto integer = [&](auto zero) {
    using T = decltype(zero);
    using L = std::numeric_limits<T>;
    constexpr double lo = std::is_signed_v<T> ? static_cast<double>(L::min()) : 0.0;
    constexpr double hi = std::is_signed_v<T> ? -lo : 2.0 * static_cast<double>(L::max() / 2 + 1);
    const bool fits = v >= lo && v < hi;  // false for NaN
    return (fits || at == nullptr) && put(fits ? static_cast<T>(v) : T{0});
  };
  switch (dtype) {
    case dtype::kUInt8:
      return integer(std::uint8_t{0});
    case dtype::kInt8:
      return integer(std::int8_t{0});
    case dtype::kInt16:
      return integer(std::int16_t{0});
    case dtype::kInt32:
      return integer(std::int32_t{0});
    case dtype::kInt64:
      return integer(std::int64_t{0});
    case dtype::kFloat32:
      return put(static_cast<float>(v));
    case dtype::kFloat64:
      return put(v);
    case dtype::kBool:
      return put(static_cast<std::uint8_t>(v != 0));
    default:
      return false;
  }
}

}  // namespace

Runner::Runner(const ExecutionPlan& plan, Backend backend, Provider provider)
    : plan_(plan), backend_(backend), provider_(provider) {}

Runner::~Runner() {
  if (arena_ != nullptr) backend_.free_arena(backend_.self, arena_);
  for (void* old : old_arenas_) backend_.free_arena(backend_.self, old);
}

std::vector<ArenaUse> Runner::arena_uses() const {
  std::vector<ArenaUse> out;
  for (std::uint32_t s = 0; s < placed_.size(); ++s)
    if (placed_[s]) out.push_back({offsets_[s], plan_.slots[s].bytes, live_[s].first, live_[s].second});
  return out;
}

Status Runner::renew_arena() {
  void* fresh = backend_.alloc_arena(backend_.self, arena_bytes_, plan_.alignment);
  if (fresh == nullptr)
    return exhausted("backend '" + std::string(backend_.name) + "' could not allocate a new " +
                         std::to_string(arena_bytes_) + "-byte arena",
                     "free memory, or plan a smaller batch");
  old_arenas_.push_back(arena_);  // kept until the Runner goes: something placed in it may be held
  arena_ = fresh;
  return ok_status();
}

Result<std::unique_ptr<Runner>> Runner::make(const ExecutionPlan& plan, Backend backend,
                                             Provider provider) {
  if (Status st = verify_plan(plan); !st.ok()) return st;
  auto full = with_defaults(backend);
  if (!full.ok()) return full.status();
  if (provider.call == nullptr)
    return invalid_input("a provider without its call",
                         "set Provider::call: who performs a library call");
  for (const Slot& s : plan.slots)
    if (s.kind == SlotKind::Constant && !write_number(nullptr, s.dtype, 0))
      return unsupported("the plan holds a Python number of dtype " + std::to_string(s.dtype) +
                             " (storage " + std::to_string(s.storage) + ")",
                         "numbers of bool, integer, float32 and float64 dtypes only");
  std::unique_ptr<Runner> r(new Runner(plan, *full, provider));
  if (Status st = r->backend_.prepare(r->backend_.self, plan); !st.ok()) return st;
  MemoryUse use;
  if (Status st = r->backend_.memory_use(r->backend_.self, plan, use); !st.ok()) return st;
  if (Status st = check_memory_use(plan, use); !st.ok())
    return bad_state("backend '" + std::string(r->backend_.name) +
                         "' reports a memory use that does not fit the plan: " + message_of(st),
                     "this is a backend bug: report it");
  auto library_only = [&](std::uint32_t c) { return use.library_only.empty() || use.library_only[c]; };
  // Outputs a provider that allocates may adopt need no arena memory (Note [Adopted results]).
  if (r->provider_.allocates != nullptr) {
    for (std::uint32_t c = 0; c < plan.calls.size(); ++c) {
      if (!library_only(c)) continue;  // the backend's own code may write its outputs
      const Call& call = plan.calls[c];
      bool any = false;
      for (const Arg& a : plan.outputs_of(call)) {
        const Slot& s = plan.slots[plan.tensors[a.tensor].slot];
        any = any || (s.kind == SlotKind::Arena && s.first == c);
      }
      if (!any || !r->provider_.allocates(r->provider_.self, plan, c)) continue;
      if (use.untouched.empty()) use.untouched.assign(plan.slots.size(), false);
      for (const Arg& a : plan.outputs_of(call)) {
        const std::uint32_t slot = plan.tensors[a.tensor].slot;
        if (plan.slots[slot].kind == SlotKind::Arena && plan.slots[slot].first == c) use.untouched[slot] = true;
      }
    }
  }
  r->spill_.resize(plan.slots.size());
  // Calls whose results all die inside the step, released after the kernel that ends their
  // last reader's span (a generated run reads over its whole span).
  if (r->provider_.release != nullptr) {
    std::vector<std::uint32_t> kernel_of(plan.calls.size(), 0);
    for (std::uint32_t k = 0; k < plan.kernels.size(); ++k)
      for (std::uint32_t c = plan.kernels[k].call_begin; c < plan.kernels[k].call_begin + plan.kernels[k].call_count; ++c)
        kernel_of[c] = k;
    r->release_after_.resize(plan.kernels.size());
    for (std::uint32_t c = 0; c < plan.calls.size(); ++c) {
      const Call& call = plan.calls[c];
      if (call.out_count == 0 || !library_only(c)) continue;
      std::uint32_t dead = c;
      bool inside = true;
      for (const Arg& a : plan.outputs_of(call)) {
        const Slot& s = plan.slots[plan.tensors[a.tensor].slot];
        inside = inside && s.kind == SlotKind::Arena;
        dead = std::max(dead, use.spans[s.last].second);
      }
      if (inside) r->release_after_[kernel_of[dead]].push_back(c);
    }
  }
  auto layout = place_arena(plan, use);
  if (!layout.ok()) return layout.status();
  r->offsets_ = std::move(layout->offsets);
  r->placed_ = std::move(layout->placed);
  r->live_ = std::move(layout->live);
  r->arena_bytes_ = layout->arena_bytes;
  r->arena_ = r->backend_.alloc_arena(r->backend_.self, r->arena_bytes_, plan.alignment);
  if (r->arena_ == nullptr)
    return exhausted("backend '" + std::string(r->backend_.name) + "' could not allocate the " +
                         std::to_string(r->arena_bytes_) + "-byte arena",
                     "free memory, or plan a smaller batch");
  r->slot_base_.assign(plan.slots.size(), nullptr);
  r->tensor_data_.assign(plan.tensors.size(), nullptr);
  r->scalars_ = plan.scalars;
  std::size_t widest = 0;
  for (const Call& c : plan.calls) widest = std::max<std::size_t>(widest, c.in_count + c.out_count);
  r->call_args_.resize(widest);
  r->slot_tensors_.resize(plan.slots.size());
  r->slot_extent_.assign(plan.slots.size(), 0);
  for (std::uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorRef& tr = plan.tensors[t];
    r->slot_tensors_[tr.slot].push_back(t);
    // verify_plan checked that the tensor lies in its slot: offsets and strides are not negative
    std::int64_t last = tr.offset;
    bool empty = false;
    const auto sizes = plan.sizes(tr), strides = plan.strides(tr);
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 0) empty = true;
      else last += (sizes[d] - 1) * strides[d];
    }
    if (!empty)
      r->slot_extent_[tr.slot] = std::max<std::uint64_t>(
          r->slot_extent_[tr.slot], static_cast<std::uint64_t>(last + 1) * *element_size(tr.dtype));
  }
  return r;
}

Status Runner::run(const RunArgs& args) {
  const ExecutionPlan& p = plan_;
  if (args.inputs.size() != p.inputs.size() || args.outputs.size() != p.outputs.size())
    return invalid_input("run: " + std::to_string(args.inputs.size()) + " inputs and " +
                             std::to_string(args.outputs.size()) + " outputs bound, the plan has " +
                             std::to_string(p.inputs.size()) + " and " +
                             std::to_string(p.outputs.size()),
                         "bind one pointer per plan input and output");
  if (!args.patches.empty() && args.patches.size() != p.patches.size())
    return invalid_input("run: " + std::to_string(args.patches.size()) + " patch values for " +
                             std::to_string(p.patches.size()) + " patch points",
                         "give one value per patch point, or none to run the recorded values");
  outputs_may_move_ = args.outputs_may_move;
  at_call_ = args.at_call;
  observer_ = args.observer;
  auto* arena = static_cast<std::byte*>(arena_);
  for (std::size_t s = 0; s < p.slots.size(); ++s) {
    const Slot& sl = p.slots[s];
    void* base = nullptr;
    switch (sl.kind) {
      case SlotKind::Arena:
        if (!placed_[s]) {  // the backend never touches it (Note [Memory use])
          slot_base_[s] = nullptr;
          continue;
        }
        base = arena + offsets_[s];
        break;
      case SlotKind::Constant:
        base = arena + offsets_[s];
        break;
      case SlotKind::Input:
        base = args.inputs[sl.binding];
        break;
      case SlotKind::Output:
        base = args.outputs[sl.binding];
        break;
    }
    if (base == nullptr && sl.bytes != 0)  // an empty tensor's storage may have no memory
      return invalid_input("run: " + std::string(slot_kind_name(sl.kind)) + " binding " +
                               std::to_string(sl.binding) + " (storage " +
                               std::to_string(sl.storage) + ") is null",
                           "bind the memory of every input and output");
    slot_base_[s] = base;
  }
  for (std::size_t t = 0; t < p.tensors.size(); ++t) {
    const TensorRef& tr = p.tensors[t];
    const std::int64_t bytes =
        tr.offset * static_cast<std::int64_t>(*element_size(tr.dtype));  // verified
    tensor_data_[t] = slot_base_[tr.slot] == nullptr ? nullptr : static_cast<std::byte*>(slot_base_[tr.slot]) + bytes;
  }
  std::copy(p.scalars.begin(), p.scalars.end(), scalars_.begin());
  for (std::size_t s = 0; s < p.slots.size(); ++s)
    if (p.slots[s].kind == SlotKind::Constant &&
        !write_number(slot_base_[s], p.slots[s].dtype, p.slots[s].value))
      return invalid_input("run: the number " + std::to_string(p.slots[s].value) +
                               " does not fit dtype " + std::to_string(p.slots[s].dtype),
                           "the plan is corrupt: build it again");
  for (std::size_t i = 0; i < args.patches.size(); ++i) {
    const PatchPoint& pp = p.patches[i];
    if (pp.kind == PatchKind::Scalar) {
      scalars_[pp.index].bits = args.patches[i];
    } else if (const double v = std::bit_cast<double>(args.patches[i]);
               !write_number(slot_base_[pp.index], p.slots[pp.index].dtype, v)) {
      return invalid_input("run: patch '" + pp.name + "' gives " + std::to_string(v) +
                               ", which does not fit dtype " +
                               std::to_string(p.slots[pp.index].dtype),
                           "give a value of the number's type");
    }
  }
  for (std::uint32_t k = 0; k < p.kernels.size(); ++k) {
    const Kernel& kern = p.kernels[k];
    if (at_call_ != nullptr && kern.call_count > 0)
      if (Status st = at_call_(observer_, kern.call_begin, true); !st.ok())
        return Status(st.code(), "before kernel " + std::to_string(k) + ": " + message_of(st));
    KernelLaunch launch;
    launch.plan = &p;
    launch.kernel = k;
    launch.tensor_data = tensor_data_;
    launch.scalars = scalars_;
    launch.runner = this;
    launch.library_call = &Runner::library_call;
    if (Status st = backend_.run_kernel(backend_.self, launch); !st.ok())
      return Status(st.code(), "backend '" + std::string(backend_.name) + "', kernel " +
                                   std::to_string(k) + " (group " +
                                   std::to_string(p.kernels[k].group) + "): " + message_of(st));
    if (at_call_ != nullptr && kern.call_count > 0)
      (void)at_call_(observer_, kern.call_begin + kern.call_count - 1, false);
    if (!release_after_.empty())
      for (std::uint32_t c : release_after_[k]) provider_.release(provider_.self, c);
  }
  return backend_.synchronize(backend_.self);
}

Status Runner::library_call(void* self, std::uint32_t c) {
  auto* r = static_cast<Runner*>(self);
  TensorArg* args = r->call_args_.data();
  const ExecutionPlan& p = r->plan_;
  CRUCIBLE_PRE(c < p.calls.size(), "a call of the plan");
  const Call& call = p.calls[c];
  const std::uint32_t n = call.in_count + call.out_count;
  for (std::uint32_t i = 0; i < n; ++i) {
    const Arg& a = p.args[call.in_begin + i];
    const TensorRef& t = p.tensors[a.tensor];
    args[i] = TensorArg{r->tensor_data_[a.tensor],
                        t.dtype,
                        (t.flags & kWrappedNumber) != 0,
                        p.sizes(t),
                        p.strides(t),
                        a.arg_index,
                        a.list_index,
                        a.tensor};
  }
  LibraryCall lc;
  lc.plan = &p;
  lc.call = c;
  lc.op = p.op_names[call.op];
  lc.schema_hash = call.schema_hash;
  lc.kind = call.kind;
  lc.grad_mode = call.grad_mode;
  lc.inputs = std::span<const TensorArg>(args, call.in_count);
  lc.outputs = std::span<const TensorArg>(args + call.in_count, call.out_count);
  lc.scalars = std::span<const record::ScalarRecord>(r->scalars_)
                   .subspan(call.scalar_begin, call.scalar_count);
  lc.runner = r;
  lc.adoptable = &Runner::adoptable;
  lc.adopt = &Runner::adopt;
  lc.place = &Runner::place;
  r->current_call_ = c;
  if (r->at_call_ != nullptr) (void)r->at_call_(r->observer_, c, false);
  if (Status st = r->provider_.call(r->provider_.self, lc); !st.ok())
    return Status(st.code(), "call " + std::to_string(c) + " (" + std::string(lc.op) + ", node " +
                                 std::to_string(call.node) + "): " + message_of(st));
  return ok_status();
}

bool Runner::adoptable(void* self, std::uint32_t output) {
  auto* r = static_cast<Runner*>(self);
  const ExecutionPlan& p = r->plan_;
  const Call& call = p.calls[r->current_call_];
  if (output >= call.out_count) return false;
  const TensorRef& t = p.tensors[p.args[call.out_begin + output].tensor];
  const Slot& s = p.slots[t.slot];
  return (s.kind == SlotKind::Arena || (s.kind == SlotKind::Output && r->outputs_may_move_)) &&
         s.first == r->current_call_;
}

bool Runner::adopt(void* self, std::uint32_t output, void* data, std::uint64_t before,
                   std::uint64_t after) {
  auto* r = static_cast<Runner*>(self);
  if (!adoptable(self, output) || data == nullptr) return false;
  const ExecutionPlan& p = r->plan_;
  const Call& call = p.calls[r->current_call_];
  const TensorRef& out = p.tensors[p.args[call.out_begin + output].tensor];
  const std::uint32_t slot = out.slot;
  // The slot's byte 0 lies `off` bytes below the output's element 0; its tensors reach
  // slot_extent_ bytes from there.
  const auto off = static_cast<std::uint64_t>(out.offset) * static_cast<std::uint64_t>(*element_size(out.dtype));
  if (off > before || r->slot_extent_[slot] > off + after) return false;
  // An output's memory goes back to its caller, who finds its owner by where it starts.
  if (p.slots[slot].kind == SlotKind::Output && off != before) return false;
  r->point_slot(slot, static_cast<std::byte*>(data) - off);
  return true;
}

void Runner::point_slot(std::uint32_t slot, void* base) {
  slot_base_[slot] = base;
  for (std::uint32_t t : slot_tensors_[slot]) {
    const TensorRef& tr = plan_.tensors[t];
    tensor_data_[t] = static_cast<std::byte*>(base) + tr.offset * static_cast<std::int64_t>(*element_size(tr.dtype));
  }
}

void* Runner::place(void* self, std::uint32_t output) {
  auto* r = static_cast<Runner*>(self);
  const ExecutionPlan& p = r->plan_;
  const Call& call = p.calls[r->current_call_];
  if (output >= call.out_count) return nullptr;
  const std::uint32_t t = p.args[call.out_begin + output].tensor;
  const std::uint32_t slot = p.tensors[t].slot;
  if (r->slot_base_[slot] == nullptr) {
    if (!r->spill_[slot]) {
      const std::uint64_t a = std::max<std::uint64_t>(p.alignment, sizeof(void*));
      const std::uint64_t bytes = (std::max<std::uint64_t>(p.slots[slot].bytes, 1) + a - 1) / a * a;
      r->spill_[slot].reset(std::aligned_alloc(static_cast<std::size_t>(a), static_cast<std::size_t>(bytes)));
      if (!r->spill_[slot]) return nullptr;
    }
    r->point_slot(slot, r->spill_[slot].get());
  }
  return r->tensor_data_[t];
}

}  // namespace crucible::exec
