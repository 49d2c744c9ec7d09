// Recorder.cpp — producer commit with back-pressure or counted drops, and the drain thread.
#include "crucible/record/Recorder.h"

#include <algorithm>
#include <chrono>

#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "crucible/core/ContentHash.h"
#include "crucible/core/Contract.h"
#include "crucible/core/ThreadName.h"
#include "crucible/record/TraceFile.h"

namespace crucible::record {
namespace {
std::atomic<std::uint64_t> g_next_uid{1};

bool pow2(std::uint32_t v) { return v >= 2 && (v & (v - 1)) == 0; }

using detail::bump_owned;

// The calling thread's logs, one per recorder it has recorded into. The cached pair makes
// the common case (one recorder) a compare and a load. The recorder owns its logs (logs_);
// this map only finds them, so a destroyed recorder's rings are freed with it (a thread that
// made and destroyed many recorders would otherwise keep every one's rings, megabytes each),
// and its expired entry is dropped when the thread next looks up a log it has not cached.
struct TlsLogs {
  std::uint64_t uid = 0;
  ThreadLog* log = nullptr;
  std::unordered_map<std::uint64_t, std::weak_ptr<ThreadLog>> all;
};
thread_local TlsLogs t_logs;

std::mutex g_global_mu;
RecorderConfig g_global_cfg;
Recorder* g_global = nullptr;
std::atomic<Recorder*> g_global_ready{nullptr};  // g_global once it exists (lock-free reads)
}  // namespace

ThreadLog::ThreadLog(const RecorderConfig& cfg, std::uint32_t index)
    : entries_(cfg.ring_entries), metas_(cfg.meta_cells), scalars_(cfg.scalar_slots), index_(index) {}

Result<std::unique_ptr<Recorder>> Recorder::create(const RecorderConfig& cfg) {
  if (!pow2(cfg.ring_entries) || !pow2(cfg.meta_cells) || !pow2(cfg.scalar_slots)) {
    return invalid_input("ring sizes must be powers of two >= 2 (ring_entries " +
                             std::to_string(cfg.ring_entries) + ", meta_cells " +
                             std::to_string(cfg.meta_cells) + ", scalar_slots " +
                             std::to_string(cfg.scalar_slots) + ")",
                         "round each up to a power of two, e.g. 65536");
  }
  // Every recording thread (autograd's workers included) gets rings of these sizes the first
  // time it records, allocated and zeroed there: sizes the machine cannot hold would fail in
  // the middle of a kernel, or get the process killed. Refused here instead, with the cost.
  const std::uint64_t per_thread = std::uint64_t{cfg.ring_entries} * sizeof(TraceEntry) +
                                   std::uint64_t{cfg.meta_cells} * sizeof(MetaCell) +
                                   std::uint64_t{cfg.scalar_slots} * sizeof(ScalarRecord);
  const std::uint64_t limit = ring_memory_limit();
  if (per_thread > limit) {
    auto mib = [](std::uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
    return invalid_input("rings of ring_entries " + std::to_string(cfg.ring_entries) + ", meta_cells " +
                             std::to_string(cfg.meta_cells) + ", scalar_slots " + std::to_string(cfg.scalar_slots) +
                             " take " + mib(per_thread) + " per recording thread, over the " + mib(limit) +
                             " allowed (an eighth of this machine's memory; each recording thread, autograd's "
                             "included, has rings of its own)",
                         "use smaller sizes: the defaults (65536, 131072, 65536) take 13 MiB per thread");
  }
  return std::unique_ptr<Recorder>(new Recorder(cfg));
}

std::uint64_t Recorder::ring_memory_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  // Unknown memory: 4 GiB, the most the defaults' kind of sizes would ever need.
  if (pages <= 0 || page <= 0) return std::uint64_t{4} << 30;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 8;
}

Status Recorder::configure_global(const RecorderConfig& cfg, bool apply) {
  std::lock_guard<std::mutex> g(g_global_mu);
  if (g_global != nullptr)
    return bad_state("the global recorder already exists", "configure it before recording starts");
  auto r = create(cfg);  // validates
  if (!r.ok()) return r.status();
  if (apply) g_global_cfg = cfg;
  return ok_status();
}

Recorder& Recorder::global() {
  // Called for every recorded op: once the recorder exists (it is never replaced or
  // destroyed), one acquire load instead of the mutex.
  if (Recorder* r = g_global_ready.load(std::memory_order_acquire)) return *r;
  std::lock_guard<std::mutex> g(g_global_mu);
  if (g_global == nullptr) {
    // Never destroyed: threads may still be recording during static destruction.
    g_global = new Recorder(g_global_cfg);
    g_global_ready.store(g_global, std::memory_order_release);
  }
  return *g_global;
}

Recorder::Recorder(const RecorderConfig& cfg)
    : cfg_(cfg), uid_(g_next_uid.fetch_add(1)), drop_when_full_(cfg.drop_when_full) {
  drain_ = std::thread([this] {
    name_this_thread("crucible-drain");  // for top, perf and gdb
    drain_loop();
  });
}

Recorder::~Recorder() {
  stop_.store(true, std::memory_order_release);
  wake_drain();
  drain_.join();
}

ThreadLog& Recorder::thread_log() {
  if (t_logs.uid == uid_) return *t_logs.log;
  std::erase_if(t_logs.all,
                [](const auto& kv) { return kv.second.expired(); });  // recorders since destroyed
  auto it = t_logs.all.find(uid_);
  // This recorder is alive (we are in its member), so its log, if this thread has one, is too.
  std::shared_ptr<ThreadLog> log = it == t_logs.all.end() ? nullptr : it->second.lock();
  if (log == nullptr) {
    {
      std::lock_guard<std::mutex> g(logs_mu_);
      log = std::make_shared<ThreadLog>(cfg_, static_cast<std::uint32_t>(logs_.size()));
      logs_.push_back(log);
    }
    t_logs.all[uid_] = log;
  }
  t_logs.uid = uid_;
  t_logs.log = log.get();  // owned by logs_ for as long as this recorder lives
  return *t_logs.log;
}

// commit's fast path is in Recorder.h (Note [Commit fast path]).
bool Recorder::commit_slow(ThreadLog& log, const TraceEntry& entry, std::span<const MetaCell> cells,
                           std::span<const ScalarRecord> scalars) {
  if (log.drop_mode_ < 0 ? drop_when_full_.load(std::memory_order_relaxed) : log.drop_mode_ != 0)
      [[unlikely]] {
    const bool fits = log.entries_.capacity() - log.entries_.size_approx() >= 1 &&
                      log.metas_.capacity() - log.metas_.size_approx() >= cells.size() &&
                      log.scalars_.capacity() - log.scalars_.size_approx() >= scalars.size();
    if (!fits) {
      bump_owned(log.dropped_, 1);
      log.after_drop_ = true;
      wake_drain();
      return false;
    }
  }
  bool waited = false;
  auto wait = [&](const auto& ring) __attribute__((noinline, cold)) {  // `ring` was found full
    if (!waited) {
      waited = true;
      bump_owned(log.waits_, 1);
    }
    const std::uint32_t bell = log.bell_.load(std::memory_order_acquire);
    log.waiting_.store(true, std::memory_order_seq_cst);
    // Re-check after announcing: a pop the drain made before it could see waiting_ is seen here.
    // The fence orders the store before the re-check's loads (a seq_cst store alone does not
    // order a later acquire load on every architecture).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ring.size_approx() >= ring.capacity()) {
      wake_drain();
      log.bell_.wait(bell, std::memory_order_acquire);
    }
    log.waiting_.store(false, std::memory_order_relaxed);
  };
  auto push_all = [&](auto& ring, auto items) {
    std::size_t done = 0;
    while (done < items.size()) {
      const std::size_t n = ring.try_push_n(items.subspan(done));
      done += n;
      if (n == 0) wait(ring);
    }
  };
  push_all(log.metas_, cells);
  push_all(log.scalars_, scalars);
  while (!log.entries_.has_room(1)) wait(log.entries_);
  publish_entry(log, entry, cells.size(), scalars.size());
  return true;
}

