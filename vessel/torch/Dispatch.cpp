// Dispatch.cpp — the boxed recording fallback: capture, redispatch, commit.
#include "Dispatch.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "Capture.h"
#include "Unboxed.h"
#include "absl/container/flat_hash_map.h"
#include "crucible/core/ScalarType.h"
#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"

namespace crucible::vessel {
namespace detail {
constinit thread_local ThreadState* t_state_ptr = nullptr;

ThreadState& make_thread_state() {
  // Only ever called while t_state_ptr is null. The owner keeps no pointer of its own: its
  // destructor clears t_state_ptr before deleting, so an op recorded during or after that
  // (a thread-local destructor that runs torch ops) gets a fresh state, leaked, never a freed one.
  struct Owner {
    ~Owner() { delete std::exchange(t_state_ptr, nullptr); }
  };
  thread_local Owner owner;  // first pass registers its destructor for this thread's exit
  t_state_ptr = new ThreadState();
  return *t_state_ptr;
}
}  // namespace detail
namespace {
using namespace detail;

using record::MetaCell;
using record::OpBuilder;
using record::Phase;
using record::ScalarKind;
using record::TensorMeta;

// ---------------------------------------------------------------------------------------
struct SchemaInfo {
  std::uint64_t hash = 0;
  std::uint16_t n_args = 0;
  bool is_mutable = false;
  bool composite_implicit = false;  // has a CompositeImplicitAutograd kernel
  bool lifts_constant = false;      // aten::lift_fresh: its input is data from Python
  bool in_place = false;            // add_, silu_: the name ends in '_' (Note [Saved originals])
  bool is_clone = false;            // aten::clone (Note [Saved originals])
  // Own: crucible::* (the compile and sync calls that carry tensors): never recorded.
  enum class Kind : std::uint8_t { Normal, ProfilerEnter, ProfilerExit, Own } kind = Kind::Normal;
};

const SchemaInfo& schema_info(const c10::OperatorHandle& op) {
  // Keyed by the schema's address (stable for the operator's life; the handle is not).
  thread_local std::unordered_map<const c10::FunctionSchema*, SchemaInfo> cache;
  const c10::FunctionSchema& schema = op.schema();
  auto it = cache.find(&schema);
  if (it != cache.end()) return it->second;
  SchemaInfo si;
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  si.hash = record::Recorder::global().intern_schema(name);
  si.n_args = static_cast<std::uint16_t>(schema.arguments().size());
  si.is_mutable = schema.is_mutable();
  si.composite_implicit = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  si.lifts_constant = schema.name() == "aten::lift_fresh";
  si.in_place = in_place_name(schema.name());
  si.is_clone = schema.name() == "aten::clone";
  if (schema.name().rfind("profiler::_record_function_enter", 0) == 0) si.kind = SchemaInfo::Kind::ProfilerEnter;
  else if (schema.name().rfind("profiler::_record_function_exit", 0) == 0) si.kind = SchemaInfo::Kind::ProfilerExit;
  else if (schema.name().rfind("crucible::", 0) == 0) si.kind = SchemaInfo::Kind::Own;
  return cache.emplace(&schema, si).first->second;
}

}  // namespace
namespace detail {
DeviceKind device_kind_lookup(c10::DeviceType t) {
  switch (t) {
    case c10::DeviceType::CPU: return DeviceKind::CPU;
    case c10::DeviceType::CUDA: return DeviceKind::CUDA;
    case c10::DeviceType::MKLDNN: return DeviceKind::MKLDNN;
    case c10::DeviceType::OPENGL: return DeviceKind::OpenGL;
    case c10::DeviceType::OPENCL: return DeviceKind::OpenCL;
    case c10::DeviceType::IDEEP: return DeviceKind::IDEEP;
    case c10::DeviceType::HIP: return DeviceKind::HIP;
    case c10::DeviceType::FPGA: return DeviceKind::FPGA;
    case static_cast<c10::DeviceType>(8): return DeviceKind::ORT;  // ORT, named MAIA from 2.1
    case c10::DeviceType::XLA: return DeviceKind::XLA;
    case c10::DeviceType::Vulkan: return DeviceKind::Vulkan;
    case c10::DeviceType::Metal: return DeviceKind::Metal;
    case c10::DeviceType::XPU: return DeviceKind::XPU;
    case c10::DeviceType::MPS: return DeviceKind::MPS;
    case c10::DeviceType::Meta: return DeviceKind::Meta;
    case c10::DeviceType::HPU: return DeviceKind::HPU;
    case c10::DeviceType::VE: return DeviceKind::VE;
    case c10::DeviceType::Lazy: return DeviceKind::Lazy;
    case c10::DeviceType::IPU: return DeviceKind::IPU;
    case c10::DeviceType::PrivateUse1: return DeviceKind::PrivateUse1;
    default: break;
  }
  // Device types newer than this build's headers (MTIA in 2.x): match by name.
  const std::string n = c10::DeviceTypeName(t, /*lower_case=*/true);
  for (int k = 0; k < kNumDeviceKinds; ++k)
    if (device_kind_name(static_cast<DeviceKind>(k)) == n) return static_cast<DeviceKind>(k);
  return DeviceKind::Unknown;
}
}  // namespace detail
namespace {

// What the fallback saw and did not record, all threads (relaxed: counters only).
std::atomic<std::uint64_t> g_skip_internal{0}, g_skip_decomposed{0}, g_skip_profiler{0};

}  // namespace
namespace detail {
namespace {
// The bodies of current_phase, the op flags and enter_op, inlined into enter_recorded, which every
// unboxed kernel calls once per op: one function's code lines instead of four (Note [Cold code
// out of the kernels], Unboxed.cpp).
[[gnu::always_inline]] inline Phase phase_now(ThreadState& ts) {
  if (ts.optimizer_depth > 0) return Phase::Optimizer;
  // The engine sets the current graph task on every thread while it runs backward nodes.
  if (torch::autograd::get_current_graph_task_exec_info() != nullptr) return Phase::Backward;
  return Phase::Forward;
}
}  // namespace

Phase current_phase(ThreadState& ts) { return phase_now(ts); }

}  // namespace detail
namespace {
double wrapped_value(const at::Tensor& t) {
  // A wrapped number is a 0-d CPU tensor; read it without dispatching (item() would recurse).
  const void* p = t.unsafeGetTensorImpl()->data();
  if (p == nullptr) return 0;
  switch (t.scalar_type()) {
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kFloat: return *static_cast<const float*>(p);
    case at::kLong: return static_cast<double>(*static_cast<const std::int64_t*>(p));
    case at::kInt: return *static_cast<const std::int32_t*>(p);
    case at::kBool: return *static_cast<const bool*>(p) ? 1.0 : 0.0;
    case at::kComplexDouble: return static_cast<const c10::complex<double>*>(p)->real();
    default: return 0;
  }
}

}  // namespace
namespace detail {
namespace {
// The stream current on an accelerator tensor's device (TraceEntry::stream). Devices without a
// guard implementation (meta) or without streams keep 0.
[[gnu::noinline, gnu::cold]] void note_stream(OpBuilder& b, c10::Device device) {
  if (device.type() == c10::DeviceType::Meta || !c10::impl::hasDeviceGuardImpl(device.type())) return;
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Device on = device.has_index() ? device : impl->getDevice();
  b.set_stream(static_cast<std::uint64_t>(impl->getStream(on).id()));
}

[[gnu::noinline, gnu::cold]] void set_dims_without_strides(OpBuilder& b, c10::IntArrayRef sizes) {
  std::vector<std::int64_t> zeros(sizes.size(), 0);  // non-strided layouts have no strides
  b.set_dims(sizes, zeros);
}
}  // namespace

void add_tensor(ThreadState& ts, OpBuilder& b, const at::Tensor& t, std::uint16_t arg,
                std::uint32_t list_index, bool output) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Device device = t.device();
  const c10::Layout layout = t.layout();
  const c10::IntArrayRef sizes = t.sizes();
  // Written where it lives in the builder, field by field (OpBuilder::begin_tensor).
  TensorMeta& m = b.begin_tensor(static_cast<std::uint16_t>(sizes.size()));
  m.arg_index = arg;
  m.list_index = list_index;
  m.dtype = static_cast<std::int8_t>(t.scalar_type());
  m.device_kind = static_cast<std::uint8_t>(device_kind_of(device.type()));
  m.device_index = device.index();
  if (device.type() != c10::DeviceType::CPU && !b.has_stream()) [[unlikely]]
    note_stream(b, device);
  m.layout = static_cast<std::uint8_t>(layout_from_ordinal(static_cast<std::int8_t>(layout)));
  std::uint8_t f = output ? record::tensor_flag::kOutput : 0;
  // Without autograd metadata a tensor neither requires grad nor is a (differentiable) view:
  // most backward and optimizer tensors. With it, what t.is_view() and t.requires_grad()
  // return is read where it lives: those are calls into two other libraries (is_view through
  // the variable hooks' vtable) whose code lines miss the instruction cache on every op.
  // AutogradMeta is the one implementation of the interface. A view's metadata is a
  // DifferentiableViewMeta: is_view() is true when it has backward view info (a view made for
  // forward AD only is not one), and its requires_grad() also asks its base (the virtual call).
  if (const auto* am = static_cast<const torch::autograd::AutogradMeta*>(impl->autograd_meta())) {
    if (am->is_view_) {
      if (static_cast<const torch::autograd::DifferentiableViewMeta*>(am)->has_bw_view())
        f |= record::tensor_flag::kIsView;
      if (am->requires_grad()) f |= record::tensor_flag::kRequiresGrad;
    } else if (am->AutogradMeta::requires_grad()) {  // requires_grad_ || grad_fn_, inline
      f |= record::tensor_flag::kRequiresGrad;
    }
  }
  if (impl->is_wrapped_number()) [[unlikely]] {
    f |= record::tensor_flag::kWrappedNumber;
    m.wrapped_value = wrapped_value(t);
  }
  if (t.is_inference()) f |= record::tensor_flag::kInference;
  else m.version = impl->version_counter().current_version();  // inline, unlike Tensor::_version()
  const bool strided = layout == at::kStrided;
  // unsafe_storage(): no virtual has_storage() call, and no throw for wrapper tensors (Python
  // subclasses, FakeTensor) whose storage() refuses access: their placeholder storage is named
  // like any other, so a wrapper keeps one identity. Its data pointer may refuse access too
  // (PyTorch 2.x): it is only recorded for debugging, so it is then 0.
  const c10::Storage& s = impl->unsafe_storage();
  if (strided && s.unsafeGetStorageImpl() != nullptr) {
    m.storage_id = ts.storage_ids.id(s);
    m.storage_offset = t.storage_offset();
    m.storage_nbytes = s.nbytes();
    const char* base = nullptr;
    try {
      base = static_cast<const char*>(s.data());
    } catch (const c10::Error&) {
    }
    m.data_ptr = base == nullptr ? 0
                                 : reinterpret_cast<std::uint64_t>(base) +
                                       static_cast<std::uint64_t>(m.storage_offset) * t.element_size();
  } else {
    f |= record::tensor_flag::kNoStorage;
  }
  m.flags = f;
  if (strided) [[likely]]
    b.set_dims(sizes, t.strides());
  else
    set_dims_without_strides(b, sizes);
}

namespace {
[[gnu::always_inline]] inline std::uint8_t flags_now(const ThreadState& ts, bool is_mutable) {
  std::uint8_t flags = is_mutable ? record::op_flag::kMutable : 0;
  // GradMode::is_enabled() and InferenceMode::is_enabled() read this same thread-local state
  // (reached once per thread: Note [Thread-locals reached once], Capture.h).
  const c10::AutogradState& autograd = *ts.autograd_tls;
  if (autograd.get_grad_mode()) flags |= record::op_flag::kGradMode;
  if (autograd.get_inference_mode()) flags |= record::op_flag::kInferenceMode;
  return flags;
}
}  // namespace


namespace {
// A frame for a new nesting depth: once per depth per thread, out of line (Frame's construction
// would otherwise be inlined into enter_op, which every recorded op runs).
[[gnu::noinline, gnu::cold]] void add_frame(ThreadState& ts) {
  ts.frames.push_back(std::make_unique<Frame>());
}
}  // namespace

Frame* enter_op(ThreadState& ts, bool composite_implicit) {
  return enter_op(ts, composite_implicit,
                  c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::ADInplaceOrView));
}

