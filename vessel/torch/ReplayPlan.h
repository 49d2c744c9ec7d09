// ReplayPlan.h — internal to libcrucible_dispatch.so: a captured call's form and the plan
// built from two of them (Replay.cpp), shared with sync-point execution (Sync.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "Replay.h"
#include "ReplayArena.h"
#include "absl/container/flat_hash_set.h"
#include "crucible/core/ContentHash.h"
#include "crucible/record/Recorder.h"

namespace crucible::vessel::replay {

// ---------------------------------------------------------------------------------------
// Where a tensor of the plan comes from.
struct Ref {
  enum Kind : std::uint8_t { None, Slot, Arg, Ext, View };
  Kind kind = None;
  std::uint32_t idx = 0;
};

// A view the plan rebuilds each run: as_strided on its base, offset relative to the base's.
struct ViewSpec {
  Ref base;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset_delta = 0;
};

struct ArgT {
  enum Kind : std::uint8_t { Const, Tensor, TensorList, OptTensorList };
  Kind kind = Const;
  c10::IValue value;      // Const
  std::vector<Ref> refs;  // Tensor: one; lists: one per element (None for an absent one)
};

struct OutT {
  enum Kind : std::uint8_t { Ignore, Tensor, TensorList };
  Kind kind = Ignore;
  std::uint32_t slot = 0;   // first slot
  std::uint32_t count = 0;  // TensorList: elements
};

struct OpT {
  explicit OpT(c10::OperatorHandle h) : op(std::move(h)) {}
  c10::OperatorHandle op;
  std::vector<ArgT> args;
  std::vector<OutT> outs;
  bool grad_mode = false;
  record::Phase phase = record::Phase::Forward;
  bool skip = false;                    // a pure read of a scalar for Python (.item())
  bool data_sized = false;              // its result's size depends on tensor values (nonzero, a mask)
  std::vector<std::uint32_t> release;   // slots whose last use is this op
  std::vector<std::string> arg_sig;     // canonical text per argument (no data pointers)
  std::vector<std::uintptr_t> tensor_ptrs;  // data pointers of its tensor arguments when captured
  std::string out_sig;
};

struct ArgMeta {
  std::vector<std::int64_t> sizes, strides;
  c10::ScalarType dtype;
  c10::Device device{c10::kCPU};
  // Where the argument starts in its storage when recorded: the exec stage planned its memory
  // from there (a call given another offset, a sliding window over one tensor, runs the plan's
  // ATen ops instead).
  std::int64_t offset = 0;
};

struct Use {  // where an external is first used, for messages
  std::size_t op = 0;
  std::size_t arg = 0;
};

struct Form {
  std::vector<OpT> ops;
  std::vector<at::Tensor> exts;
  std::vector<Use> ext_use;
  std::vector<std::uint8_t> ext_lifted;  // per external: 1 for a lifted constant (Note [Lifted constants])
  std::vector<ViewSpec> views;
  std::vector<Ref> outputs;
  std::vector<std::pair<std::uint32_t, Ref>> grads;  // external (a leaf) → its new .grad
  // What each leaf's .grad was when the call began (crucible::note_grads): a run must start
  // from the same kind of state — no gradient (AccumulateGrad stores a new one), the same
  // gradient tensor the ops accumulate into, or some gradient the step discards itself.
  struct GradPre {
    std::uint32_t ext;
    enum State : std::uint8_t { None, Read, Unread } state;
    std::uint32_t grad_ext;  // Read: the external the ops accumulate into
  };
  std::vector<GradPre> grad_pre;
  // Where the step called backward() and optimizer.step() during the call (Note [Sync-point
  // execution], Sync.cpp): the ops of [begin, end) ran inside that call.
  struct Mark {
    enum Kind : std::uint8_t { Backward, OptimizerStep } kind = Backward;
    std::int64_t tag = 0;             // OptimizerStep: which optimizer (its index among the guarded)
    std::uint32_t begin = 0, end = 0;
    std::vector<Ref> roots, seeds;    // Backward: the tensors and gradients backward() was given
    bool retain_graph = false;
    std::vector<GradPre> grad_pre;    // Backward: each parameter's .grad as backward() began
    std::vector<std::pair<std::uint32_t, Ref>> grads_after;  // Backward: external → its .grad as backward() returned
  };
  std::vector<Mark> marks;
  std::uint32_t num_slots = 0;
  // Per slot: the sizes the op that made it gave it when recorded (a sync-point call checks
  // them: an op whose output size depends on data, nonzero or a boolean mask, takes the call
  // off the plan when it differs).
  std::vector<std::vector<std::int64_t>> slot_sizes;
  // Per slot: its strides as recorded, where its sizes at the end of the call were still those
  // of its op (else empty): what a plan bound to new sizes checks on its first run (Note
  // [Bound sizes], Replay.cpp).
  std::vector<std::vector<std::int64_t>> slot_strides;
  std::vector<ArgMeta> arg_meta;
  std::string tail_sig;  // externals' metadata, views, outputs, grad bindings, arguments
  ContentHash hash;
};

// Note [Bound sizes] (Replay.cpp): a plan bound to new sizes shares the form of the plan it was
// bound from and holds only what differs at its sizes: integer arguments (by op), the views'
// geometry, the results' sizes and strides (checked on the first run) and the arguments'
// metadata.
struct BindTemplate;  // Replay.cpp: what binding a plan's sizes needs, found once per plan
struct SizeBinding {
  std::vector<std::int32_t> op_first;                        // per op: first index into args, or -1
  std::vector<std::pair<std::uint64_t, c10::IValue>> args;   // ((op << 32) | arg, value), by position
  std::vector<ViewSpec> views;                               // every view of the form, at these sizes
  std::vector<ArgMeta> arg_meta;
  // The results' sizes and strides, evaluated when checked: each of the template's value pairs
  // at these sizes (nullopt: no single integer), and the template that says which slots differ
  // and how.
  std::vector<std::optional<std::int64_t>> values;
  std::shared_ptr<const BindTemplate> from;
};

struct Patch {
  std::uint32_t op = 0, arg = 0;  // a constant argument...
  std::int64_t ext = -1;          // ...or a Python number (wrapped tensor) external
  std::uint32_t source = 0;
};

// Note [Exec replay]: a whole-step plan may run its ops through the exec stage instead of
// run_range: the same captured call, recorded into the trace as well, planned through Forge
// (trace -> IR001 -> front end -> IR002 -> ExecutionPlan) and run by an exec::Runner on a backend
// (null: every kernel an ATen call through the ATen provider; cpu: Mimic's generated kernels
// beside them). What the form knows stays the form's: the run's guard, the patch points'
// values, the externals and arguments (bound by storage), the outputs and the .grad fields,
// taken from the slots `run` fills. Implemented in ExecReplay.cpp (the _crucible_exec module,
// which links LLVM); attached to a plan by crucible.compile(step, backend=..., numerics=...).
// A plan is shared between compiled steps over the same tensors only when they name the same
// backend and numerics (plan_build's `runs_on`): one step's exec stage never replaces another's.
struct ExecReplay {
  virtual ~ExecReplay() = default;
  // Runs the step: reads the externals `exts` and the arguments `args` in place, writes the
  // persistent ones in place, and sets each slot an output or a .grad reads (directly or
  // through a view) to a tensor on memory of its own. `scalars`: the sources' values (patch
  // points). Throws c10::Error on failure, before anything ran when a binding does not fit.
  virtual void run(const Form& f, const std::vector<at::Tensor>& exts, std::vector<at::Tensor>& slots,
                   at::TensorList args, at::ArrayRef<double> scalars) = 0;
  // "null" or "cpu", and what the plan holds: kernels, calls, generated calls, cache.
  virtual std::string backend() const = 0;
  virtual std::string numerics() const = 0;  // "bitwise" or "fast" (Note [Fast numerics])
  virtual std::string summary() const = 0;
  // Kernels and calls of the exec plan, and the calls generated code runs.
  virtual std::size_t kernels() const = 0;
  virtual std::size_t calls() const = 0;
  virtual std::size_t generated_calls() const = 0;
  // The generated calls' operators, "aten::var.correction", one entry per call.
  virtual std::vector<std::string> generated_ops() const = 0;
  // Note [One arena] (ReplayArena.h): the Runner's arena and its slots' calls, for the replay
  // arena to plan into (its `keep` left for the caller to set); and a fresh arena for the runs to
  // come when memory placed in the old one outlived a run (throws when none can be had).
  virtual ExecArena arena_view() const = 0;
  virtual void renew_arena() = 0;
};

// A plan's exec stage is replaced or dropped: an arena planned around the old one's memory
// (Note [One arena]) is planned again on the next run. Ready means the last run left no arena
// block alive, so its memory can go.
struct Plan;
void exec_changed(Plan& p);

struct Plan {
  std::shared_ptr<const Form> form;
  std::shared_ptr<ExecReplay> exec;        // Note [Exec replay]; null: run_range
  std::string exec_note;                   // why a plan asked to run through the exec stage does not
  std::vector<Patch> patches;              // scalar patch points, fed from sources each run
  std::vector<std::int32_t> op_patch;      // per op: first index into patches, or -1
  std::vector<ScalarSource> build_sources; // the sources' values during the call the form is of
  std::vector<at::Tensor> run_exts;        // externals as runs see them (see value_of)
  // The persistent tensors as the plan expects them before a run (snapshot_exts): a tensor
  // whose storage, offset, sizes, dtype or requires_grad changed in place (p.data = ...,
  // requires_grad_(False) to freeze it) fails the run's guard.
  struct ExtSnap {
    const c10::StorageImpl* storage;
    std::int64_t offset;
    std::vector<std::int64_t> sizes;
    c10::ScalarType dtype;
    bool requires_grad;
  };
  std::vector<ExtSnap> ext_snap;
  ContentHash key;                         // content address: form hash with patch points masked
  std::vector<at::Tensor> slots;
  std::atomic<bool> busy{false};
  std::atomic<std::uint64_t> runs{0};
  double build_ms = 0;
  std::vector<std::uint32_t> constants;  // externals made afresh each call with equal values
  // (gradient external, parameter external): bound from the parameter's .grad before each run
  // (Note [Gradient bindings], Replay.cpp).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> grad_binds;
  std::vector<at::Tensor> grad_idle;       // per grad_binds: its metadata over no memory, between runs
  // The recorded form itself (its gradients' memory), kept until the first run: the exec
  // stage plans from the storages the trace names.
  std::shared_ptr<const Form> recorded;
  std::vector<std::uint32_t> grad_alias;   // per grad_binds: the first binding recorded on its storage
  absl::flat_hash_set<const c10::StorageImpl*> persistent;  // the storages ext_snap pins
  int refs = 1;                          // plan_build calls that returned this plan (registry mutex)
  // Note [Bound sizes] (Replay.cpp): a plan bound to new sizes without a recorded call checks
  // every result's sizes and strides against its form until one run has passed.
  bool check_sizes = false;
  // A recorded form at other sizes that this plan's form repeats op for op (Note [Size
  // families]): what plan_bind_sizes binds new sizes from, beside the plan's own form.
  std::shared_ptr<const Form> sibling;
  std::shared_ptr<const BindTemplate> bind_template;  // made on the first binding from this plan
  std::shared_ptr<const SizeBinding> bound;           // this plan's sizes where not its form's
  // The static arena (ReplayArena.h): planned from the first run's allocations.
  enum class Arena : std::uint8_t { Unplanned, Ready, Off } arena_state = Arena::Unplanned;
  ArenaPlan arena;
  std::string arena_note;  // why the arena is off
  std::uint64_t arena_runs = 0, arena_mismatches = 0;
  // Sync-point execution (Note [Sync-point execution], Sync.cpp): what a call may differ in
  // from the plan, and which marked stretches run natively.
  bool sync = false;
  absl::flat_hash_set<std::uint64_t> live_args;  // (op << 32 | arg): a scalar Python computes anew each call
  std::vector<std::uint8_t> live_ext;            // per external: taken from the call, whatever its value
  std::vector<std::int32_t> slot_producer;       // per slot: the op that makes it
  std::vector<std::vector<std::uint32_t>> sync_release;  // per op: slots whose last use it is, value reads counted
  struct Segment {
    bool native = false;
    std::string why;  // when not native: the reason, for stats()
    // An optimizer step whose results nothing after it reads from the plan's slots: it may be
    // run by other means (its own whole-step plan, Note [Optimizer plans] in Sync.cpp).
    bool external = false;
  };
  std::vector<Segment> segments;  // one per form mark
};

// Holds a plan's busy flag: what a run holds, so reading or changing a plan (info, checks,
// updates) never overlaps a run on another thread. Waits for a running plan to finish.
class BusyLock {
 public:
  explicit BusyLock(Plan& p) : p_(p) {
    bool idle = false;
    while (!p_.busy.compare_exchange_weak(idle, true)) {
      idle = false;
      std::this_thread::yield();
    }
  }
  ~BusyLock() { p_.busy.store(false); }
  BusyLock(const BusyLock&) = delete;
  BusyLock& operator=(const BusyLock&) = delete;

