// Unboxed.cpp — unboxed recording kernels for the hot ops, and fallthroughs on the key for the
// composite ops of the same models (Note [Composite fallthroughs], below).
//
// The boxed fallback costs a boxing round trip per op (a Stack of IValues built and torn down,
// ~0.3-0.5 us). For the ops that dominate training steps this file registers a typed kernel on
// the same key instead: Rec<Op>::call receives the op's real C++ arguments, records them with
// the same records the boxed path would write (a test compares the two byte for byte), and
// redispatches through at::_ops::<op>::redispatch. Every hot op here has a real backend kernel
// (none is CompositeImplicitAutograd), so it runs with the key excluded: its nested calls are
// kernel internals and never re-enter.
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/cross_entropy_loss_ops.h>
#include <ATen/ops/linear_ops.h>
#include <ATen/ops/log_softmax_ops.h>
#include <ATen/ops/nll_loss_nd_ops.h>
#include <ATen/ops/nll_loss_ops.h>
#include <ATen/ops/conv2d_ops.h>
#include <ATen/ops/batch_norm_ops.h>
#include <ATen/ops/layer_norm_ops.h>
#include <ATen/ops/dropout_ops.h>
#include <ATen/ops/matmul_ops.h>
#include <ATen/ops/softmax_ops.h>
#include <ATen/ops/flatten_ops.h>
#include <ATen/ops/zeros_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/detach_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/ones_like_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/t_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/to_ops.h>
#include <ATen/ops/view_ops.h>
#include <ATen/ops/zero_ops.h>

#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#include "Capture.h"
#include "Unboxed.h"
#include "crucible/core/ContentHash.h"

namespace crucible::vessel::detail {
namespace {

using record::ScalarKind;

// ---- argument capture: one overload per C++ argument type, mirroring add_ivalue ----------
struct Cap {
  ThreadState& ts;
  OpBuilder& b;
  bool output;
};

[[gnu::noinline]] void cap(Cap& c, const at::Tensor& t, std::uint16_t i) {
  if (t.defined()) add_tensor(c.ts, c.b, t, i, 0, c.output);
  else c.b.add_scalar(ScalarKind::None, i, 0);
}
[[gnu::noinline]] void cap(Cap& c, const c10::optional<at::Tensor>& t, std::uint16_t i) {
  if (t.has_value() && t->defined()) add_tensor(c.ts, c.b, *t, i, 0, c.output);
  else c.b.add_scalar(ScalarKind::None, i, 0);
}
// The TensorList and SymInt overloads: for hot ops whose schemas have them in other PyTorch
// versions (none of 1.13's do).
[[gnu::noinline, maybe_unused]] void cap(Cap& c, at::TensorList l, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::TensorList, i, 0, static_cast<std::uint32_t>(l.size()));
  for (std::size_t k = 0; k < l.size(); ++k) {
    if (l[k].defined()) add_tensor(c.ts, c.b, l[k], i, static_cast<std::uint32_t>(k), c.output);
    else c.b.add_scalar(ScalarKind::None, i, 0, static_cast<std::uint32_t>(k));
  }
}
[[gnu::noinline]] void cap(Cap& c, std::int64_t v, std::uint16_t i) { c.b.add_int(i, v); }
[[gnu::noinline]] void cap(Cap& c, double v, std::uint16_t i) { c.b.add_double(i, v); }
[[gnu::noinline]] void cap(Cap& c, bool v, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::Bool, i, v ? 1 : 0);
}
[[gnu::noinline]] void cap(Cap& c, const at::Scalar& s, std::uint16_t i) {
  if (s.isBoolean()) {
    cap(c, s.toBool(), i);
  } else if (s.isIntegral(false)) {
    cap(c, s.toLong(), i);
  } else if (s.isComplex()) {
    const c10::complex<double> z = s.toComplexDouble();
    double re = z.real(), im = z.imag();
    std::uint64_t br, bi;
    std::memcpy(&br, &re, 8);
    std::memcpy(&bi, &im, 8);
    c.b.add_scalar(ScalarKind::ComplexReal, i, br);
    c.b.add_scalar(ScalarKind::ComplexImag, i, bi);
  } else {
    cap(c, s.toDouble(), i);
  }
}
[[gnu::noinline]] void cap(Cap& c, at::ScalarType v, std::uint16_t i) {
  c.b.add_int(i, static_cast<std::int64_t>(v));
}
[[gnu::noinline]] void cap(Cap& c, at::Layout v, std::uint16_t i) {
  c.b.add_int(i, static_cast<std::int64_t>(v));
}
[[gnu::noinline]] void cap(Cap& c, at::MemoryFormat v, std::uint16_t i) {
  c.b.add_int(i, static_cast<std::int64_t>(v));
}
[[gnu::noinline]] void cap(Cap& c, at::Device d, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::Device, i,
                 (std::uint64_t{static_cast<std::uint8_t>(device_kind_of(d.type()))} << 8) |
                     static_cast<std::uint8_t>(d.index()));
}
[[gnu::noinline]] void cap(Cap& c, at::IntArrayRef v, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::ListBegin, i, 0, static_cast<std::uint32_t>(v.size()));
  for (std::int64_t x : v) c.b.add_int(i, x);
}
[[gnu::noinline]] void cap(Cap& c, c10::SymIntArrayRef v, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::ListBegin, i, 0, static_cast<std::uint32_t>(v.size()));
  for (const c10::SymInt& x : v) c.b.add_int(i, x.expect_int());
}
[[gnu::noinline, maybe_unused]] void cap(Cap& c, const c10::SymInt& v, std::uint16_t i) {
  c.b.add_int(i, v.expect_int());
}
template <class T>
void cap(Cap& c, c10::OptionalArrayRef<T> v, std::uint16_t i) {
  if (v.has_value()) cap(c, *v, i);
  else c.b.add_scalar(ScalarKind::None, i, 0);
}
[[gnu::noinline]] void cap(Cap& c, const std::array<bool, 3>& v, std::uint16_t i) {
  c.b.add_scalar(ScalarKind::ListBegin, i, 0, 3);
  for (bool x : v) cap(c, x, i);
}
template <class T>
void cap(Cap& c, const c10::optional<T>& v, std::uint16_t i) {
  if (v.has_value()) cap(c, *v, i);
  else c.b.add_scalar(ScalarKind::None, i, 0);
}

