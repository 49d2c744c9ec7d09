// Recorder.h — per-thread recording rings and the drain thread that empties them into a Trace.
//
// Threads: any number of recording threads (producers) and one drain thread per Recorder.
// Each producer thread owns its own ThreadLog — three SpscRings (TraceRing of TraceEntry,
// MetaLog of 64-byte cells, ScalarLog of 16-byte records) — so two threads never share a ring
// and the foreground takes no lock. The drain thread is the single consumer of every ring.
//
// Ordering: a producer pushes an op's meta cells and scalars before its TraceEntry, each with a
// release store; the drain reads the entry with an acquire load, so everything the op wrote is
// visible when its entry is. Ops of one thread stay in program order (TraceEntry::seq).
//
// Full rings: by default the producer waits for the drain (back-pressure, counted in
// ThreadStats::waits). With drop_when_full the op is not written, ThreadStats::dropped counts
// it and the thread's next recorded op carries op_flag::kAfterDrop: never a silent loss.
//
// The drain empties every ring, then sleeps 1 ms (up to 16 ms when idle) rather than
// spinning: see Note [Drain pacing] in Recorder.cpp. A full ring, flush() and destruction wake
// it at once; flush() returns only when every op committed before the call is in the Trace.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/SpscRing.h"
#include "crucible/core/Status.h"
#include "crucible/record/Trace.h"
#include "crucible/record/TraceRecord.h"
#include "crucible/record/WiringLog.h"

namespace crucible::record {

namespace detail {
// A producer-owned counter that other threads only read: a plain add, no locked instruction.
inline void bump_owned(std::atomic<std::uint64_t>& c, std::uint64_t by) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}
}  // namespace detail

struct RecorderConfig {
  std::uint32_t ring_entries = 1u << 16;  // TraceEntry slots per thread (4 MiB)
  std::uint32_t meta_cells = 1u << 17;    // MetaLog cells per thread (8 MiB)
  std::uint32_t scalar_slots = 1u << 16;  // ScalarLog slots per thread (1 MiB)
  bool drop_when_full = false;            // false: back-pressure; true: count and drop
};

class ThreadLog {
 public:
  ThreadLog(const RecorderConfig& cfg, std::uint32_t index);
  std::uint32_t index() const { return index_; }

 private:
  friend class Recorder;
  SpscRing<TraceEntry> entries_;
  SpscRing<MetaCell> metas_;
  SpscRing<ScalarRecord> scalars_;
  const std::uint32_t index_;
  // Written by the producer only; read by stats() from any thread (relaxed).
  std::atomic<std::uint64_t> committed_{0};  // ops pushed (== next seq)
  std::atomic<std::uint64_t> ops_[kNumPhases] = {};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> waits_{0};
  bool after_drop_ = false;
  std::int8_t drop_mode_ = -1;  // producer only: -1 the recorder's mode, 0 back-pressure, 1 drop
  // Back-pressure parking: a producer facing a full ring sets waiting_ and sleeps on bell_
  // (a futex) until the drain has moved something out of this log; the drain bumps bell_ and
  // wakes it when it sees waiting_. seq_cst on both sides (store/fence, then load): either the
  // drain sees waiting_ or the producer's wait sees the new bell value, so no wake-up is lost.
  // Parking, not yielding: a producer spinning on sched_yield kept one of two cores busy that
  // the drain and the pipeline stages needed.
  std::atomic<bool> waiting_{false};
  std::atomic<std::uint32_t> bell_{0};
  // Written by the drain only.
  std::atomic<std::uint64_t> drained_{0};
  std::uint64_t drained_ops_[kNumPhases] = {};  // ops appended to the trace; read by the drain only
  std::vector<MetaCell> meta_stage_;      // cells popped ahead of their entry
  std::size_t meta_stage_head_ = 0;
  std::vector<ScalarRecord> scalar_stage_;
  std::size_t scalar_stage_head_ = 0;
};