 private:
  Plan& p_;
};

std::string op_name(const c10::OperatorHandle& op);
// Whether an op of this name may draw from a random generator (rand*, bernoulli, dropout,
// normal, ...): it must run (a plan never drops it) and Python may see its draws.
bool may_draw_random(std::string_view name);
std::string arg_name(const OpT& o, std::size_t i);
std::string describe_op(const OpT& o, std::size_t k);
std::string dims(c10::IntArrayRef v);
void const_text(const c10::IValue& v, std::string& out);
std::shared_ptr<Plan> get_plan(std::int64_t id);
std::shared_ptr<const Form> get_form(std::int64_t id);
std::string ref_text(Ref r);
// Note [Size families] (Replay.cpp): per argument dimension that differs between two calls, its
// value in either. size_symbols fills them ("" or why the calls are not one family);
// size_explained says whether two integers of the calls are one size of them.
using SizeSymbols = std::vector<std::pair<std::int64_t, std::int64_t>>;
std::string size_symbols(const Form& a, const Form& b, SizeSymbols& out);
bool size_explained(std::int64_t x, std::int64_t y, const SizeSymbols& syms);
// Note [Bound sizes]: the value at the symbols' values `c` of an integer that was x and y at
// their two recorded values (every fit that explains it agreeing), else nullopt.
std::optional<std::int64_t> size_at_sizes(std::int64_t x, std::int64_t y, const SizeSymbols& syms,
                                          const std::vector<std::int64_t>& c);
// Does form b repeat form a (Replay.cpp)? "" when it does, else the first difference, for a
// user. A scalar that differs and is fed by a source becomes a patch (into `patches`); with
// live_args/live_exts (a sync-point plan) one with no source is taken from each call instead.
// sizes: b is a call at other sizes (Note [Size families]): integer arguments the symbols
// explain may differ, and tensors are compared by rank, not sizes.
// a_exts: the tensors to compare b's externals with (default a.exts); rebind: accept (and list)
// persistent tensors that are other objects with the same metadata.
std::string compare_forms(const Form& a, const Form& b, const std::vector<ScalarSource>* sa,
                          const std::vector<ScalarSource>* sb, std::vector<Patch>* patches,
                          const std::vector<at::Tensor>* a_exts = nullptr,
                          std::vector<std::uint32_t>* rebind = nullptr,
                          std::vector<std::uint64_t>* live_args = nullptr,
                          std::vector<std::uint32_t>* live_exts = nullptr,
                          const SizeSymbols* sizes = nullptr);
// Note [Size families]: a call b at new sizes against a plan (Replay.cpp): throws with the first
// difference unless b repeats the plan (whole-step, or sync-point when `sync`) at its own sizes.
// Else: the plan's form, the persistent tensors its runs use, and b's patch points (the plan's
// and those found) and, for a sync-point plan, what b's Python makes anew (the plan's and found).
struct Like {
  std::shared_ptr<const Form> a;
  std::vector<at::Tensor> exts;
  std::vector<Patch> patches;
  std::vector<std::uint64_t> live_args;
  std::vector<std::uint32_t> live_exts;
};
Like compare_like(std::int64_t plan, const Form& b, const std::vector<ScalarSource>& sources, bool sync);
// The content address of a form with its patch points masked.
ContentHash plan_key(const Form& f, const std::vector<Patch>& patches);
// The two forms of a plan build (their scalar sources must agree in number).
std::pair<std::shared_ptr<const Form>, std::shared_ptr<const Form>> forms_of(
    std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
    const std::vector<ScalarSource>& sources_b);
// A plan of form b (a: the other recorded call, for the constants made afresh each call;
// a_exts: the tensors to compare b's externals with, default a.exts; bind_grads: Note
// [Gradient bindings], Replay.cpp).
std::shared_ptr<Plan> new_plan(const Form& a, std::shared_ptr<const Form> b, std::vector<Patch> patches,
                               const ContentHash& key, const std::vector<ScalarSource>& sources_b,
                               const std::vector<at::Tensor>* a_exts = nullptr, bool bind_grads = true);
// Puts a built plan in the registry (its build time from t0); returns its id.
std::int64_t register_plan(std::shared_ptr<Plan> p, std::chrono::steady_clock::time_point t0);
// A plan tensor's value: `exts` are the externals a run uses, `slots` its intermediates.
// views: the views' geometry when not the form's (a bound plan's, Note [Bound sizes]).
at::Tensor value_of(const Form& f, const std::vector<at::Tensor>& exts, const std::vector<at::Tensor>& slots,
                    at::TensorList args, Ref r, const std::vector<ViewSpec>* views = nullptr);
// Runs ops [begin, end) of the plan's form on `slots` (results stored, dead slots released),
// with the sources' values for this run in `scalars` (patch points). The caller holds the
// dispatch state a run needs (key excluded, below ADInplaceOrView).
void run_range(const Plan& p, std::size_t begin, std::size_t end, const std::vector<at::Tensor>& exts,
               std::vector<at::Tensor>& slots, at::TensorList args, at::ArrayRef<double> scalars);

// Note [Warnings of a plan run] (Replay.cpp): f() run with the calling thread's warnings
// collected, then handed over (hand_over_warnings) after it, or before its error when it throws.
class CollectWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { got.push_back(w); }
  std::vector<c10::Warning> got;
};
void hand_over_warnings(std::vector<c10::Warning>& got, bool run_failed);
template <class F>
auto with_run_warnings(F&& f) -> decltype(f()) {
  CollectWarnings collect;
  std::optional<decltype(f())> out;
  {
    std::optional<c10::WarningUtils::WarningHandlerGuard> collecting(std::in_place, &collect);
    try {
      out.emplace(f());
    } catch (...) {
      collecting.reset();
      hand_over_warnings(collect.got, true);
      throw;
    }
  }
  hand_over_warnings(collect.got, false);
  return std::move(*out);
}

}  // namespace crucible::vessel::replay

namespace crucible::vessel {
// Note [Bound sizes] (Replay.cpp): a whole-step plan for the sizes of `args` without a
// recorded call, from a plan with a sibling (a recorded form at other sizes it repeats, Note
// [Size families]): the plan's form with every integer the argument sizes explain evaluated at
// these sizes. Throws std::runtime_error with the reason when they cannot be bound.
std::int64_t plan_bind_sizes(std::int64_t plan, at::TensorList args, c10::IntArrayRef sibling_sizes);
}  // namespace crucible::vessel