namespace {
[[gnu::always_inline]] inline Frame* enter_now(ThreadState& ts, bool composite_implicit,
                                               bool below_autograd, bool is_clone) {
  if (ts.depth == 0) {
    ts.outer_below_autograd = below_autograd;
  } else {
    Frame& parent = *ts.frames[ts.depth - 1];
    // Called from inside a kernel below Autograd (ADInplaceOrView newly excluded): internals.
    if (below_autograd && !ts.outer_below_autograd) return nullptr;
    // Above Autograd, under a composite: part of its decomposition, recorded instead of it.
    // Under any other parent (an in-place op that kept the key on): a clone is the copy of its
    // input autograd saves, recorded beside it; anything else is the parent's own work (Note
    // [Saved originals], Capture.h).
    if (parent.composite_implicit) parent.had_child = true;
    else if (!is_clone) return nullptr;
  }
  if (ts.frames.size() <= static_cast<std::size_t>(ts.depth)) [[unlikely]]
    add_frame(ts);
  Frame& f = *ts.frames[ts.depth];
  f.b.reset();
  f.had_child = false;
  f.composite_implicit = composite_implicit;
  return &f;
}
}  // namespace

Frame* enter_op(ThreadState& ts, bool composite_implicit, bool below_autograd, bool is_clone) {
  return enter_now(ts, composite_implicit, below_autograd, is_clone);
}

