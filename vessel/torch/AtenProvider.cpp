// AtenProvider.cpp — see AtenProvider.h.
//
// Note [ATen provider]
// A library call of the exec stage names its operator ("aten::add.Tensor"), its tensors (memory
// the runner placed: inputs and outputs, each with sizes, strides, dtype and the schema position
// it had when recorded) and its scalar arguments as the trace recorded them (ScalarRecords,
// patches applied). The provider rebuilds the operator's argument stack from the schema:
//  - each tensor becomes an at::Tensor over the placed memory (at::from_blob: no copy, no
//    ownership); a Python number keeps its wrapped-number flag, so type promotion is ATen's;
//  - each other argument is read back from its records by the schema's type (int, float, bool,
//    Scalar, int[], dtype, device, optional, lists of tensors); a string was recorded as its
//    hash, so only the schema's default or one of the strings in kKnownStrings is accepted;
//    a generator only when none was given. An argument the records do not give back in full is
//    an error naming it, never a guess.
// The provider allocates nothing the plan did not place, where ATen lets it:
//  - an operator that writes its arguments (`add_`, an out= overload) is called as recorded; its
//    results must be the placed outputs;
//  - a functional operator runs through its out= overload (found once per operator: the same
//    arguments, by name and type, followed by one out argument per result), writing into the
//    placed outputs. ATen's out= kernels compute with the same loops as the functional ones
//    (one exception below);
//  - an operator that only allocates (empty, empty_like, new_empty_strided, ...) does nothing:
//    its result is placed, and its contents are unspecified in ATen too;
//  - Note [Adopted results] (exec/Backend.h): where such a result is laid out as the plan placed
//    it and its slot is the arena's, first written by this call, ATen's memory becomes the
//    slot's for the run instead of being copied (`stats().adopted`); an out= overload with no CPU
//    kernel of its own (ATen's generated wrapper: compute, then copy) is passed over for the
//    functional operator when some output can be adopted (resnet18: convolution_backward,
//    native_batch_norm_backward);
//  - an out= overload known to compute something else than its functional operator is never
//    called (Note [Wrong out= kernels]: native_batch_norm's on a permuted input);
//  - an operator with no out= overload, or a call with a result the plan does not place (one
//    convolution_backward's output_mask leaves undefined), computes its results, and the placed
//    ones are copied into place (`stats().functional` counts these calls, `stats().copied` the
//    results copied).
// Calls run below Autograd (the wrapped memory is never part of a graph) and with the recording
// key excluded, so a provider used while a step is recorded adds nothing to the trace.
// A plan runs the same calls every run, mostly on the same memory (the arena, the parameters):
// per call the provider keeps its operator and its last argument stack, and a run whose call has
// the same scalars and every tensor at the same address with the same geometry reuses them
// (`stats().reused`); the geometry check also catches an operator that changed a tensor's
// metadata in place. Wrapping the tensors anew each run was most of a small step's provider time.
#include "AtenProvider.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/InferenceMode.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <vector>

#include "Capture.h"
#include "crucible/core/ContentHash.h"

namespace crucible::vessel {

using record::ScalarKind;
using record::ScalarRecord;

namespace {

// Note [Wrong out= kernels]: the warnings of an out= attempt that may yet fall back.
struct HeldWarnings : c10::WarningHandler {
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& w) override { warnings.push_back(w); }
};

// Strings that ATen operators take as enum-like arguments; the trace keeps only their hash.
constexpr std::array<std::string_view, 22> kKnownStrings = {
    "none",    "tanh",     "floor",    "trunc",     "mean",     "sum",      "reflect",  "replicate",
    "constant", "circular", "linear",  "bilinear",  "bicubic",  "trilinear", "nearest", "nearest-exact",
    "area",    "zeros",    "border",   "reflection", "left",    "right"};

std::string op_text(std::string_view op) { return std::string(op); }

}  // namespace

struct AtenProvider::Resolved {
  c10::OperatorHandle op;
  std::optional<c10::OperatorHandle> out;  // the out= overload of a functional operator
  bool writes_arguments = false;           // in place or out=: called as recorded
  bool allocates_only = false;             // empty, empty_like, new_empty...: uninitialized memory
  bool out_composite = false;              // its out= overload has no CPU kernel of its own
  // Note [Wrong out= kernels]: its out= overload is right only for an input (argument 0)
  // contiguous or channels-last
  bool out_dense_input = false;
  // Its out= overload raised where its functional operator did not: the functional one runs.
  mutable bool out_failed = false;
  explicit Resolved(c10::OperatorHandle h) : op(std::move(h)) {}
};

