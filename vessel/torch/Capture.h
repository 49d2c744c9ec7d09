// Capture.h — internal to libcrucible_dispatch.so: the per-thread recording state and the
// capture helpers shared by the boxed fallback (Dispatch.cpp) and the unboxed recording
// kernels of hot ops (Unboxed.cpp). Both must write byte-identical records for the same op.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "AllocationTags.h"
#include "absl/container/flat_hash_map.h"
#include "crucible/core/ScalarType.h"
#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"

namespace crucible::vessel::replay {
struct SyncRun;  // Sync.cpp
}

namespace crucible::vessel::detail {

using record::OpBuilder;
using record::Phase;

#if defined(CRUCIBLE_HAS_CRUCIBLE_KEY)
inline constexpr c10::DispatchKey kKey = c10::DispatchKey::Crucible;
inline constexpr const char* kKeyName = "Crucible";
#else
inline constexpr c10::DispatchKey kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
inline constexpr const char* kKeyName = "TESTING_ONLY_GenericMode";
#endif

// Note [Ablation build]: where the recording's added time goes, measured by switching parts of
// the typed kernels' work off (bench/vessel_ablation.sh). Only a build configured with
// -DCRUCIBLE_VESSEL_ABLATION=ON has the switches; install() reads CRUCIBLE_VESSEL_ABLATE there
// (and refuses it in any other build). The rungs, from the least work up:
//   KernelOnly: the typed kernel's own prologue (thread state, capture check, site); no frame
//   EnterOnly:  + the op entered (frame, phase, flags); nothing captured or committed
//   EntryOnly:  + the op's entry committed, with no tensor or scalar captured (no cells)
//   NoRing:     + every tensor and scalar captured into the op's builder instead (EnterOnly's
//               work and the capture); nothing committed, so the drain gets nothing
// and None, the full recording: NoRing's work and the commit. The switches are in the typed
// kernels only: the boxed fallback records in full at every rung (the benchmark checks that no
// op of its step is recorded at the rungs that commit nothing, so none reached the fallback).
// Every source that reads the switch is one of libcrucible_dispatch's, which alone get the
// definition (vessel/torch/CMakeLists.txt). In every other build the switch is a constant and
// compiles away.
enum class Ablation : std::uint8_t { None, NoRing, EntryOnly, EnterOnly, KernelOnly };
#if defined(CRUCIBLE_VESSEL_ABLATION) && CRUCIBLE_VESSEL_ABLATION
inline constexpr bool kHasAblationSwitches = true;
extern Ablation g_ablation;  // set once by install(), before any kernel is registered
#else
inline constexpr bool kHasAblationSwitches = false;
inline constexpr Ablation g_ablation = Ablation::None;
#endif
// Each rung's name, as CRUCIBLE_VESSEL_ABLATE and the benchmark spell it.
inline constexpr std::pair<const char*, Ablation> kAblationRungs[] = {
    {"full", Ablation::None},           {"no_ring", Ablation::NoRing},
    {"entry_only", Ablation::EntryOnly}, {"enter_only", Ablation::EnterOnly},
    {"kernel_only", Ablation::KernelOnly}};

// The keys after ours: where a kernel of ours (typed or the fallback) redispatches to.
inline c10::DispatchKeySet after_key(c10::DispatchKeySet ks) {
  return ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
}

// ---------------------------------------------------------------------------------------
// Storage identity. Note [Storage ids]: a storage whose memory carries a tag (Note [Allocation
// tags], AllocationTags.h) is named by it; this table names the rest. The caching allocator
// reuses addresses, and so does malloc for StorageImpl objects. The global table holds a weak
// reference to every StorageImpl it has named: that keeps the object (not its data) allocated,
// so while the entry exists no other storage can have that address and pointer equality means
// identity. New StorageImpls get fresh 64-bit ids. Every 256 new storages the table drops the
// entries of those 256 whose storage already died (most are a step's temporaries; their
// StorageImpls are still in cache, and freeing them soon lets malloc hand the memory straight
// back), and when the survivors have doubled it sweeps the whole table. Once an entry is
// dropped its address may be reused and gets a new id, so a sweep that drops anything bumps an
// epoch; each thread's direct-mapped cache (no references of its own) is emptied when it sees
// the epoch change. (Sweeping the whole table per batch would read every entry's refcount cold
// and hold dead objects back from malloc longer.)
class StorageIds {
 public:
  std::uint64_t id(const c10::Storage& s) {
    c10::StorageImpl* p = s.unsafeGetStorageImpl();
    if (p == nullptr) return 0;
    // CPU memory allocated while recording carries its id (Note [Allocation tags]). PyTorch 2.x
    // may refuse access to a storage's DataPtr (CUDA graph trees): then it has no tag.
    if (p->device_type() == c10::DeviceType::CPU) {
      std::uint64_t tag = 0;
      try {
        tag = tag_of(static_cast<const c10::StorageImpl*>(p)->data_ptr());
      } catch (const c10::Error&) {
      }
      if (tag != 0) return tag;
    }
    return table_id(s, p);
  }