Frame* enter_recorded(ThreadState& ts, bool is_mutable, bool below_autograd, bool is_clone) {
  Frame* f = enter_now(ts, /*composite_implicit=*/false, below_autograd, is_clone);
  if (f == nullptr) return nullptr;
  f->phase = phase_now(ts);
  f->flags = flags_now(ts, is_mutable);
  return f;
}

void capture_op(ThreadState& ts, const c10::OperatorHandle& op, std::vector<c10::IValue> args,
                std::vector<c10::IValue> rets, Phase phase) {
  if (ts.capture->sync != nullptr) {  // sync-point execution: matched against the plan, not kept
    sync_match(*ts.capture->sync, op, args, rets, phase);
    return;
  }
  std::vector<std::vector<std::int64_t>> sizes;
  for (const c10::IValue& r : rets) {
    if (r.isTensor()) {
      sizes.push_back(r.toTensor().defined() ? r.toTensor().sizes().vec() : std::vector<std::int64_t>{});
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorList()) sizes.push_back(t.defined() ? t.sizes().vec() : std::vector<std::int64_t>{});
    }
  }
  ts.capture->ops.push_back(
      CapturedOp{op, std::move(args), std::move(rets), c10::GradMode::is_enabled(), phase, std::move(sizes)});
}

// Note [Lifted constants]: torch.tensor(data) makes its tensor with aten::empty, copies the
// data in from Python below the dispatcher, then calls aten::lift_fresh. A replay of empty and
// lift_fresh would leave the tensor uninitialised (torch's foreach RMSprop counts its steps
// with such a tensor). The capture keeps a copy of the value as lifted and records
// copy_(tensor, copy) in place of lift_fresh, so a plan writes the value where the step had
// it; the copy is an external that two recorded calls must agree on by value.
void capture_lifted(ThreadState& ts, const at::Tensor& t, Phase phase) {
  at::Tensor value;
  {
    c10::impl::ExcludeDispatchKeyGuard no_rec(kKey);
    at::AutoDispatchBelowADInplaceOrView below;
    value = t.clone(at::MemoryFormat::Preserve);
  }
  ts.capture->lifted.push_back(value);
  static const c10::OperatorHandle copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  std::vector<c10::IValue> args{c10::IValue(t), c10::IValue(value), c10::IValue(false)};
  capture_op(ts, copy, std::move(args), std::vector<c10::IValue>{c10::IValue(t)}, phase);
}