struct AtenProvider::CallCache {
  const Resolved* rop = nullptr;
  bool built = false;
  std::vector<record::ScalarRecord> scalars;
  std::vector<at::Tensor> in, out;  // parallel to the call's inputs and outputs
  std::vector<at::Tensor> rets;     // the placed results by return position (undefined: none)
  torch::jit::Stack args;           // the operator's arguments, before out= tensors
  std::vector<at::Tensor> adopted;  // results whose memory the runner adopted this run
  bool out_proven = false;          // its out= overload ran without raising
};

namespace {

// A plan's sizes or strides as ATen's array reference (c10::ArrayRef takes a std::span itself
// only from torch 2.6 on).
c10::IntArrayRef ints(std::span<const std::int64_t> v) { return {v.data(), v.size()}; }

// Whether `out` is `functional`'s out= overload: the same arguments (name and type) followed by
// one out argument per result.
bool is_out_overload(const c10::FunctionSchema& functional, const c10::FunctionSchema& out) {
  const auto& fa = functional.arguments();
  const auto& oa = out.arguments();
  const std::size_t nret = functional.returns().size();
  if (nret == 0 || oa.size() != fa.size() + nret || out.returns().size() != nret) return false;
  for (std::size_t i = 0; i < fa.size(); ++i)
    if (fa[i].name() != oa[i].name() || *fa[i].type() != *oa[i].type()) return false;
  for (std::size_t i = fa.size(); i < oa.size(); ++i)
    if (!oa[i].is_out() || oa[i].type()->kind() != c10::TypeKind::TensorType) return false;
  for (const c10::Argument& r : functional.returns())
    if (r.type()->kind() != c10::TypeKind::TensorType) return false;
  return true;
}

// The registered overloads of operator `name` ("aten::add"), from an index of every operator
// made once per process: scanning getAllOpNames() for each operator a plan calls took about
// 0.2 ms an operator, half of preparing the transformer step's exec plan. An operator
// registered after the index was made has no out= overload found, so it runs functionally.
const std::vector<c10::OperatorName>& overloads_of(const std::string& name) {
  static const auto index = [] {
    std::unordered_map<std::string, std::vector<c10::OperatorName>> m;
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) m[n.name].push_back(n);
    return m;
  }();
  static const std::vector<c10::OperatorName> none;
  auto it = index.find(name);
  return it == index.end() ? none : it->second;
}

bool writes_arguments(const c10::FunctionSchema& s) {
  for (const c10::Argument& a : s.arguments())
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  return false;
}

// The records of one argument: its kind and the element records that follow a ListBegin.
struct ArgRecords {
  const ScalarRecord* first = nullptr;
  std::span<const ScalarRecord> elems;  // a list's elements
};

Status arg_error(std::string_view op, const c10::Argument& a, std::string_view what) {
  return unsupported(op_text(op) + " argument '" + a.name() + "' (" + a.type()->str() + "): " +
                         std::string(what),
                     "this call cannot be run through ATen from the recorded arguments");
}

double as_double(const ScalarRecord& r) {
  if (r.kind == ScalarKind::Int) return static_cast<double>(static_cast<std::int64_t>(r.bits));
  double d;
  std::memcpy(&d, &r.bits, 8);
  return d;
}

Result<c10::Scalar> scalar_of(const ScalarRecord* r, std::string_view op, const c10::Argument& a) {
  switch (r->kind) {
    case ScalarKind::Int: return c10::Scalar(static_cast<std::int64_t>(r->bits));
    case ScalarKind::Double: return c10::Scalar(as_double(*r));
    case ScalarKind::Bool: return c10::Scalar(r->bits != 0);
    case ScalarKind::ComplexReal: {
      const ScalarRecord& im = r[1];
      return c10::Scalar(c10::complex<double>(as_double(*r), as_double(im)));
    }
    default: return arg_error(op, a, "the record is not a number");
  }
}