// ---- results ----------------------------------------------------------------------------
void cap_result(Cap& c, const at::Tensor& t) { cap(c, t, 0); }
template <class... Ts>
void cap_result(Cap& c, const std::tuple<Ts...>& t) {
  std::apply([&](const auto&... xs) {
    std::uint16_t i = 0;
    (cap(c, xs, i++), ...);
  }, t);
}

// ---- the kernel ---------------------------------------------------------------------------
struct Site {
  std::uint64_t hash;
  bool is_mutable;
  c10::OperatorHandle handle;
};

std::vector<c10::IValue> box_result(const at::Tensor& t) { return {c10::IValue(t)}; }
template <class... Ts>
std::vector<c10::IValue> box_result(const std::tuple<Ts...>& t) {
  std::vector<c10::IValue> v;
  std::apply([&](const auto&... xs) { (v.emplace_back(xs), ...); }, t);
  return v;
}

// Note [Cold code out of the kernels]: every hot op has its own instantiation of Rec::call,
// run once or twice per step between long stretches of interpreter and kernel code, so its
// instructions are fetched from outside the L1 cache nearly every time. What runs only once
// (the site's lookup) or only under crucible.compile (boxing for the capture) is kept out of
// line and in the cold section, so the code each op does run spans fewer cache lines.
template <class Op>
[[gnu::noinline, gnu::cold]] Site make_site() {
  std::string name = Op::name;
  if (std::strlen(Op::overload_name) != 0) name += std::string(".") + Op::overload_name;
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  return Site{record::Recorder::global().intern_schema(name), handle.schema().is_mutable(), handle};
}

template <class Op>
const Site& site() {
  static const Site s = make_site<Op>();
  return s;
}