void commit_op(ThreadState& ts, Frame& f, std::uint64_t schema_hash, std::uint16_t n_args,
               Phase phase, std::uint8_t flags) {
  if (ts.capture != nullptr && ts.capture->capture_only) return;  // crucible.compile's own capture
  if (ts.log == nullptr) [[unlikely]] {
    ts.rec = &record::Recorder::global();  // never replaced: the thread's log stays its own
    ts.log = &ts.rec->thread_log();
  }
  record::Recorder& rec = *ts.rec;
  record::TraceEntry e = f.b.entry(schema_hash, phase, flags);
  e.module_id = ts.modules.back();
  e.n_args = n_args;
  rec.commit(*ts.log, e, f.b.cells(), f.b.scalars());
}

}  // namespace detail
namespace {
void add_ivalue(ThreadState& ts, OpBuilder& b, const c10::IValue& v, std::uint16_t arg, bool output) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined()) add_tensor(ts, b, t, arg, 0, output);
    else b.add_scalar(ScalarKind::None, arg, 0);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    b.add_scalar(ScalarKind::TensorList, arg, 0, static_cast<std::uint32_t>(list.size()));
    for (std::size_t k = 0; k < list.size(); ++k) {
      const at::Tensor t = list.get(k);
      if (t.defined()) add_tensor(ts, b, t, arg, static_cast<std::uint32_t>(k), output);
      else b.add_scalar(ScalarKind::None, arg, 0, static_cast<std::uint32_t>(k));
    }
  } else if (v.isNone()) {
    b.add_scalar(ScalarKind::None, arg, 0);
  } else if (v.isInt()) {
    b.add_int(arg, v.toInt());
  } else if (v.isDouble()) {
    b.add_double(arg, v.toDouble());
  } else if (v.isBool()) {
    b.add_scalar(ScalarKind::Bool, arg, v.toBool() ? 1 : 0);
  } else if (v.isComplexDouble()) {
    const c10::complex<double> c = v.toComplexDouble();
    double re = c.real(), im = c.imag();
    std::uint64_t br, bi;
    std::memcpy(&br, &re, 8);
    std::memcpy(&bi, &im, 8);
    b.add_scalar(ScalarKind::ComplexReal, arg, br);
    b.add_scalar(ScalarKind::ComplexImag, arg, bi);
  } else if (v.isSymInt()) {
    b.add_int(arg, v.toSymInt().expect_int());
  } else if (v.isString()) {
    b.add_string(arg, v.toStringRef());
  } else if (v.isDevice()) {
    const c10::Device d = v.toDevice();
    b.add_scalar(ScalarKind::Device, arg,
                 (std::uint64_t{static_cast<std::uint8_t>(device_kind_of(d.type()))} << 8) |
                     static_cast<std::uint8_t>(d.index()));
  } else if (v.isList()) {  // int[], float[], bool[], Tensor?[] ...: no cap on length
    const auto& elems = v.toListRef();
    b.add_scalar(ScalarKind::ListBegin, arg, 0, static_cast<std::uint32_t>(elems.size()));
    for (std::size_t k = 0; k < elems.size(); ++k) {
      const c10::IValue& e = elems[k];
      // A tensor element goes to the meta log (list_index k); anything else is a record here.
      if (e.isTensor() && e.toTensor().defined()) add_tensor(ts, b, e.toTensor(), arg, static_cast<std::uint32_t>(k), output);
      else if (e.isNone() || (e.isTensor() && !e.toTensor().defined())) b.add_scalar(ScalarKind::None, arg, 0, static_cast<std::uint32_t>(k));
      else add_ivalue(ts, b, e, arg, output);
    }
  } else {  // generators, custom classes, SymInts of newer versions, ...: named by tag
    b.add_scalar(ScalarKind::Other, arg, hash64(v.tagKind()));
  }
}