// One non-tensor value of schema type `t` from its record(s).
Result<c10::IValue> value_of(const c10::TypePtr& t, const ScalarRecord* r,
                             std::span<const ScalarRecord> elems, std::string_view op,
                             const c10::Argument& a) {
  if (r->kind == ScalarKind::None) {
    if (t->kind() == c10::TypeKind::OptionalType || t->kind() == c10::TypeKind::NoneType)
      return c10::IValue();
    return arg_error(op, a, "recorded as None for a type that is not optional");
  }
  const c10::TypePtr inner =
      t->kind() == c10::TypeKind::OptionalType ? t->castRaw<c10::OptionalType>()->getElementType() : t;
  switch (inner->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      if (r->kind != ScalarKind::Int) return arg_error(op, a, "the record is not an integer");
      return c10::IValue(static_cast<std::int64_t>(r->bits));
    case c10::TypeKind::FloatType:
      if (r->kind != ScalarKind::Double && r->kind != ScalarKind::Int)
        return arg_error(op, a, "the record is not a number");
      return c10::IValue(as_double(*r));
    case c10::TypeKind::BoolType:
      if (r->kind != ScalarKind::Bool) return arg_error(op, a, "the record is not a bool");
      return c10::IValue(r->bits != 0);
    case c10::TypeKind::NumberType: {
      auto s = scalar_of(r, op, a);
      if (!s.ok()) return s.status();
      return c10::IValue(*s);
    }
    case c10::TypeKind::StringType: {
      if (r->kind != ScalarKind::String) return arg_error(op, a, "the record is not a string");
      if (a.default_value() && a.default_value()->isString() &&
          hash64(a.default_value()->toStringRef()) == r->bits)
        return *a.default_value();
      for (std::string_view s : kKnownStrings)
        if (hash64(s) == r->bits) return c10::IValue(std::string(s));
      return arg_error(op, a, "the trace keeps only the string's hash, and it is none of the strings this provider knows");
    }
    case c10::TypeKind::DeviceObjType: {
      if (r->kind != ScalarKind::Device) return arg_error(op, a, "the record is not a device");
      if ((r->bits >> 8) != static_cast<std::uint64_t>(DeviceKind::CPU))
        return arg_error(op, a, "only CPU devices are run by this provider");
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
    case c10::TypeKind::ListType: {
      if (r->kind != ScalarKind::ListBegin) return arg_error(op, a, "the record is not a list");
      const c10::TypePtr el = inner->castRaw<c10::ListType>()->getElementType();
      if (elems.size() != r->aux) return arg_error(op, a, "the list's elements are not all recorded");
      switch (el->kind()) {
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType: {
          std::vector<std::int64_t> v;
          for (const ScalarRecord& e : elems) {
            if (e.kind != ScalarKind::Int) return arg_error(op, a, "an element is not an integer");
            v.push_back(static_cast<std::int64_t>(e.bits));
          }
          return c10::IValue(v);
        }
        case c10::TypeKind::FloatType: {
          std::vector<double> v;
          for (const ScalarRecord& e : elems) v.push_back(as_double(e));
          return c10::IValue(v);
        }
        case c10::TypeKind::BoolType: {
          c10::List<bool> v;
          for (const ScalarRecord& e : elems) v.push_back(e.bits != 0);
          return c10::IValue(v);
        }
        default: return arg_error(op, a, "a list of this element type is not run by this provider");
      }
    }
    case c10::TypeKind::GeneratorType:
      return arg_error(op, a, "a generator was given (only the default generator is replayed)");
    default: return arg_error(op, a, "this argument type is not run by this provider");
  }
}

at::Tensor wrap(const exec::TensorArg& t) {
  const auto dtype = static_cast<c10::ScalarType>(t.dtype);
  at::Tensor x = at::from_blob(t.data, ints(t.sizes), ints(t.strides),
                               at::TensorOptions().dtype(dtype).device(at::kCPU));
  if (t.wrapped_number) x.unsafeGetTensorImpl()->set_wrapped_number(true);
  return x;
}

const exec::TensorArg* find_tensor(std::span<const exec::TensorArg> ts, std::uint32_t arg,
                                   std::uint32_t list_index) {
  for (const exec::TensorArg& t : ts)
    if (t.arg_index == arg && t.list_index == list_index) return &t;
  return nullptr;
}

// Whether the tensors wrapped for a call's previous run still are these: the same element 0,
// sizes and strides (an undefined one stands for none).
bool same_tensors(const std::vector<at::Tensor>& w, std::span<const exec::TensorArg> ts) {
  if (w.size() != ts.size()) return false;
  for (std::size_t k = 0; k < ts.size(); ++k) {
    const at::Tensor& t = w[k];
    const exec::TensorArg& a = ts[k];
    if (!t.defined() || t.data_ptr() != a.data ||
        !std::equal(a.sizes.begin(), a.sizes.end(), t.sizes().begin(), t.sizes().end()) ||
        !std::equal(a.strides.begin(), a.strides.end(), t.strides().begin(), t.strides().end()))
      return false;
  }
  return true;
}

// Whether some placed output of the call may take ATen's own memory (Note [Adopted results]).
// Whether dims `order` (innermost first) are dense in that order, dims of size 1 skipped (as
// c10 decides contiguity and channels-last contiguity).
bool dense_in(std::span<const std::int64_t> sizes, std::span<const std::int64_t> strides,
              std::span<const std::size_t> order) {
  std::int64_t expect = 1;
  for (std::size_t d : order) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

// Note [Wrong out= kernels]: whether the out= overload may run on this input.
bool out_trusted(bool dense_input_only, std::span<const std::int64_t> sizes,
                 std::span<const std::int64_t> strides) {
  if (!dense_input_only) return true;
  std::vector<std::size_t> row_major(sizes.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) row_major[d] = sizes.size() - 1 - d;
  static constexpr std::array<std::size_t, 4> kChannelsLast{1, 3, 2, 0};
  return dense_in(sizes, strides, row_major) ||
         (sizes.size() == 4 && dense_in(sizes, strides, kChannelsLast));
}

// The records of each argument, in order: a ListBegin takes the `aux` records after it.
Status group_records(std::string_view op, std::size_t nargs, std::span<const ScalarRecord> scalars,
                     std::vector<ArgRecords>& recs) {
  recs.assign(nargs, ArgRecords{});
  for (std::size_t i = 0; i < scalars.size(); ++i) {
    const ScalarRecord& r = scalars[i];
    if (r.arg_index >= nargs)
      return invalid_input(op_text(op) + ": a scalar record for argument " +
                               std::to_string(r.arg_index) + " of " + std::to_string(nargs),
                           "the plan does not match this torch's schema: record the step again");
    if (recs[r.arg_index].first == nullptr) recs[r.arg_index].first = &r;
    if (r.kind == ScalarKind::ListBegin) {
      const std::size_t n = std::min<std::size_t>(r.aux, scalars.size() - i - 1);
      // Elements that are tensors are in the tensors, not here: only records of this argument.
      std::size_t k = 0;
      while (k < n && scalars[i + 1 + k].arg_index == r.arg_index) ++k;
      recs[r.arg_index].elems = scalars.subspan(i + 1, k);
      i += k;
    } else if (r.kind == ScalarKind::ComplexReal) {
      ++i;  // its ComplexImag
    }
  }
  return ok_status();
}

// Whether argument type t holds tensors (Tensor, Tensor?, Tensor[], Tensor?[]): placed, not
// recorded as scalars.
bool tensor_typed(const c10::TypePtr& t) {
  c10::TypePtr inner = t->kind() == c10::TypeKind::OptionalType
                           ? t->castRaw<c10::OptionalType>()->getElementType()
                           : t;
  if (inner->kind() == c10::TypeKind::ListType) {
    inner = inner->castRaw<c10::ListType>()->getElementType();
    if (inner->kind() == c10::TypeKind::OptionalType)
      inner = inner->castRaw<c10::OptionalType>()->getElementType();
  }
  return inner->kind() == c10::TypeKind::TensorType;
}

bool any_adoptable(const exec::LibraryCall& c) {
  if (c.adoptable == nullptr) return false;
  for (std::uint32_t k = 0; k < c.outputs.size(); ++k)
    if (c.adoptable(c.runner, k)) return true;
  return false;
}

bool same_scalars(const std::vector<ScalarRecord>& a, std::span<const ScalarRecord> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(ScalarRecord)) == 0);
}

}  // namespace