// Receives what the drain thread appends, in the drain thread, in order. The pipeline stage
// implements it to feed iteration detection. on_ops comes with the trace locked: read it, do
// not keep references into it, and do not block (hand work on in on_unlocked, which follows
// every on_ops once the lock is released: a sink that blocked under the lock could wait on a
// stage that waits for the lock). on_barrier and on_clear come without the lock.
class DrainSink {
 public:
  virtual ~DrainSink() = default;
  // Ops [first, first + count) were appended to `t`; all of them belong to recording thread
  // `thread` (one call per thread per drain pass). `generation` counts the clear()s before
  // them: indices name these ops only while it is current (see CopyRequest).
  virtual void on_ops(const Trace& t, std::uint64_t generation, std::uint32_t thread, std::size_t first,
                      std::size_t count) = 0;
  virtual void on_unlocked() {}
  // Every op committed before flush_token(token) was called has been passed to on_ops.
  virtual void on_barrier(std::uint64_t token) = 0;
  // clear() dropped every op: indices restart at 0.
  virtual void on_clear() = 0;
};

class Recorder {
 public:
  // Validates the config (power-of-two ring sizes, room for the largest op the rings can hold,
  // at most ring_memory_limit() bytes of rings per recording thread).
  static Result<std::unique_ptr<Recorder>> create(const RecorderConfig& cfg = {});
  // Most bytes of rings one recording thread may have: an eighth of the machine's memory.
  static std::uint64_t ring_memory_limit();
  // The process-wide recorder the PyTorch Vessel writes to (created on first use).
  static Recorder& global();

  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  const RecorderConfig& config() const { return cfg_; }

  // The calling thread's log, created on its first call. Safe from any thread.
  ThreadLog& thread_log();

  // Producer: write one op. `cells` are its TensorMeta + DimsCell cells, `scalars` its scalar
  // records. entry.seq and entry.thread are filled in here. Returns false only when the op
  // was dropped (drop mode and not enough free room); with back-pressure an op of any size
  // goes through, in pieces if it is larger than a ring.
  bool commit(ThreadLog& log, const TraceEntry& entry, std::span<const MetaCell> cells,
                      std::span<const ScalarRecord> scalars);

  // Name tables, shared by everything in the process that records into this recorder.
  std::uint64_t intern_schema(std::string_view qualified_name);  // returns hash64(name)
  // "" is 0. A path a .crtrace file cannot hold (record::check_module_path, TraceFile.h) is
  // refused with that error before anything is recorded under it.
  Result<std::uint32_t> intern_module(std::string_view path);
  std::uint32_t num_modules() const;  // module ids in use: 0 .. num_modules() - 1

  // Records why a storage is an input of the trace without being produced by a recorded op.
  void classify_external(std::uint64_t storage_id, ExternalKind kind);

  // Returns once every op committed (by any thread) before the call has been drained.
  void flush();
  // flush(), then has the drain thread call sink->on_barrier(token) (after every on_ops for
  // those ops). Without a sink it is flush().
  void flush_token(std::uint64_t token);
  // Attaches the sink (nullptr detaches). Call while no flush_token() is in progress.
  void set_sink(DrainSink* sink);
  // A copy of the given ops (trace indices) with their tensors, scalars, names, externals.
  Trace copy_ops(std::span<const std::size_t> ops);
  // structure_key (Trace.h) of the given ops, read in place: what copy_ops(ops) would give
  // record::structure_key(copy, all ops), without copying.
  ContentHash structure_key(std::span<const std::size_t> ops);
  // Key and copy under one hold of the trace lock, for a consumer of on_ops (the pipeline):
  // the structure key of the ops (when want_key), then their copy unless the key equals one of
  // `unless` (keys whose analysis the caller already has). With a generation, ops recorded before a later clear() are not there any more:
  // the answer is `stale`, with neither key nor copy (their indices name other ops now).
  static constexpr std::uint64_t kAnyGeneration = UINT64_MAX;
  struct CopyRequest {
    std::span<const std::size_t> ops;
    bool want_key = false;
    bool want_copy = true;
    std::span<const ContentHash> contents{};  // op_content of each op, if the caller has them
    std::span<const ContentHash> unless{};
    std::uint64_t generation = kAnyGeneration;
    // A trace whose memory the copy reuses (emptied first, then moved into KeyedCopy::copy
    // when a copy is made; left as it is otherwise): Note [Recycled copies] (Pipeline.cpp).
    Trace* recycle = nullptr;
  };
  struct KeyedCopy {
    bool stale = false;
    ContentHash key;
    ContentHash wiring_key;     // with the key: Note [Wiring key] (Trace.h)
    std::optional<Trace> copy;  // empty when stale, not wanted, or the key is one of `unless`
    // With the key: the ops' storage numbering (Trace.h), which also numbers the copy's
    // tensors (local ops 0, 1, ... in order), with the classification the key hashed.
    StorageNumbering numbering;
  };
  KeyedCopy key_and_copy(const CopyRequest& req);
  // Structure keys computed so far from the wiring log (one run of consecutive ops within
  // its window) and from the trace's own pass (any other op list): Note [Wiring log].
  std::uint64_t keys_from_log() const { return keys_from_log_.load(std::memory_order_relaxed); }
  std::uint64_t keys_from_trace() const { return keys_from_trace_.load(std::memory_order_relaxed); }
  // flush(), then a copy of the trace so far, with current names and per-thread stats.
  Trace snapshot();
  // flush(), then forget every drained op; stats restart from zero (names stay).
  void clear();
  std::vector<ThreadStats> thread_stats() const;