void passthrough_excluding_key(const c10::OperatorHandle& op, c10::DispatchKeySet after,
                               torch::jit::Stack* stack) {
  KeyExcluded guard;
  op.redispatchBoxed(after, stack);
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  ThreadState& ts = thread_state();
  const c10::DispatchKeySet after = after_key(ks);
  const SchemaInfo& si = schema_info(op);

  if (si.kind == SchemaInfo::Kind::Own) {
    passthrough_excluding_key(op, after, stack);
    return;
  }
  if (si.kind != SchemaInfo::Kind::Normal) {  // profiler markers: phase bookkeeping only
    g_skip_profiler.fetch_add(1, std::memory_order_relaxed);
    if (si.kind == SchemaInfo::Kind::ProfilerEnter) {
      const auto& args = torch::jit::last(*stack, si.n_args);
      const bool is_opt = !args.empty() && args[0].isString() &&
                          args[0].toStringRef().rfind("Optimizer.", 0) == 0;
      ts.rf_is_optimizer.push_back(is_opt);
      ts.optimizer_depth += is_opt;
    } else if (!ts.rf_is_optimizer.empty()) {
      ts.optimizer_depth -= ts.rf_is_optimizer.back();
      ts.rf_is_optimizer.pop_back();
    }
    passthrough_excluding_key(op, after, stack);
    return;
  }

  const bool below_autograd =
      c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::ADInplaceOrView);
  Frame* fp = enter_op(ts, si.composite_implicit, below_autograd, si.is_clone);
  if (fp == nullptr) {
    g_skip_internal.fetch_add(1, std::memory_order_relaxed);
    passthrough_excluding_key(op, after, stack);
    return;
  }
  Frame& f = *fp;
  const Phase phase = current_phase(ts);
  const std::uint8_t flags = flags_now(ts, si.is_mutable);
  // A capture for crucible.compile alone commits nothing to the rings: no cells to build.
  const bool cells = ts.capture == nullptr || !ts.capture->capture_only;
  {
    const auto args = torch::jit::last(*stack, si.n_args);
    if (cells)
      for (std::size_t i = 0; i < args.size(); ++i) add_ivalue(ts, f.b, args[i], static_cast<std::uint16_t>(i), false);
    if (ts.capture != nullptr) f.cap_args.assign(args.begin(), args.end());
  }
  f.b.end_inputs();

  // A parent without a CompositeImplicitAutograd kernel has no decomposition to record: all
  // its nested calls are kernel internals, so run it with the key excluded and they never
  // come back here (saves a boxed round trip, ~0.3 us, per internal call). Except an in-place
  // op under autograd: the copy of its input that autograd saves is recorded (Note [Saved
  // originals], Capture.h).
  ++ts.depth;
  try {
    if (si.composite_implicit ||
        (si.in_place && keeps_key_for_saved_originals(ts, below_autograd))) {
      op.redispatchBoxed(after, stack);
    } else {
      KeyExcluded guard;
      op.redispatchBoxed(after, stack);
    }
  } catch (...) {
    --ts.depth;
    throw;
  }
  --ts.depth;
  Frame& done = *ts.frames[ts.depth];  // the same frame (frames never move)
  if (done.had_child) {
    done.cap_args.clear();  // a decomposed op is not captured: drop its arguments now
    g_skip_decomposed.fetch_add(1, std::memory_order_relaxed);  // recorded as its decomposition
    return;
  }
  const std::size_t n_ret = op.schema().returns().size();
  const auto rets = torch::jit::last(*stack, n_ret);
  if (cells)
    for (std::size_t i = 0; i < rets.size(); ++i) add_ivalue(ts, done.b, rets[i], static_cast<std::uint16_t>(i), true);

  if (cells && si.lifts_constant && done.b.n_inputs() != 0) {
    // torch.tensor(data) builds its tensor below the dispatcher, then lifts it: a constant.
    record::Recorder::global().classify_external(done.b.cells()[0].meta.storage_id,
                                                 record::ExternalKind::Constant);
  }
  if (ts.capture != nullptr) {
    if (si.lifts_constant && !rets.empty() && rets[0].isTensor() && rets[0].toTensor().defined()) [[unlikely]]
      capture_lifted(ts, rets[0].toTensor(), phase);
    else
      capture_op(ts, op, std::move(done.cap_args), std::vector<c10::IValue>(rets.begin(), rets.end()), phase);
  }
  commit_op(ts, done, si.hash, si.n_args, phase, flags);
}