Status AtenProvider::failure(std::string_view op) {
  error_ = std::current_exception();
  std::string what;
  try {
    throw;
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of no known type";
  }
  return invalid_input(op_text(op) + " failed in ATen: " + what, "the plan's call does not run on these tensors");
}

c10::Storage AtenProvider::adopted_storage(const void* base) const {
  for (const auto& cc : cache_)
    if (cc)
      for (const at::Tensor& t : cc->adopted)
        if (t.has_storage() && t.storage().data() == base) return t.storage();
  return c10::Storage();
}

void AtenProvider::release_adopted() {
  for (const auto& cc : cache_)
    if (cc) cc->adopted.clear();
}

AtenProvider::AtenProvider() = default;
AtenProvider::~AtenProvider() = default;

exec::Provider AtenProvider::provider() {
  exec::Provider p;
  p.self = this;
  p.call = [](void* self, const exec::LibraryCall& c) { return static_cast<AtenProvider*>(self)->call(c); };
  p.allocates = [](void* self, const exec::ExecutionPlan& plan, std::uint32_t call) {
    return static_cast<AtenProvider*>(self)->allocates(plan, call);
  };
  p.release = [](void* self, std::uint32_t call) {
    auto* a = static_cast<AtenProvider*>(self);
    if (call < a->cache_.size() && a->cache_[call]) a->cache_[call]->adopted.clear();
  };
  return p;
}

// As call() chooses, for a call some of whose outputs the runner may adopt.
bool AtenProvider::allocates(const exec::ExecutionPlan& plan, std::uint32_t call) {
  const exec::Call& c = plan.calls[call];
  auto resolved = resolve(plan.op_names[c.op]);
  if (!resolved.ok()) return false;  // the call fails at its run with the reason
  const Resolved& rop = **resolved;
  if (rop.allocates_only || rop.writes_arguments) return false;
  if (!rop.out || rop.out_composite) return true;
  for (const exec::Arg& a : plan.inputs_of(c))
    if (a.arg_index == 0 && a.list_index == 0 &&
        !out_trusted(rop.out_dense_input, plan.sizes(plan.tensors[a.tensor]),
                     plan.strides(plan.tensors[a.tensor])))
      return true;
  // The out= path needs a placed result at every return position.
  const std::size_t nret = rop.op.schema().returns().size();
  std::vector<bool> placed(nret, false);
  for (const exec::Arg& a : plan.outputs_of(c))
    if (a.list_index == 0 && a.arg_index < nret) placed[a.arg_index] = true;
  return std::ranges::find(placed, false) != placed.end();
}