std::uint64_t Recorder::intern_schema(std::string_view name) {
  const std::uint64_t h = hash64(name);
  std::lock_guard<std::mutex> g(names_mu_);
  schema_names_.try_emplace(h, name);
  return h;
}

Result<std::uint32_t> Recorder::intern_module(std::string_view path) {
  if (path.empty()) return 0u;
  if (Status st = check_module_path(path); !st.ok()) return st;
  std::lock_guard<std::mutex> g(names_mu_);
  auto [it, inserted] =
      module_ids_.try_emplace(std::string(path), static_cast<std::uint32_t>(module_paths_.size()));
  if (inserted) {
    module_paths_.emplace_back(path);
    num_modules_.store(static_cast<std::uint32_t>(module_paths_.size()), std::memory_order_release);
  }
  return it->second;
}

// Remade only when the table grew since it was last asked for: every copy the pipeline builds
// from then shares it.
const std::shared_ptr<const ModuleTree>& Recorder::module_tree_locked() {
  if (module_tree_ == nullptr || module_tree_->num_paths() != module_paths_.size())
    module_tree_ = std::make_shared<const ModuleTree>(module_paths_);
  return module_tree_;
}

bool Recorder::thread_drop_when_full() const {
  const ThreadLog* log = nullptr;
  if (t_logs.uid == uid_) {
    log = t_logs.log;
  } else if (auto it = t_logs.all.find(uid_); it != t_logs.all.end()) {
    log = it->second.lock().get();  // this recorder is alive, so its log is too
  }
  return log == nullptr || log->drop_mode_ < 0 ? drop_when_full() : log->drop_mode_ != 0;
}