// One nesting level deeper for the duration of the op's own call (exceptions included).
struct DepthGuard {
  ThreadState& ts;
  explicit DepthGuard(ThreadState& t) : ts(t) { ++ts.depth; }
  ~DepthGuard() { --ts.depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

// "addmm", "add.Tensor": the name torch::Library::impl takes.
template <class Op>
std::string impl_name() {
  std::string name = std::string(Op::name).substr(std::strlen("aten::"));
  if (std::strlen(Op::overload_name) != 0) name += std::string(".") + Op::overload_name;
  return name;
}

template <class Op, class Fn>
struct Rec;

template <class Op, class Ret, class... Args>
struct Rec<Op, Ret(Args...)> {
  static Ret call(c10::DispatchKeySet ks, Args... args) {
    const c10::DispatchKeySet after = after_key(ks);
    ThreadState& ts = thread_state();
    if constexpr (in_place_name(Op::name)) {
      const bool below = ts_below_autograd(ts);
      if (keeps_key_for_saved_originals(ts, below)) [[unlikely]]
        return call_keeping_key(ts, after, below, args...);
    }
    const KeyExcluded guard(ts);  // nested calls are internals (see above)
    if (ts.capture != nullptr) [[unlikely]]
      return call_capturing(ts, after, guard.below_autograd(), args...);
    return record<false>(ts, after, guard.below_autograd(), args...);
  }

  // An in-place op under autograd: its nested calls come back to the key, and the copy of its
  // input that autograd saves is recorded (Note [Saved originals], Capture.h).
  [[gnu::noinline]] static Ret call_keeping_key(ThreadState& ts, c10::DispatchKeySet after,
                                                bool below_autograd, Args... args) {
    if (ts.capture != nullptr) return record<true>(ts, after, below_autograd, args...);
    return record<false>(ts, after, below_autograd, args...);
  }

  // Under crucible.compile's capture the arguments and results are also boxed for it (Note
  // [Cold code out of the kernels]): a separate copy, out of line, so the common path carries
  // no vector of IValues to construct and destroy.
  [[gnu::noinline, gnu::cold]] static Ret call_capturing(ThreadState& ts, c10::DispatchKeySet after,
                                                         bool below_autograd, Args... args) {
    return record<true>(ts, after, below_autograd, args...);
  }

  struct NoCapture {};
  template <bool kCapture>
  [[gnu::always_inline]] static Ret record(ThreadState& ts, c10::DispatchKeySet after, bool below_autograd,
                                           Args... args) {
    const Site& s = site<Op>();
    // Note [Ablation build]: the rungs that stop early run the op unrecorded, one level deeper.
    auto unrecorded = [&]() -> Ret {
      DepthGuard depth{ts};
      return Op::redispatch(after, args...);
    };
    if (g_ablation == Ablation::KernelOnly) return unrecorded();
    Frame* f = enter_recorded(ts, s.is_mutable, below_autograd, std::string_view(Op::name) == "aten::clone");
    if (f == nullptr) {  // internals (the key is excluded already, except after call_keeping_key)
      const KeyExcluded guard(ts);
      return Op::redispatch(after, args...);
    }
    if (g_ablation == Ablation::EnterOnly) return unrecorded();
    // A capture for crucible.compile alone (capture_only) commits nothing to the rings: the
    // op's cells would be built for nothing.
    bool capture_args = g_ablation != Ablation::EntryOnly;
    if constexpr (kCapture) capture_args = capture_args && !ts.capture->capture_only;
    const Phase phase = f->phase;
    const std::uint8_t flags = f->flags;
    Cap in{ts, f->b, false};
    std::uint16_t i = 0;
    if (capture_args) (cap(in, args, i++), ...);
    f->b.end_inputs();
    std::conditional_t<kCapture, std::vector<c10::IValue>, NoCapture> cap_args;
    if constexpr (kCapture) cap_args = c10::impl::boxArgs<Args...>(args...);
    DepthGuard depth{ts};
    decltype(auto) result = Op::redispatch(after, args...);
    Cap out{ts, f->b, true};
    if (capture_args) cap_result(out, result);
    if constexpr (kCapture) capture_op(ts, s.handle, std::move(cap_args), box_result(result), phase);
    if (g_ablation != Ablation::NoRing)
      commit_op(ts, *f, s.hash, static_cast<std::uint16_t>(sizeof...(Args)), phase, flags);
    return result;
  }
};

// A hot op's kernel in the key-floor install (Note [Key floor], Dispatch.cpp): the dispatcher
// still stops at the key and the kernel still excludes it for the nested calls, as Rec::call
// does, but nothing is recorded.
template <class Op, class Fn>
struct Pass;
template <class Op, class Ret, class... Args>
struct Pass<Op, Ret(Args...)> {
  static Ret call(c10::DispatchKeySet ks, Args... args) {
    const KeyExcluded guard;
    return Op::redispatch(after_key(ks), args...);
  }
};

// Registers Kernel<Op, schema>::call, typed, as the op's kernel on the key: Rec for recording,
// Pass for the key floor.
template <template <class, class> class Kernel, class Op>
void reg(torch::Library& lib) {
  lib.impl(impl_name<Op>().c_str(), torch::CppFunction::makeFromUnboxedFunction(
                                        TORCH_FN((&Kernel<Op, typename Op::schema>::call))));
}

// Note [Composite fallthroughs]: a CompositeImplicitAutograd op reaches the key above Autograd
// undecomposed, and the ops it decomposes into come back to the key (Note [One op level]). For
// the composites below the key is a fallthrough: the dispatcher skips it for them, so they cost
// no kernel call, no frame and no boxing, and the ops they decompose into arrive as top-level
// ops and are recorded exactly as when the fallback passed the composite through. A composite
// that dispatches nothing returns its input (to() with the input's dtype, dropout in eval, a
// flatten of a 1-d tensor): nothing new exists, so nothing is recorded (the fallback records
// such a composite of any other kind as itself). Exact for dense CPU and CUDA tensors: where a
// backend has its own kernel for one of these ops (MPS linear, nested tensors) that kernel runs
// below Autograd and the ops it dispatches arrive as top-level ops.
template <class Op>
bool reg_fallthrough(torch::Library& lib) {
  // Only where this PyTorch really decomposes the op above Autograd; otherwise the op is a
  // kernel of its own and the fallback records it.
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  if (!handle.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) || handle.schema().is_mutable())
    return false;
  lib.impl(impl_name<Op>().c_str(), torch::CppFunction::makeFallthrough());
  return true;
}

std::size_t g_fallthroughs = 0;

}  // namespace