Result<const AtenProvider::Resolved*> AtenProvider::resolve(std::string_view op) {
  const std::string key(op);
  if (auto it = ops_.find(key); it != ops_.end()) return it->second.get();
  const std::size_t colons = key.find("::");
  const std::size_t dot = key.find('.', colons == std::string::npos ? 0 : colons + 2);
  const std::string name = key.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : key.substr(dot + 1);
  auto& dispatcher = c10::Dispatcher::singleton();
  auto h = dispatcher.findSchema(c10::OperatorName(name, overload));
  if (!h)
    return unsupported("this torch has no operator " + key,
                       "the plan was recorded with another torch: record the step again");
  auto r = std::make_unique<Resolved>(*h);
  const c10::FunctionSchema& s = h->schema();
  r->writes_arguments = writes_arguments(s);
  for (std::string_view e : {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                             "aten::new_empty_strided"})
    r->allocates_only = r->allocates_only || name == e;
  // Note [Wrong out= kernels]: an out= overload is not called where it does not compute what
  // its functional operator computes. native_batch_norm.out on an input that is neither
  // contiguous nor channels-last (BatchNorm1d over x.transpose(1, 2)) gives statistics that
  // depend on what its out buffers held (torch 2.13: save_mean 0 where the functional operator
  // gives -0.14), and so a wrong Y and running statistics; on contiguous and channels-last
  // inputs it gives the functional operator's bits (test_generated_batch_norm.py). The out=
  // overloads of mse_loss, huber_loss, smooth_l1_loss, soft_margin_loss and
  // binary_cross_entropy with a reduction resize their (exactly sized) result's storage, which
  // placed memory cannot do: they raise where the functional operators do not. An out= overload
  // that raises before it has once run is dropped for its functional operator when that one
  // runs (`stats().out_failed`); binary_cross_entropy's is never called, as where the storage
  // can grow it returns the first element's loss instead of the mean. Found by running every
  // OpInfo sample of torch 2.13 through both overloads, inputs permuted and sliced, outputs
  // prefilled with NaN, 0 and 1e30: 461 functional overloads with an out= one, no other
  // silent difference.
  // _native_batch_norm_legit (both overloads) and _batch_norm_with_update reach the same
  // batch_norm_cpu_out.
  for (std::string_view e :
       {"aten::native_batch_norm", "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_with_update"})
    r->out_dense_input = r->out_dense_input || name == e;
  if (!r->writes_arguments && name != "aten::binary_cross_entropy") {
    for (const c10::OperatorName& n : overloads_of(name)) {
      if (n.overload_name == overload) continue;
      auto oh = dispatcher.findSchema(n);
      if (oh && is_out_overload(s, oh->schema())) {
        r->out = *oh;
        r->out_composite = !oh->hasKernelForDispatchKey(c10::DispatchKey::CPU);
        break;
      }
    }
  }
  const Resolved* out = r.get();
  ops_.emplace(key, std::move(r));
  return out;
}

Status AtenProvider::check_arguments(const exec::ExecutionPlan& plan) {
  std::vector<ArgRecords> recs;
  for (std::uint32_t k = 0; k < plan.calls.size(); ++k) {
    const exec::Call& call = plan.calls[k];
    const std::string& op = plan.op_names[call.op];
    auto resolved = resolve(op);
    if (!resolved.ok()) return resolved.status();
    if ((*resolved)->allocates_only) continue;
    const auto& args = (*resolved)->op.schema().arguments();
    const std::span<const ScalarRecord> scalars(plan.scalars.data() + call.scalar_begin,
                                                call.scalar_count);
    CRUCIBLE_RETURN_IF_ERROR(group_records(op, args.size(), scalars, recs));
    for (std::size_t i = 0; i < args.size(); ++i) {
      const c10::Argument& a = args[i];
      if (tensor_typed(a.type())) continue;
      if (recs[i].first == nullptr) {
        if (!a.default_value()) return arg_error(op, a, "it was not recorded and has no default");
        continue;
      }
      try {
        auto v = value_of(a.type(), recs[i].first, recs[i].elems, op, a);
        if (!v.ok()) return v.status();
      } catch (...) {
        return failure(op);
      }
    }
  }
  return ok_status();
}