// Note [Key floor]: what the recording key costs a step before anything is recorded. In a
// process that calls install_key_floor() instead of install(), the key's fallback and the hot
// ops' kernels only exclude the key and redispatch, as the recording ones do around their
// work, and the composites fall through as they do when recording; set_enabled() still puts
// the key on the thread and tags allocations. bench/python/vessel_overhead.py runs the MLP step
// so in a child process: the recorded step's overhead less this floor is what recording
// itself adds.
void floor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  passthrough_excluding_key(op, after_key(ks), stack);
}

std::mutex g_install_mu;
std::unique_ptr<torch::Library> g_library;
std::unique_ptr<torch::Library> g_ops;  // the composite fallthroughs and the typed kernels
bool g_unboxed = false;
bool g_floor = false;  // installed by install_key_floor: nothing is recorded

// CRUCIBLE_VESSEL_ABLATE (Note [Ablation build], Capture.h): a rung's name in an ablation build;
// refused in any other build, where it would change nothing.
#if defined(CRUCIBLE_VESSEL_ABLATION) && CRUCIBLE_VESSEL_ABLATION
}  // namespace
namespace detail {
Ablation g_ablation = Ablation::None;
}  // namespace detail
namespace {
#endif
Status read_ablation() {
  const char* v = std::getenv("CRUCIBLE_VESSEL_ABLATE");
  if (v == nullptr || *v == 0) return ok_status();
#if defined(CRUCIBLE_VESSEL_ABLATION) && CRUCIBLE_VESSEL_ABLATION
  std::string names;
  for (const auto& [name, rung] : detail::kAblationRungs) {
    if (std::strcmp(v, name) == 0) {
      detail::g_ablation = rung;
      return ok_status();
    }
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return bad_state(std::string("CRUCIBLE_VESSEL_ABLATE=") + v + " is not a rung",
                   "use one of " + names + " (Note [Ablation build])");
#else
  return bad_state(std::string("CRUCIBLE_VESSEL_ABLATE=") + v + " is set, but this build has no ablation switches",
                   "unset it, or configure a build with -DCRUCIBLE_VESSEL_ABLATION=ON "
                   "(bench/vessel_ablation.sh does) and point CRUCIBLE_BUILD_DIR at it");
#endif
}

Status register_on_key(bool unboxed_kernels, bool floor) {
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    if (floor) lib->fallback(torch::CppFunction::makeFromBoxedFunction<&floor_fallback>());
    else lib->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    auto ops =
        std::make_unique<torch::Library>(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
    detail::register_composite_fallthroughs(*ops);
    if (floor) detail::register_passthrough(*ops);
    else if (unboxed_kernels) detail::register_unboxed(*ops);
    g_ops = std::move(ops);
    g_unboxed = unboxed_kernels && !floor;
    g_floor = floor;
    g_library = std::move(lib);
  } catch (const c10::Error& e) {
    return bad_state(std::string("cannot register Crucible's fallback on DispatchKey::") + kKeyName +
                         ": another library already holds that key (" +
                         e.what_without_backtrace() + ")",
                     "unload the library that registered it (only one recorder can own the key), "
                     "or build PyTorch with patches/ so Crucible gets its own DispatchKey::Crucible");
  }
  return ok_status();
}

}  // namespace

Status install(bool unboxed_kernels) {
  std::lock_guard<std::mutex> g(g_install_mu);
  if (!g_library) {
    Status a = read_ablation();
    if (!a.ok()) return a;
  }
  if (g_floor)
    return bad_state("this process installed the key-floor kernels (install_key_floor, a benchmark's), "
                     "which record nothing",
                     "record in another process: the key's kernels are installed once per process");
  if (g_library) return ok_status();
  return register_on_key(unboxed_kernels, /*floor=*/false);
}

bool has_ablation_switches() { return detail::kHasAblationSwitches; }

const char* ablation_name() {
  for (const auto& [name, rung] : detail::kAblationRungs)
    if (rung == detail::g_ablation) return name;
  return "full";  // not reached: every rung has a name
}

Status install_key_floor() {
  std::lock_guard<std::mutex> g(g_install_mu);
  if (g_floor) return ok_status();
  if (g_library)
    return bad_state("the recording kernels are installed in this process already",
                     "measure the key floor in a process that has not recorded (the key's kernels are "
                     "installed once per process)");
  return register_on_key(false, /*floor=*/true);
}

std::size_t unboxed_kernel_count() {
  std::lock_guard<std::mutex> g(g_install_mu);
  return g_library && g_unboxed ? detail::unboxed_op_count() : 0;
}

std::size_t composite_fallthrough_count() {
  std::lock_guard<std::mutex> g(g_install_mu);
  return g_library ? detail::composite_fallthrough_count() : 0;
}

bool installed() {
  std::lock_guard<std::mutex> g(g_install_mu);
  return g_library != nullptr;
}

bool key_floor_installed() {
  std::lock_guard<std::mutex> g(g_install_mu);
  return g_floor;
}

const char* dispatch_key_name() { return kKeyName; }

// Note [Forked children]
// A DataLoader worker is a fork() of the training process, often made while that process
// records. The child has one thread, the forking one: none of the recorder's drain or the
// pipeline's stage threads, and locks other threads held may stay held for good. A child that
// went on recording would fill its rings and then wait for ever for a drain that is not there
// (and a flush() would never return). So in the child the forking thread stops recording (its
// fork handler, AllocationTags.cpp; what the child's ops do is no part of the parent's step),
// and every Crucible call there that needs the recorder or the pipeline refuses with
// forked_child_error() instead of waiting. The parent's recording is untouched.
namespace {
std::atomic<bool> g_forked_child{false};
}  // namespace
bool forked_child() { return g_forked_child.load(std::memory_order_relaxed); }
void watch_forks() {
  static const bool once = [] {
    pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true, std::memory_order_relaxed); });
    return true;
  }();
  (void)once;
}
std::string forked_child_error(const std::string& what) {
  return "crucible: " + what + " in a forked process: this process is a fork of the one that loaded Crucible (a DataLoader worker, say); "
         "the recorder's and the pipeline's threads do not survive fork(), so nothing is recorded here: record, "
         "flush and read the recording in the parent process";
}
namespace detail {
void stop_recording_in_forked_child() {
  c10::impl::tls_set_dispatch_key_included(kKey, false);
  if (ThreadState* ts = t_state_ptr) ts->counts_as_recording = false;  // the count is reset with it
}
}  // namespace detail