 private:
  // Out of line: every recorded tensor inlines id(), and while recording most take the tag.
  [[gnu::noinline]] std::uint64_t table_id(const c10::Storage& s, c10::StorageImpl* p) {
    const std::uint64_t epoch = g_epoch.load(std::memory_order_acquire);
    if (epoch != epoch_) {  // addresses may have been reused since: forget every slot
      for (Slot& sl : cache_) sl = Slot{};
      epoch_ = epoch;
    }
    Slot& slot = cache_[(reinterpret_cast<std::uintptr_t>(p) >> 4) & (kCacheSize - 1)];
    if (slot.key == p) return slot.id;
    std::uint64_t seen = 0;
    const std::uint64_t id = global_id(s, p, &seen);
    if (seen == epoch_) {  // else the entry may be stale by the time the next lookup runs
      slot.key = p;
      slot.id = id;
    }
    return id;
  }

  // 512 slots of 16 bytes: 8 KiB, small enough to stay in cache between ops (a miss on the slot
  // was a third of add_tensor with 1024 slots of 24 bytes).
  static constexpr std::size_t kCacheSize = 512;
  struct Slot {
    c10::StorageImpl* key = nullptr;
    std::uint64_t id = 0;
  };
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;
    std::uint64_t id;
  };
  struct Global {
    std::mutex mu;
    absl::flat_hash_map<c10::StorageImpl*, Entry> map;
    std::vector<c10::StorageImpl*> young;  // inserted since the last young sweep
    std::size_t survivors_at_full_sweep = 0;  // map size after the last full sweep
  };
  static constexpr std::size_t kYoung = 256;
  static inline std::atomic<std::uint64_t> g_epoch{1};
  static Global& global() {
    static Global* g = new Global();  // leaked: threads may record during static destruction
    return *g;
  }
  static std::uint64_t global_id(const c10::Storage& s, c10::StorageImpl* p, std::uint64_t* epoch_out) {
    Global& g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    *epoch_out = g_epoch.load(std::memory_order_relaxed);  // stable: only changed under mu
    // One probe finds the storage or makes its entry: while an entry holds its weak reference
    // no other StorageImpl can have its address, so a hit is the same storage.
    bool inserted = false;
    const auto it = g.map.lazy_emplace(p, [&](const auto& construct) {
      inserted = true;
      construct(p, Entry{s.getWeakStorageImpl(), fresh_storage_id()});
    });
    const std::uint64_t id = it->second.id;
    if (!inserted) return id;
    if (g.young.size() >= kYoung) {  // the 256 before p; p joins the next batch
      // Dropped entries keep their weak references (so their StorageImpls stay allocated and
      // their addresses taken) until the epoch has moved on: a thread that then meets a new
      // storage at one of those addresses is sure to see the new epoch and empty its cache.
      std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> dropped;
      for (c10::StorageImpl* y : g.young) {
        auto yt = g.map.find(y);
        if (yt != g.map.end() && yt->second.weak.expired()) {
          dropped.push_back(std::move(yt->second.weak));
          g.map.erase(yt);
        }
      }
      g.young.clear();
      if (g.map.size() > 2 * g.survivors_at_full_sweep + kYoung) {
        for (auto jt = g.map.begin(); jt != g.map.end();) {
          if (jt->second.weak.expired()) {
            dropped.push_back(std::move(jt->second.weak));
            g.map.erase(jt++);
          } else {
            ++jt;
          }
        }
        g.survivors_at_full_sweep = g.map.size();
      }
      if (!dropped.empty()) *epoch_out = g_epoch.fetch_add(1, std::memory_order_acq_rel) + 1;
      dropped.clear();  // releases their references, after the bump
    }
    g.young.push_back(p);
    return id;
  }
  std::uint64_t epoch_ = 0;  // the epoch every filled slot belongs to (first: beside ThreadState's hot fields)
  Slot cache_[kCacheSize];
};