Status AtenProvider::call(const exec::LibraryCall& c) {
  CallCache* cc = nullptr;
  if (c.plan != nullptr) {
    if (cache_plan_ != c.plan) {
      cache_.clear();
      cache_.resize(c.plan->calls.size());
      cache_plan_ = c.plan;
    }
    if (c.call < cache_.size()) {
      if (!cache_[c.call]) cache_[c.call] = std::make_unique<CallCache>();
      cc = cache_[c.call].get();
    }
  }
  const Resolved* rp = cc != nullptr ? cc->rop : nullptr;
  if (rp == nullptr) {
    auto resolved = resolve(c.op);
    if (!resolved.ok()) return resolved.status();
    rp = *resolved;
    if (cc != nullptr) cc->rop = rp;
  }
  const Resolved& rop = *rp;
  const c10::FunctionSchema& schema = rop.op.schema();
  if (rop.allocates_only && !c.outputs.empty() && c.outputs.size() == schema.returns().size()) {
    ++stats_.calls;  // its result's memory is placed, and what it holds is unspecified
    ++stats_.allocations;
    return ok_status();
  }
  if (cc != nullptr && cc->built && same_scalars(cc->scalars, c.scalars) && same_tensors(cc->in, c.inputs) &&
      same_tensors(cc->out, c.outputs)) {
    ++stats_.reused;
    torch::jit::Stack stack = cc->args;
    return invoke(c, rop, std::move(stack), cc->rets, cc->out, &cc->adopted, &cc->out_proven);
  }
  const auto& args = schema.arguments();
  std::vector<ArgRecords> recs;
  CRUCIBLE_RETURN_IF_ERROR(group_records(c.op, args.size(), c.scalars, recs));

  // Every tensor wrapped once, in the call's order (the cache keeps them so).
  std::vector<at::Tensor> in(c.inputs.size()), outs(c.outputs.size());
  for (std::size_t k = 0; k < c.inputs.size(); ++k) in[k] = wrap(c.inputs[k]);
  auto wrapped = [&](const exec::TensorArg* x) { return in[static_cast<std::size_t>(x - c.inputs.data())]; };
  torch::jit::Stack stack;
  try {
    stack.reserve(args.size() + c.outputs.size());
    for (std::size_t i = 0; i < args.size(); ++i) {
      const c10::Argument& a = args[i];
      const c10::TypePtr& t = a.type();
      const c10::TypePtr inner =
          t->kind() == c10::TypeKind::OptionalType ? t->castRaw<c10::OptionalType>()->getElementType() : t;
      const ArgRecords& ar = recs[i];
      if (inner->kind() == c10::TypeKind::TensorType) {
        if (const exec::TensorArg* x = find_tensor(c.inputs, static_cast<std::uint32_t>(i), 0)) {
          stack.emplace_back(wrapped(x));
        } else if (t->kind() == c10::TypeKind::OptionalType) {
          stack.emplace_back();
        } else {
          return arg_error(c.op, a, "no tensor was placed for it");
        }
        continue;
      }
      const c10::TypePtr elem = inner->kind() == c10::TypeKind::ListType
                                    ? inner->castRaw<c10::ListType>()->getElementType()
                                    : nullptr;
      const bool optional_elems = elem && elem->kind() == c10::TypeKind::OptionalType;
      const c10::TypePtr elem_inner =
          optional_elems ? elem->castRaw<c10::OptionalType>()->getElementType() : elem;
      if (elem_inner && elem_inner->kind() == c10::TypeKind::TensorType) {
        // Tensor[] or Tensor?[]: the length is in the TensorList / ListBegin record.
        if (ar.first == nullptr || (ar.first->kind != ScalarKind::TensorList &&
                                    ar.first->kind != ScalarKind::ListBegin))
          return arg_error(c.op, a, "the list's length is not recorded");
        if (optional_elems) {
          c10::List<std::optional<at::Tensor>> l;
          for (std::uint32_t k = 0; k < ar.first->aux; ++k) {
            const exec::TensorArg* x = find_tensor(c.inputs, static_cast<std::uint32_t>(i), k);
            l.push_back(x ? std::optional<at::Tensor>(wrapped(x)) : std::nullopt);
          }
          stack.emplace_back(l);
        } else {
          std::vector<at::Tensor> l;
          for (std::uint32_t k = 0; k < ar.first->aux; ++k) {
            const exec::TensorArg* x = find_tensor(c.inputs, static_cast<std::uint32_t>(i), k);
            if (x == nullptr) return arg_error(c.op, a, "an element's tensor was not placed");
            l.push_back(wrapped(x));
          }
          stack.emplace_back(l);
        }
        continue;
      }
      if (ar.first == nullptr) {
        if (a.default_value()) {
          stack.push_back(*a.default_value());
          continue;
        }
        return arg_error(c.op, a, "it was not recorded and has no default");
      }
      auto v = value_of(t, ar.first, ar.elems, c.op, a);
      if (!v.ok()) return v.status();
      stack.push_back(std::move(*v));
    }

  } catch (...) {
    return failure(c.op);
  }
  // The results by return position.
  std::vector<at::Tensor> rets(schema.returns().size());
  for (std::size_t k = 0; k < c.outputs.size(); ++k) {
    outs[k] = wrap(c.outputs[k]);
    if (c.outputs[k].list_index == 0 && c.outputs[k].arg_index < rets.size()) rets[c.outputs[k].arg_index] = outs[k];
  }
  if (cc != nullptr) {
    cc->built = true;
    cc->scalars.assign(c.scalars.begin(), c.scalars.end());
    cc->in = std::move(in);
    cc->out = outs;
    cc->rets = rets;
    cc->args = stack;
  }
  return invoke(c, rop, std::move(stack), rets, cc != nullptr ? cc->out : outs, cc != nullptr ? &cc->adopted : nullptr,
                cc != nullptr ? &cc->out_proven : nullptr);
}