  // Switches between back-pressure (false, the default) and counting drops (true).
  void set_drop_when_full(bool on) { drop_when_full_.store(on, std::memory_order_relaxed); }
  bool drop_when_full() const { return drop_when_full_.load(std::memory_order_relaxed); }
  // The calling thread's own mode, which overrides the recorder's for its ops (the Python
  // controller's enable(drop_when_full=...) is per thread, as recording is).
  void set_thread_drop_when_full(bool on) { thread_log().drop_mode_ = on ? 1 : 0; }
  // The calling thread's mode; a thread with no log yet has the recorder's (asking makes none).
  bool thread_drop_when_full() const;
  // Sets the ring sizes global() will use; an error once global() exists.
  // apply false: only says whether it would be accepted (crucible.configure checks every
  // setting before applying any).
  static Status configure_global(const RecorderConfig& cfg, bool apply = true);

 private:
  explicit Recorder(const RecorderConfig& cfg);
  // commit when a ring lacks room: drop mode, or waiting for the drain (Note [Commit fast path]).
  [[gnu::noinline, gnu::cold]] bool commit_slow(ThreadLog& log, const TraceEntry& entry,
                                                std::span<const MetaCell> cells,
                                                std::span<const ScalarRecord> scalars);
  [[gnu::always_inline]] void publish_entry(ThreadLog& log, const TraceEntry& entry,
                                            std::size_t n_cells, std::size_t n_scalars);
  void drain_loop();
  bool drain_once();  // true if anything was moved
  bool drain_log(ThreadLog& log);
  void wake_drain();
  void deliver_tokens();  // drain thread: runs every queued Event
  std::vector<ThreadStats> raw_thread_stats() const;  // since creation

  const RecorderConfig cfg_;
  const std::uint64_t uid_;
  std::atomic<bool> drop_when_full_;

  mutable std::mutex logs_mu_;  // guards logs_ (registration is rare: once per thread)
  std::vector<std::shared_ptr<ThreadLog>> logs_;

  std::mutex names_mu_;
  std::unordered_map<std::uint64_t, std::string> schema_names_;
  std::unordered_map<std::string, std::uint32_t> module_ids_;
  std::vector<std::string> module_paths_{""};
  std::atomic<std::uint32_t> num_modules_{1};  // module_paths_.size(), read without names_mu_
  std::shared_ptr<const ModuleTree> module_tree_;  // scopes of module_paths_ when last asked
  const std::shared_ptr<const ModuleTree>& module_tree_locked();  // names_mu_ held
  absl::flat_hash_map<std::uint64_t, ExternalKind> externals_;