// Composite ops of the same models (Note [Composite fallthroughs]).
#define CRUCIBLE_COMPOSITE_OPS(_)                                                                \
  _(linear)                                                                                      \
  _(cross_entropy_loss) _(log_softmax_int) _(nll_loss_nd) _(nll_loss) _(conv2d) _(batch_norm)    \
      _(layer_norm) _(dropout) _(matmul) _(softmax_int) _(flatten_using_ints) _(to_dtype_layout) \
          _(to_dtype) _(to_device) _(to_other)

// The hot ops: those that dominate MLP, CNN, resnet18 and transformer training steps.
#define CRUCIBLE_HOT_OPS(_)                                                                   \
  _(addmm) _(mm) _(t) _(relu) _(_log_softmax) _(_log_softmax_backward_data)                    \
  _(nll_loss_forward) _(nll_loss_backward) _(ones_like) _(sum_dim_IntList) _(view) _(detach)   \
  _(threshold_backward) _(clone) _(add_Tensor) _(add__Tensor) _(mul_Tensor) _(mul__Tensor)     \
  _(mul__Scalar) _(add__Scalar) _(div_Tensor) _(zero_) _(sqrt) _(addcmul_) _(addcdiv_)         \
  _(convolution) _(convolution_backward) _(native_batch_norm) _(native_batch_norm_backward)    \
  _(max_pool2d_with_indices) _(max_pool2d_with_indices_backward) _(empty_memory_format) _(zeros)

void register_unboxed(torch::Library& lib) {
#define CRUCIBLE_REG(op) reg<Rec, at::_ops::op>(lib);
  CRUCIBLE_HOT_OPS(CRUCIBLE_REG)
#undef CRUCIBLE_REG
}

void register_composite_fallthroughs(torch::Library& lib) {
  g_fallthroughs = 0;
#define CRUCIBLE_REG_FALLTHROUGH(op) g_fallthroughs += reg_fallthrough<at::_ops::op>(lib);
  CRUCIBLE_COMPOSITE_OPS(CRUCIBLE_REG_FALLTHROUGH)
#undef CRUCIBLE_REG_FALLTHROUGH
}

void register_passthrough(torch::Library& lib) {
#define CRUCIBLE_REG_PASS(op) reg<Pass, at::_ops::op>(lib);
  CRUCIBLE_HOT_OPS(CRUCIBLE_REG_PASS)
#undef CRUCIBLE_REG_PASS
}

std::size_t unboxed_op_count() {
#define CRUCIBLE_COUNT(op) +1
  return 0 CRUCIBLE_HOT_OPS(CRUCIBLE_COUNT);
#undef CRUCIBLE_COUNT
}

std::size_t composite_fallthrough_count() { return g_fallthroughs; }

}  // namespace crucible::vessel::detail