// ---------------------------------------------------------------------------------------
// What crucible.compile captures of one recorded op (Replay.cpp): the operator, its real
// arguments and results (references, not copies of data), grad mode and phase. Only ops
// that are recorded (the one op level) are captured, in the order they complete.
struct CapturedOp {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<c10::IValue> rets;
  bool grad_mode;
  Phase phase;
  // The sizes of each tensor result (list elements in order) as the op returned it: an op
  // later in the call may change a result's shape in place (transpose_, resize_), and the
  // capture holds the tensor, not a copy.
  std::vector<std::vector<std::int64_t>> ret_sizes;
};
// Where the step called backward() or an optimizer's step() during a captured call
// (Form::Mark, ReplayPlan.h): ops [begin, end) ran inside it.
struct CaptureMark {
  std::uint8_t kind = 0;  // Form::Mark::Kind
  std::int64_t tag = 0;
  std::uint32_t begin = 0, end = 0;
  bool open = true;
  bool retain_graph = false;
  std::vector<at::Tensor> roots, seeds;
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> grads;  // Backward: each parameter's .grad as it began
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> grads_after;  // ... and as it ended
};
struct Capture {
  std::vector<CapturedOp> ops;
  std::vector<CaptureMark> marks;
  // Set during sync-point execution: each op is matched against the plan (sync_match)
  // instead of being kept.
  replay::SyncRun* sync = nullptr;
  // The value of each tensor torch.tensor(data) (or any lift_fresh) made during the call, as
  // it was lifted: data Python copied in below the dispatcher, which no op rebuilds. The op is
  // captured as copy_(tensor, value) (Note [Lifted constants], Replay.cpp).
  std::vector<at::Tensor> lifted;
  bool capture_only = true;  // true: the ops are not also written to the trace rings
};

struct Frame {
  OpBuilder b;
  bool had_child = false;
  bool composite_implicit = false;
  Phase phase = Phase::Forward;  // set by enter_recorded
  std::uint8_t flags = 0;
  std::vector<c10::IValue> cap_args;  // the op's arguments while a Capture is active
};

struct ThreadState {
  int depth = 0;
  bool outer_below_autograd = false;  // ADInplaceOrView already excluded at the outermost op
  std::vector<std::unique_ptr<Frame>> frames;  // one per nesting depth (stable references)
  std::vector<bool> rf_is_optimizer;  // record_function scopes: is it Optimizer.*?
  int optimizer_depth = 0;
  std::vector<std::uint32_t> modules{0};
  record::ThreadLog* log = nullptr;  // with the recorder it belongs to (set on the first commit)
  record::Recorder* rec = nullptr;
  Capture* capture = nullptr;  // set while crucible.compile captures a call on this thread
  bool counts_as_recording = false;  // counted in tagging_acquire (set_enabled)
  // Note [Thread-locals reached once]: PyTorch's thread-local state that every recorded op reads
  // (the dispatch key sets, grad and inference mode) lives in libc10, and reaching another
  // library's thread-local from this one is a call to __tls_get_addr (or a call into libc10
  // that makes it) per access. Its address is fixed for the thread's life, so the state is
  // reached once here, on the thread that owns it (ThreadState is made on first use by it).
#if !(defined(_MSC_VER) || defined(C10_ANDROID) || defined(C10_IPHONE))
  c10::impl::PODLocalDispatchKeySet* const key_tls = &c10::impl::raw_local_dispatch_key_set;
#endif
  const c10::AutogradState* const autograd_tls = &c10::AutogradState::get_tls_state();
  StorageIds storage_ids;      // last: 8 KiB, after the fields every op reads (fewer lines)
  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  ~ThreadState() {
    if (counts_as_recording) tagging_release();  // a thread that exits while recording
  }
};

// The calling thread's state. A pointer, constant-initialised, so that reaching it is one
// __tls_get_addr call: a thread_local object with a constructor is reached through a wrapper
// that also calls the library's TLS init function (two more calls and their code lines per op).
// The state is allocated on the thread's first use and freed when the thread exits (a state first
// used after the thread's thread-local destructors ran, e.g. during static destruction, is leaked).
extern constinit thread_local ThreadState* t_state_ptr;
ThreadState& make_thread_state();  // first use on this thread
inline ThreadState& thread_state() {
  ThreadState* p = t_state_ptr;
  return p != nullptr ? *p : make_thread_state();
}
Phase current_phase(ThreadState& ts);
DeviceKind device_kind_lookup(c10::DeviceType t);  // any type: the table, then by name
// CPU, the type nearly every recorded tensor has, without a call.
inline DeviceKind device_kind_of(c10::DeviceType t) {
  return t == c10::DeviceType::CPU ? DeviceKind::CPU : device_kind_lookup(t);
}
void add_tensor(ThreadState& ts, OpBuilder& b, const at::Tensor& t, std::uint16_t arg,
                std::uint32_t list_index, bool output);