Status AtenProvider::invoke(const exec::LibraryCall& c, const Resolved& rop, torch::jit::Stack stack,
                            const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& placed,
                            std::vector<at::Tensor>* keep, bool* out_proven) {
  try {
    c10::impl::ExcludeDispatchKeyGuard no_record(detail::kKey);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ++stats_.calls;
    const exec::TensorArg* in0 = find_tensor(c.inputs, 0, 0);
    const bool input_trusted =
        in0 == nullptr || out_trusted(rop.out_dense_input, in0->sizes, in0->strides);
    if (rop.writes_arguments) {
      ++stats_.in_place;
      rop.op.callBoxed(stack);
      const auto& returns = rop.op.schema().returns();
      for (std::size_t k = 0; k < outs.size() && k < stack.size(); ++k) {
        if (!outs[k].defined() || !stack[k].isTensor()) continue;
        const at::Tensor& r = stack[k].toTensor();
        // A result that aliases no argument beside the written ones (rrelu_with_noise's output
        // beside its noise, _native_batch_norm_legit's beside the running statistics): a new
        // tensor, copied into place.
        if (r.data_ptr() != outs[k].data_ptr() && k < returns.size() &&
            returns[k].alias_info() == nullptr && r.sizes() == outs[k].sizes() &&
            r.scalar_type() == outs[k].scalar_type()) {
          outs[k].copy_(r);
          ++stats_.copied;
          continue;
        }
        if (r.data_ptr() != outs[k].data_ptr())
          return bad_state(op_text(c.op) + " result " + std::to_string(k) +
                               " is not the memory the plan placed for it",
                           "the plan's aliasing does not match this operator: report it");
      }
    } else if (rop.out &&
               std::all_of(outs.begin(), outs.end(),
                           [](const at::Tensor& o) { return o.defined(); }) &&
               !(rop.out_composite && any_adoptable(c)) && input_trusted && !rop.out_failed) {
      // Note [Wrong out= kernels]: until this call's out= overload has run once, the arguments
      // are kept to call the functional operator with should it raise.
      const bool proven = out_proven != nullptr && *out_proven;
      torch::jit::Stack args = proven ? torch::jit::Stack{} : stack;
      for (const at::Tensor& o : outs) stack.emplace_back(o);
      // An attempt that raises may have warned first (mse_loss.out: "An output with one or
      // more elements was resized"): its warnings are held, and given on only when it ran.
      HeldWarnings held;
      try {
        std::optional<c10::WarningUtils::WarningHandlerGuard> hold;
        if (!proven) hold.emplace(&held);
        rop.out->callBoxed(stack);
      } catch (const c10::Error&) {
        if (proven) throw;
        // It may have resized its results before raising (mse_loss's sizes become its input's):
        // each goes back to the geometry the plan placed.
        for (std::size_t k = 0; k < c.outputs.size() && k < placed.size(); ++k)
          if (placed[k].defined())
            placed[k].unsafeGetTensorImpl()->set_sizes_and_strides(ints(c.outputs[k].sizes),
                                                                   ints(c.outputs[k].strides));
        for (std::size_t k = 0; k < outs.size(); ++k)
          if (const exec::TensorArg* o = find_tensor(c.outputs, static_cast<std::uint32_t>(k), 0);
              o != nullptr && outs[k].defined())
            outs[k].unsafeGetTensorImpl()->set_sizes_and_strides(ints(o->sizes), ints(o->strides));
        rop.out_failed = true;
        --stats_.calls;  // counted again by the functional run
        const Status functional = invoke(c, rop, std::move(args), outs, placed, keep, nullptr);
        if (!functional.ok()) {
          rop.out_failed = false;  // ATen's error, not the out= overload's
          return functional;
        }
        ++stats_.out_failed;
        return functional;
      }
      for (const c10::Warning& w : held.warnings) c10::warn(w);
      if (out_proven != nullptr) *out_proven = true;
      ++stats_.out_variant;
      // An out= kernel resizes an output of other sizes (ATen warns and goes on): the result
      // would not be where the plan reads it.
      for (std::size_t k = 0; k < outs.size(); ++k) {
        const exec::TensorArg* o = find_tensor(c.outputs, static_cast<std::uint32_t>(k), 0);
        if (o != nullptr && !std::equal(o->sizes.begin(), o->sizes.end(), outs[k].sizes().begin(),
                                        outs[k].sizes().end()))
          return bad_state(op_text(c.op) + " result " + std::to_string(k) + " has sizes " +
                               c10::str(outs[k].sizes()) + " in ATen, the plan placed " +
                               c10::str(c10::IntArrayRef(o->sizes.data(), o->sizes.size())),
                           "the plan does not match this operator's shapes: record the step again");
      }
    } else {
      ++stats_.functional;
      // The storages of the arguments (wrapped placed memory, owning nothing): a result on one
      // of them (as_strided) is a view of an argument, not memory of its own to adopt — the
      // argument's memory may go (a released result, an arena slot past its last use) while
      // the output's slot still lives. It is copied into place.
      std::vector<const c10::StorageImpl*> arg_storages;
      for (const c10::IValue& v : stack) {
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().has_storage())
          arg_storages.push_back(v.toTensor().storage().unsafeGetStorageImpl());
        else if (v.isTensorList())
          for (const at::Tensor& t : v.toTensorList().vec())
            if (t.defined() && t.has_storage()) arg_storages.push_back(t.storage().unsafeGetStorageImpl());
      }
      rop.op.callBoxed(stack);
      if (keep != nullptr) keep->clear();  // the last run's adopted results
      // Each placed result: a return, or an element of a returned list (unsafe_split).
      for (std::size_t k = 0; k < c.outputs.size(); ++k) {
        const exec::TensorArg& o = c.outputs[k];
        const std::string which = op_text(c.op) + " result " + std::to_string(o.arg_index) +
                                  (o.list_index ? "[" + std::to_string(o.list_index) + "]" : "");
        at::Tensor r;
        if (o.arg_index < stack.size() && stack[o.arg_index].isTensor() && o.list_index == 0) {
          r = stack[o.arg_index].toTensor();
        } else if (o.arg_index < stack.size() && stack[o.arg_index].isTensorList()) {
          const auto l = stack[o.arg_index].toTensorList();
          if (o.list_index < l.size()) r = l.get(o.list_index);
        }
        if (!r.defined())
          return bad_state(which + " is not a tensor ATen returned", "the plan does not match this operator: report it");
        const at::Tensor& to = placed[k];
        if (r.sizes() != to.sizes() || r.scalar_type() != to.scalar_type())
          return bad_state(which + " has sizes " + c10::str(r.sizes()) + " " + c10::toString(r.scalar_type()) +
                               ", the plan placed " + c10::str(to.sizes()) + " " + c10::toString(to.scalar_type()),
                           "the plan was recorded for other shapes: record the step again");
        // Note [Adopted results]: ATen's own memory becomes the slot's when it is laid out as
        // the plan placed it (no copy); it lives until this call runs again.
        if (keep != nullptr && c.adopt != nullptr && r.strides() == to.strides() && r.has_storage() &&
            r.storage().data() != nullptr &&
            std::ranges::find(arg_storages, r.storage().unsafeGetStorageImpl()) == arg_storages.end()) {
          const std::uint64_t before = static_cast<std::uint64_t>(r.storage_offset()) * r.element_size();
          const std::uint64_t total = r.storage().nbytes();
          if (before <= total && c.adopt(c.runner, static_cast<std::uint32_t>(k), r.data_ptr(), before, total - before)) {
            keep->push_back(r);
            ++stats_.adopted;
            continue;
          }
        }
        if (to.data_ptr() == nullptr && to.numel() > 0) {  // the runner placed it no memory
          void* at = c.place != nullptr ? c.place(c.runner, static_cast<std::uint32_t>(k)) : nullptr;
          if (at == nullptr)
            return exhausted(which + ": no memory for a result ATen's own memory could not stand in for",
                             "free memory");
          at::Tensor there = at::from_blob(at, to.sizes(), to.strides(), to.options());
          there.copy_(r);
          ++stats_.placed_late;
          continue;
        }
        to.copy_(r);
        ++stats_.copied;
      }
    }
  } catch (...) {
    return failure(c.op);
  }
  return ok_status();
}

}  // namespace crucible::vessel