  mutable std::mutex trace_mu_;  // guards trace_ (drain appends, snapshot copies) and baseline_
  Trace trace_;
  std::atomic<std::uint64_t> keys_from_log_{0}, keys_from_trace_{0};
  WiringLog wiring_;                   // follows trace_, under trace_mu_ (Note [Wiring log])
  std::uint64_t generation_ = 0;       // clear()s of trace_ so far
  std::vector<ThreadStats> baseline_;  // counters at the last clear(), per thread index

  std::atomic<DrainSink*> sink_{nullptr};
  // Barriers and clears run on the drain thread, in order with the ops it drains.
  struct Event {
    bool clear = false;
    std::uint64_t token = 0;
  };
  void run_event(Event ev);  // queues it and waits until the drain thread has run it
  std::mutex token_mu_;
  std::vector<Event> pending_events_;  // guarded by token_mu_
  std::uint64_t events_queued_ = 0;    // guarded by token_mu_
  std::atomic<std::uint64_t> events_done_{0};

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false;
  std::atomic<bool> stop_{false};
  std::thread drain_;
};

// Note [Commit fast path]: commit runs once per recorded op, between stretches of PyTorch code
// that evict it from the instruction cache, so its cost is mostly the code lines it touches.
// The common case (room in all three rings) is a few straight-line copies, defined here so
// that it is compiled into the caller (the Vessel's commit_op): one function's code lines per
// op and no call through the PLT into another library. Full rings, the drop mode and
// back-pressure live in commit_slow, out of line. Inlining it took the Python MLP step from
// 111 to 98.5 added I1 misses and 1574 to 1510 added instructions per op
// (bench/vessel_callgrind.sh, AMD EPYC VM).
inline bool Recorder::commit(ThreadLog& log, const TraceEntry& entry, std::span<const MetaCell> cells,
                             std::span<const ScalarRecord> scalars) {
  CRUCIBLE_PRE(cells.size() == entry.n_meta_cells && scalars.size() == entry.n_scalars,
               "entry counts match the cells and scalars given");
  if (!log.metas_.has_room(cells.size()) || !log.scalars_.has_room(scalars.size()) ||
      !log.entries_.has_room(1)) [[unlikely]]
    return commit_slow(log, entry, cells, scalars);
  log.metas_.push_n_fitting(cells);
  log.scalars_.push_n_fitting(scalars);
  publish_entry(log, entry, cells.size(), scalars.size());
  return true;
}

// The op's entry, after its cells and scalars, with room for it in the ring.
inline void Recorder::publish_entry(ThreadLog& log, const TraceEntry& entry, std::size_t n_cells,
                                    std::size_t n_scalars) {
  const std::uint64_t seq = log.committed_.load(std::memory_order_relaxed);
  const std::uint8_t flags = entry.flags | (log.after_drop_ ? op_flag::kAfterDrop : 0);
  log.after_drop_ = false;
  auto fill = [&](TraceEntry& slot) {  // field by field into the ring (see try_push_with)
    slot.schema_hash = entry.schema_hash;
    slot.seq = seq;
    slot.n_tensors = entry.n_tensors;
    slot.n_inputs = entry.n_inputs;
    slot.n_meta_cells = entry.n_meta_cells;
    slot.n_scalars = entry.n_scalars;
    slot.module_id = entry.module_id;
    slot.thread = log.index_;
    slot.n_args = entry.n_args;
    slot.phase = entry.phase;
    slot.flags = flags;
    slot.reserved0 = 0;
    slot.stream = entry.stream;
    slot.reserved1 = 0;
  };
  const bool pushed = log.entries_.try_push_with(fill);  // the caller made room
  CRUCIBLE_ASSERT(pushed, "room for the entry");
  (void)pushed;
  detail::bump_owned(log.ops_[static_cast<int>(entry.phase) % kNumPhases], 1);
  detail::bump_owned(log.bytes_, sizeof(TraceEntry) + n_cells * sizeof(MetaCell) +
                                     n_scalars * sizeof(ScalarRecord));
  log.committed_.store(seq + 1, std::memory_order_release);
}

}  // namespace crucible::record