void set_enabled(bool on) {
  if (on && forked_child()) throw std::runtime_error(forked_child_error("enable()"));
  if (!on) {  // a thread that never recorded has nothing to release (and needs no state)
    c10::impl::tls_set_dispatch_key_included(kKey, false);
    ThreadState* ts = t_state_ptr;
    if (ts != nullptr && ts->counts_as_recording) {
      ts->counts_as_recording = false;
      detail::tagging_release();
    }
    return;
  }
  // Everything that may throw first: a failed enable leaves the thread not recording.
  ThreadState& ts = thread_state();
  if (!ts.counts_as_recording) {
    detail::tagging_acquire();
    ts.counts_as_recording = true;
  }
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}
bool is_enabled() { return c10::impl::tls_is_dispatch_key_included(kKey); }

std::size_t push_module_id(std::uint32_t module_id) {
  std::vector<std::uint32_t>& m = thread_state().modules;
  const std::size_t depth = m.size();
  m.push_back(module_id);
  return depth;
}
void pop_modules_to(std::size_t depth) {
  std::vector<std::uint32_t>& m = thread_state().modules;
  if (depth >= 1 && depth < m.size()) m.resize(depth);
}
void pop_modules_to_if(std::size_t depth, std::uint32_t module_id) {
  std::vector<std::uint32_t>& m = thread_state().modules;
  if (depth >= 1 && depth < m.size() && m[depth] == module_id) m.resize(depth);
}

std::uint64_t storage_id(const c10::Storage& s) { return thread_state().storage_ids.id(s); }

bool storage_is_tagged(const c10::Storage& s) {
  const c10::StorageImpl* p = s.unsafeGetStorageImpl();
  if (p == nullptr || p->device_type() != c10::DeviceType::CPU) return false;
  try {
    return detail::tag_of(p->data_ptr()) != 0;
  } catch (const c10::Error&) {  // PyTorch 2.x may refuse access to the DataPtr
    return false;
  }
}
std::uint64_t tagged_raw_frees() { return detail::tagged_raw_frees(); }

std::string storage_id_scheme() {
  std::string why = detail::tagging_unavailable();
  return why.empty() ? "allocation tags" : why;
}

SkipCounters skip_counters() {
  return SkipCounters{g_skip_internal.load(std::memory_order_relaxed),
                      g_skip_decomposed.load(std::memory_order_relaxed),
                      g_skip_profiler.load(std::memory_order_relaxed)};
}

}  // namespace crucible::vessel