std::uint32_t Recorder::num_modules() const { return num_modules_.load(std::memory_order_acquire); }

void Recorder::classify_external(std::uint64_t storage_id, ExternalKind kind) {
  if (storage_id == 0) return;
  std::lock_guard<std::mutex> g(names_mu_);
  externals_[storage_id] = kind;
}

void Recorder::wake_drain() {
  {
    std::lock_guard<std::mutex> g(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

bool Recorder::drain_log(ThreadLog& log) {
  // Pop buffers: raw storage, so a poll does not zero 40 KB it may not use.
  struct Buffers {
    std::unique_ptr<TraceEntry[]> entries{new TraceEntry[256]};
    std::unique_ptr<MetaCell[]> cells{new MetaCell[256]};
    std::unique_ptr<ScalarRecord[]> scalars{new ScalarRecord[512]};
  };
  thread_local Buffers buf;  // the drain thread's own
  TraceEntry* entries = buf.entries.get();
  const std::size_t n = log.entries_.try_pop_n(std::span<TraceEntry>(entries, 256));
  bool moved = n != 0;
  MetaCell* cells = buf.cells.get();
  for (std::size_t k; (k = log.metas_.try_pop_n(std::span<MetaCell>(cells, 256))) != 0;) {
    log.meta_stage_.insert(log.meta_stage_.end(), cells, cells + k);
    moved = true;
  }
  ScalarRecord* sc = buf.scalars.get();
  for (std::size_t k; (k = log.scalars_.try_pop_n(std::span<ScalarRecord>(sc, 512))) != 0;) {
    log.scalar_stage_.insert(log.scalar_stage_.end(), sc, sc + k);
    moved = true;
  }
  DrainSink* const sink = n != 0 ? sink_.load(std::memory_order_acquire) : nullptr;
  if (n != 0) {
    std::lock_guard<std::mutex> g(trace_mu_);
    const std::size_t first = trace_.num_ops();
    for (std::size_t i = 0; i < n; ++i) {
      const TraceEntry& e = entries[i];
      CRUCIBLE_ASSERT(log.meta_stage_.size() - log.meta_stage_head_ >= e.n_meta_cells &&
                          log.scalar_stage_.size() - log.scalar_stage_head_ >= e.n_scalars,
                      "an entry's cells and scalars are pushed before it");
      trace_.append(e,
                    std::span<const MetaCell>(log.meta_stage_.data() + log.meta_stage_head_,
                                              e.n_meta_cells),
                    std::span<const ScalarRecord>(
                        log.scalar_stage_.data() + log.scalar_stage_head_, e.n_scalars));
      wiring_.append(trace_, first + i);  // while the op is in cache (Note [Wiring log])
      log.meta_stage_head_ += e.n_meta_cells;
      log.scalar_stage_head_ += e.n_scalars;
      if (static_cast<std::uint8_t>(e.phase) < kNumPhases)
        ++log.drained_ops_[static_cast<int>(e.phase)];
    }
    if (sink != nullptr) sink->on_ops(trace_, generation_, log.index_, first, n);
  }
  if (sink != nullptr) sink->on_unlocked();
  // Compact the stages once their consumed prefix dominates.
  if (log.meta_stage_head_ > 4096 && log.meta_stage_head_ * 2 > log.meta_stage_.size()) {
    log.meta_stage_.erase(log.meta_stage_.begin(), log.meta_stage_.begin() + log.meta_stage_head_);
    log.meta_stage_head_ = 0;
  }
  if (log.scalar_stage_head_ > 4096 && log.scalar_stage_head_ * 2 > log.scalar_stage_.size()) {
    log.scalar_stage_.erase(log.scalar_stage_.begin(),
                            log.scalar_stage_.begin() + log.scalar_stage_head_);
    log.scalar_stage_head_ = 0;
  }
  if (n != 0)
    log.drained_.store(log.drained_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  if (moved) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the pops before the load of waiting_
    if (log.waiting_.load(std::memory_order_relaxed)) {
      log.bell_.fetch_add(1, std::memory_order_release);
      log.bell_.notify_one();
    }
  }
  return moved;
}

bool Recorder::drain_once() {
  thread_local std::vector<std::shared_ptr<ThreadLog>> logs;  // the drain thread's copy
  {
    std::lock_guard<std::mutex> g(logs_mu_);
    if (logs.size() != logs_.size()) logs = logs_;
  }
  bool moved = false;
  for (auto& l : logs) moved |= drain_log(*l);
  return moved;
}

void Recorder::drain_loop() {
  // Note [Drain pacing]: polling a ring that a producer is writing bounces its head cache
  // line between cores on every poll, and on a 2-core machine (often two hyperthreads of one
  // core) a busy drain steals cycles from the thread it records. So the drain empties every
  // ring, then sleeps: 1 ms while ops keep coming (a 64K-entry ring fills in 13 ms even at
  // 5M ops/s), backing off to 16 ms when idle. A full ring, flush() and shutdown wake it at
  // once through the condition variable. (A shorter pause buys nothing but wake-ups: at 200 us
  // they are ~5000 context switches a second of training.)
  using namespace std::chrono;
  int idle = 0;
  for (;;) {
    bool moved = false;
    // Events (flush tokens, clear) are delivered after every pass, not only once the rings are
    // empty: a thread that records without pause refills a ring during every pass, and would
    // hold another thread's flush() or clear() until it paused. An event's own ops were
    // drained before it was queued (flush_token and clear flush first).
    while (drain_once()) {
      moved = true;
      deliver_tokens();
    }
    deliver_tokens();
    if (stop_.load(std::memory_order_acquire)) {
      if (!drain_once()) return;
      continue;
    }
    idle = moved ? 0 : std::min(idle + 1, 4);
    const auto pause = microseconds(1000 << idle);  // 1 ms .. 16 ms
    std::unique_lock<std::mutex> lk(wake_mu_);
    wake_cv_.wait_for(lk, pause, [&] { return wake_; });
    wake_ = false;
  }
}

void Recorder::deliver_tokens() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> g(token_mu_);
    events.swap(pending_events_);
  }
  if (events.empty()) return;
  DrainSink* sink = sink_.load(std::memory_order_acquire);
  // A clear forgets every op drained so far, and the stats restart from exactly those: the
  // baseline counts drained ops (this thread's own counters), not the producers' commits,
  // which may be ahead by ops committed since clear() flushed; those are drained after the
  // clear, so they stay both in the trace and in the stats.
  std::vector<ThreadStats> baseline;
  if (std::any_of(events.begin(), events.end(), [](const Event& ev) { return ev.clear; })) {
    std::lock_guard<std::mutex> g(logs_mu_);
    for (const auto& l : logs_) {
      ThreadStats s;
      s.thread = l->index_;
      for (int p = 0; p < kNumPhases; ++p) s.ops[p] = l->drained_ops_[p];
      s.dropped = l->dropped_.load(std::memory_order_relaxed);
      s.bytes = l->bytes_.load(std::memory_order_relaxed);
      s.waits = l->waits_.load(std::memory_order_relaxed);
      baseline.push_back(s);
    }
  }
  {
    std::lock_guard<std::mutex> g(trace_mu_);
    for (const Event& ev : events) {
      if (ev.clear) {
        trace_.clear();
        wiring_.clear();
        ++generation_;
        baseline_ = baseline;
      }
    }
  }
  if (sink != nullptr)  // outside the lock: the sink may block on its next stage
    for (const Event& ev : events) {
      if (ev.clear) sink->on_clear();
      else sink->on_barrier(ev.token);
    }
  events_done_.fetch_add(events.size(), std::memory_order_release);
}

void Recorder::run_event(Event ev) {
  std::uint64_t ticket;
  {
    std::lock_guard<std::mutex> g(token_mu_);
    pending_events_.push_back(std::move(ev));
    ticket = ++events_queued_;
  }
  while (events_done_.load(std::memory_order_acquire) < ticket) {
    wake_drain();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void Recorder::flush_token(std::uint64_t token) {
  flush();
  Event ev;
  ev.token = token;
  run_event(std::move(ev));
}

void Recorder::set_sink(DrainSink* sink) { sink_.store(sink, std::memory_order_release); }

Trace Recorder::copy_ops(std::span<const std::size_t> ops) { return *key_and_copy(CopyRequest{ops}).copy; }

ContentHash Recorder::structure_key(std::span<const std::size_t> ops) {
  CopyRequest req{ops};
  req.want_key = true;
  req.want_copy = false;
  return key_and_copy(req).key;
}

Recorder::KeyedCopy Recorder::key_and_copy(const CopyRequest& req) {
  const std::span<const std::size_t> ops = req.ops;
  KeyedCopy r;
  // Indices past the trace (a clear() raced with the caller) are skipped, by the key and the
  // copy alike.
  std::vector<std::size_t> in_range;
  StorageNumbering& numbering = r.numbering;  // with the key: its kinds are the classification it hashed, for the copy too
  ContentHash body, wiring;
  std::unique_lock<std::mutex> trace_lock(trace_mu_);
  if (req.generation != kAnyGeneration && req.generation != generation_) {
    r.stale = true;
    return r;
  }
  const Trace& t = trace_;
  const std::size_t n_ops = t.num_ops();
  if (req.want_key) {
    // Hashing first reads the ops from memory (they are cold by now); the copy after it
    // finds them in cache.
    std::span<const std::size_t> valid = ops;
    if (std::any_of(ops.begin(), ops.end(), [&](std::size_t op) { return op >= n_ops; })) {
      for (std::size_t op : ops)
        if (op < n_ops) in_range.push_back(op);
      valid = in_range;
    }
    // Contents belong to the ops as given; with some of them gone, compute them afresh.
    const std::span<const ContentHash> contents =
        valid.size() == ops.size() ? req.contents : std::span<const ContentHash>{};
    // One run of consecutive ops (one thread's iteration, no other thread in between) is
    // keyed from the wiring log; anything else from the trace (Note [Wiring log]).
    bool run = !valid.empty();
    for (std::size_t i = 1; run && i < valid.size(); ++i) run = valid[i] == valid[0] + i;
    if (run &&
        wiring_.structure_body(t, valid[0], valid.size(), numbering, contents, body, &wiring)) {
      keys_from_log_.fetch_add(1, std::memory_order_relaxed);
    } else {
      body = record::structure_body(t, valid, numbering, contents, &wiring);
      keys_from_trace_.fetch_add(1, std::memory_order_relaxed);
    }
    {
      // trace_mu_ then names_mu_: nothing takes them in the other order.
      std::lock_guard<std::mutex> g(names_mu_);
      classify_storages(externals_, numbering);
    }
    r.key = record::structure_key(body, numbering.kinds);
    r.wiring_key = record::structure_key(wiring, numbering.kinds);
    for (const ContentHash& k : req.unless)
      if (r.key == k) return r;  // no copy: the caller has these ops' analysis
  }
  if (!req.want_copy) return r;
  if (req.recycle != nullptr) {
    req.recycle->clear_keeping_capacity();
    r.copy.emplace(std::move(*req.recycle));  // moved vectors keep their memory
  } else {
    r.copy.emplace();
  }
  Trace& out = *r.copy;
  // Bounds of op / tensor ranges in the trace's flat arrays (an op's tensors, dims and
  // scalars are contiguous and in op order: Trace::append).
  auto tensor_at = [&](std::size_t op) { return op < n_ops ? t.op_tensor_begin[op] : t.tensors.size(); };
  auto scalar_at = [&](std::size_t op) { return op < n_ops ? t.op_scalar_begin[op] : t.scalars.size(); };
  auto dim_at = [&](std::size_t tensor) { return tensor < t.tensors.size() ? t.tensor_dims_begin[tensor] : t.dims.size(); };
  // The ops of one recording thread's iteration are one run of consecutive indices, unless
  // other threads recorded in between: copy run by run, each with one bulk copy per array.
  auto for_runs = [&](auto&& f) {
    for (std::size_t i = 0; i < ops.size();) {
      if (ops[i] >= n_ops) {
        ++i;
        continue;
      }
      std::size_t j = i + 1;
      while (j < ops.size() && ops[j] == ops[j - 1] + 1 && ops[j] < n_ops) ++j;
      f(ops[i], ops[j - 1] + 1);
      i = j;
    }
  };
  std::size_t n_copied = 0, n_tensors = 0, n_dims = 0, n_scalars = 0;
  for_runs([&](std::size_t a, std::size_t b) {
    n_copied += b - a;
    n_tensors += tensor_at(b) - tensor_at(a);
    n_dims += dim_at(tensor_at(b)) - dim_at(tensor_at(a));
    n_scalars += scalar_at(b) - scalar_at(a);
  });
  out.ops.reserve(n_copied);
  out.op_tensor_begin.reserve(n_copied);
  out.op_scalar_begin.reserve(n_copied);
  out.tensors.reserve(n_tensors);
  out.tensor_dims_begin.reserve(n_tensors);
  out.dims.reserve(n_dims);
  out.scalars.reserve(n_scalars);
  for_runs([&](std::size_t a, std::size_t b) {
    const std::size_t t0 = tensor_at(a), t1 = tensor_at(b), s0 = scalar_at(a), d0 = dim_at(t0);
    const std::size_t out_t = out.tensors.size(), out_s = out.scalars.size(), out_d = out.dims.size();
    out.ops.insert(out.ops.end(), t.ops.begin() + static_cast<long>(a), t.ops.begin() + static_cast<long>(b));
    for (std::size_t op = a; op < b; ++op) {
      out.op_tensor_begin.push_back(t.op_tensor_begin[op] - t0 + out_t);
      out.op_scalar_begin.push_back(t.op_scalar_begin[op] - s0 + out_s);
    }
    out.tensors.insert(out.tensors.end(), t.tensors.begin() + static_cast<long>(t0), t.tensors.begin() + static_cast<long>(t1));
    for (std::size_t k = t0; k < t1; ++k) out.tensor_dims_begin.push_back(t.tensor_dims_begin[k] - d0 + out_d);
    out.dims.insert(out.dims.end(), t.dims.begin() + static_cast<long>(d0), t.dims.begin() + static_cast<long>(dim_at(t1)));
    out.scalars.insert(out.scalars.end(), t.scalars.begin() + static_cast<long>(s0),
                       t.scalars.begin() + static_cast<long>(scalar_at(b)));
  });
  trace_lock.unlock();
  // Only what the copied ops refer to: their schema names and the classification of their
  // storages (the recorder's tables grow with the run; copying them whole would make each
  // build cost more the longer training goes on).
  // The distinct schemas first (a few dozen among hundreds of ops), in a flat set: a lookup in
  // the copy's std::map per op cost more than the rest of the names.
  absl::flat_hash_set<std::uint64_t> schemas;
  schemas.reserve(64);
  for (const TraceEntry& e : out.ops) schemas.insert(e.schema_hash);
  std::lock_guard<std::mutex> g(names_mu_);
  for (const std::uint64_t h : schemas)
    if (auto it = schema_names_.find(h); it != schema_names_.end()) out.schema_names.emplace(it->first, it->second);
  out.module_paths = module_paths_;
  out.module_tree = module_tree_locked();
  if (req.want_key) {
    // The classification the key was computed from (a classify_external() since then must
    // not make the copy disagree with its key); the key's storages are the copy's storages.
    out.externals.reserve(static_cast<std::size_t>(
        std::count_if(numbering.kinds.begin(), numbering.kinds.end(), [](std::uint8_t k) { return k != 0; })));
    for (std::size_t i = 0; i < numbering.storages.size(); ++i)
      if (numbering.kinds[i] != 0) out.externals.emplace(numbering.storages[i], static_cast<ExternalKind>(numbering.kinds[i]));
  } else if (!externals_.empty()) {
    for (const TensorMeta& m : out.tensors)
      if (auto it = externals_.find(m.storage_id); it != externals_.end()) out.externals.emplace(it->first, it->second);
  }
  return r;
}

void Recorder::flush() {
  std::vector<std::pair<std::shared_ptr<ThreadLog>, std::uint64_t>> targets;
  {
    std::lock_guard<std::mutex> g(logs_mu_);
    for (auto& l : logs_) targets.emplace_back(l, l->committed_.load(std::memory_order_acquire));
  }
  for (auto& [log, upto] : targets) {
    while (log->drained_.load(std::memory_order_acquire) < upto) {
      wake_drain();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

std::vector<ThreadStats> Recorder::thread_stats() const {
  std::vector<ThreadStats> out = raw_thread_stats();
  std::lock_guard<std::mutex> g(trace_mu_);
  for (auto& s : out) {
    if (s.thread >= baseline_.size()) continue;
    const ThreadStats& b = baseline_[s.thread];
    for (int p = 0; p < kNumPhases; ++p) s.ops[p] -= b.ops[p];
    s.dropped -= b.dropped;
    s.bytes -= b.bytes;
    s.waits -= b.waits;
  }
  return out;
}

std::vector<ThreadStats> Recorder::raw_thread_stats() const {
  std::vector<ThreadStats> out;
  std::lock_guard<std::mutex> g(logs_mu_);
  for (const auto& l : logs_) {
    ThreadStats s;
    s.thread = l->index_;
    for (int p = 0; p < kNumPhases; ++p) s.ops[p] = l->ops_[p].load(std::memory_order_relaxed);
    s.dropped = l->dropped_.load(std::memory_order_relaxed);
    s.bytes = l->bytes_.load(std::memory_order_relaxed);
    s.waits = l->waits_.load(std::memory_order_relaxed);
    out.push_back(s);
  }
  return out;
}

Trace Recorder::snapshot() {
  flush();
  Trace t;
  {
    std::lock_guard<std::mutex> g(trace_mu_);
    t = trace_;
  }
  {
    std::lock_guard<std::mutex> g(names_mu_);
    for (const auto& [h, n] : schema_names_) t.schema_names.emplace(h, n);
    t.module_paths = module_paths_;
    t.module_tree = module_tree_locked();
    t.externals.insert(externals_.begin(), externals_.end());
  }
  t.threads = thread_stats();
  return t;
}

void Recorder::clear() {
  // Done by the drain thread, so the sink sees clear in order with the ops around it.
  flush();
  Event ev;
  ev.clear = true;
  run_event(std::move(ev));
}

}  // namespace crucible::record