// Note [Key exclusion inline]: c10::impl::ExcludeDispatchKeyGuard, for our one key, without
// its two out-of-line calls into libc10 (each reaching the thread's dispatch key set through
// __tls_get_addr again): one TLS lookup, kept for the destructor and for reads while the guard
// holds. The same semantics: it adds the key only if it was not excluded already, and takes off
// only what it added. Where PyTorch hides the thread-local (MSVC, mobile), c10's guard.
#if defined(_MSC_VER) || defined(C10_ANDROID) || defined(C10_IPHONE)
class KeyExcluded {
 public:
  KeyExcluded() = default;
  explicit KeyExcluded(ThreadState&) {}
  bool below_autograd() const {
    return c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::ADInplaceOrView);
  }

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_{kKey};
};
#else
class KeyExcluded {
 public:
  [[gnu::always_inline]] KeyExcluded() : KeyExcluded(&c10::impl::raw_local_dispatch_key_set) {}
  // The same with the calling thread's key sets as its state holds them (Note [Thread-locals
  // reached once]).
  [[gnu::always_inline]] explicit KeyExcluded(ThreadState& ts) : KeyExcluded(ts.key_tls) {}
  [[gnu::always_inline]] explicit KeyExcluded(c10::impl::PODLocalDispatchKeySet* tls) : tls_(tls) {
    const c10::DispatchKeySet ex = tls_->excluded();
    added_ = !ex.has(kKey);
    if (added_) tls_->set_excluded(ex.add(kKey));
  }
  [[gnu::always_inline]] ~KeyExcluded() {
    if (added_) tls_->set_excluded(tls_->excluded().remove(kKey));
  }
  KeyExcluded(const KeyExcluded&) = delete;
  KeyExcluded& operator=(const KeyExcluded&) = delete;
  // Whether the op runs below Autograd (ADInplaceOrView excluded), as enter_op asks.
  bool below_autograd() const { return tls_->excluded().has(c10::DispatchKey::ADInplaceOrView); }

 private:
  c10::impl::PODLocalDispatchKeySet* tls_;
  bool added_;
};
#endif

// Note [Saved originals]: autograd's kernel of an in-place op whose derivative needs the input
// as it was (silu_, mul_ by a tensor that requires grad, ...) copies that input with clone()
// before it runs the op below Autograd, and the backward op later reads the copy. The copy is
// made at the autograd level, so it is part of the step at the one op level: an in-place op that
// runs with grad mode on and above Autograd keeps the key on for its nested calls, and a clone
// that arrives still above Autograd under a parent with no CompositeImplicitAutograd kernel is
// recorded as an op of its own, before its parent (which is recorded too). Every other nested
// call there is the parent's own work (a foreach op's per-tensor loop arrives above Autograd
// too) and passes through unrecorded, as what arrives below Autograd always does. Without this, each such copy is an input of a backward
// op that no recorded op produced (EfficientNet-B0, in-place SiLU: 49 per step).
// Whether ADInplaceOrView is excluded on this thread now: the op runs below Autograd.
inline bool ts_below_autograd(const ThreadState& ts) {
#if defined(_MSC_VER) || defined(C10_ANDROID) || defined(C10_IPHONE)
  (void)ts;
  return c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::ADInplaceOrView);
#else
  return ts.key_tls->excluded().has(c10::DispatchKey::ADInplaceOrView);
#endif
}
constexpr bool in_place_name(std::string_view qualified_name) {
  return !qualified_name.empty() && qualified_name.back() == '_';
}
inline bool keeps_key_for_saved_originals(const ThreadState& ts, bool below_autograd) {
  return !below_autograd && ts.autograd_tls->get_grad_mode();
}

// Entering an op at the current depth: false if it is a kernel internal (the caller passes it
// through unrecorded), else marks the parent as decomposed and returns the op's frame, reset.
// See Note [One op level] in misc/CRUCIBLE.md. below_autograd: whether ADInplaceOrView is
// excluded on this thread now (the overload without it reads that itself).
// is_clone: the op is aten::clone, the one call recorded under a parent that is not a composite
// (Note [Saved originals]).
Frame* enter_op(ThreadState& ts, bool composite_implicit, bool below_autograd, bool is_clone = false);
Frame* enter_op(ThreadState& ts, bool composite_implicit);
// enter_op for an op that is not CompositeImplicitAutograd, with the frame's phase and op
// flags set: one call from each unboxed kernel instead of three.
Frame* enter_recorded(ThreadState& ts, bool is_mutable, bool below_autograd, bool is_clone = false);
// Matches a recorded op against the plan of a sync-point call (Sync.cpp).
void sync_match(replay::SyncRun& run, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                const std::vector<c10::IValue>& rets, Phase phase);
// Appends a recorded op to the thread's active capture (call only when ts.capture is set).
void capture_op(ThreadState& ts, const c10::OperatorHandle& op, std::vector<c10::IValue> args,
                std::vector<c10::IValue> rets, Phase phase);
// Commits the op in `f` (inputs and outputs added) to the global recorder.
void commit_op(ThreadState& ts, Frame& f, std::uint64_t schema_hash, std::uint16_t n_args,
               Phase phase, std::uint8_t flags);

}  // namespace crucible::vessel::detail
