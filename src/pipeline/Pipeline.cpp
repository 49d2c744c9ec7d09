// Pipeline.cpp — the detect, build and publish stage threads.
#include "crucible/pipeline/Pipeline.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <unordered_map>
#include <vector>

#if defined(__linux__)
#include <sys/resource.h>
#endif

#include "crucible/core/Contract.h"
#include "crucible/core/ThreadName.h"

namespace crucible::pipeline {
namespace {
std::uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}
// Minor page faults this thread has taken (Linux; 0 elsewhere).
std::uint64_t thread_minor_faults() {
#if defined(__linux__) && defined(RUSAGE_THREAD)
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) == 0) return static_cast<std::uint64_t>(ru.ru_minflt);
#endif
  return 0;
}
// The memory a trace's arrays hold.
std::size_t capacity_bytes(const record::Trace& t) {
  return t.ops.capacity() * sizeof(record::TraceEntry) + t.tensors.capacity() * sizeof(record::TensorMeta) +
         t.dims.capacity() * sizeof(std::int64_t) + t.scalars.capacity() * sizeof(record::ScalarRecord) +
         (t.op_tensor_begin.capacity() + t.op_scalar_begin.capacity() + t.tensor_dims_begin.capacity()) *
             sizeof(std::uint64_t);
}
}  // namespace

// Note [Recycled copies]
// Every build copies its iteration's ops into a trace of its own (the recorder's keeps growing
// and may be cleared while the copy is in use). Fresh arrays for each copy are fresh memory from
// the C library, which returns freed memory to the system and hands it out again untouched: on
// a VM each first touch of such a page is a fault of about a microsecond, and resnet18's builds
// took up to 84 of them, most in the copy (the build took 300 us instead of 200-240 without
// faults, 2026-12-02). A copy's trace is shared by the iterations published from it and the
// build cache; when the last of them lets go, its deleter (on whichever thread that is) hands
// the trace back to this pool, which keeps up to kSpareTraces of them of at most
// kMaxSpareBytes each, and the next copy is made into one, in memory already touched. The pool
// outlives the pipeline as long as a trace from it does (the deleters share it).
struct Pipeline::TracePool {
  std::mutex mu;
  std::vector<std::unique_ptr<record::Trace>> spare;
  TracePool() { spare.reserve(kSpareTraces); }
  std::unique_ptr<record::Trace> take() {
    std::lock_guard<std::mutex> g(mu);
    if (spare.empty()) return nullptr;
    std::unique_ptr<record::Trace> t = std::move(spare.back());
    spare.pop_back();
    return t;  // emptied by the caller, outside the recorder's trace lock
  }
  // Keeps t if there is room and it is not too big; frees it otherwise (outside the lock).
  void give(std::unique_ptr<record::Trace> t) noexcept {
    if (t == nullptr || capacity_bytes(*t) > kMaxSpareBytes) return;
    std::lock_guard<std::mutex> g(mu);
    if (spare.size() < kSpareTraces) spare.push_back(std::move(t));  // reserved: does not allocate
  }
};
namespace {
struct ReturnToPool {
  std::shared_ptr<Pipeline::TracePool> pool;
  void operator()(record::Trace* t) const noexcept { pool->give(std::unique_ptr<record::Trace>(t)); }
};
}  // namespace

Pipeline::Pipeline(record::Recorder& rec, graph::PlanOptions plan)
    : rec_(rec), plan_(plan), trace_pool_(std::make_shared<TracePool>()) {
  // Named for top, perf and gdb (at most 15 characters).
  detect_ = std::thread([this] {
    name_this_thread("crucible-detect");
    detect_loop();
  });
  build_ = std::thread([this] {
    name_this_thread("crucible-build");
    build_loop();
  });
  publish_ = std::thread([this] {
    name_this_thread("crucible-pub");
    publish_loop();
  });
  rec_.set_sink(this);
}

Pipeline::~Pipeline() {
  rec_.set_sink(nullptr);
  rec_.flush_token(0);  // returns after the drain thread's last call into this sink
  CRUCIBLE_ASSERT(pending_.empty(), "on_unlocked follows every on_ops");
  to_detect_.close();
  detect_.join();
  to_build_.close();
  build_.join();
  to_publish_.close();
  publish_.join();
}

void Pipeline::on_ops(const record::Trace& t, std::uint64_t generation, std::uint32_t thread, std::size_t first,
                      std::size_t count) {
  if (count == 0) return;
  // One message per batch: a message (and its fence) per op cost the drain more than hashing.
  auto sigs = std::make_unique<std::uint64_t[]>(count);
  auto contents = std::make_unique<ContentHash[]>(count);
  for (std::size_t k = 0; k < count; ++k) {
    sigs[k] = graph::op_signature(t, first + k);
    contents[k] = record::op_content(t, first + k);
  }
  pending_.reserve(pending_.size() + 1);  // cannot throw after this: the message owns the arrays
  pending_.push_back(SigMsg{SigMsg::Ops, thread, first, sigs.release(), contents.release(),
                            static_cast<std::uint32_t>(count), generation});
}
void Pipeline::on_unlocked() {
  // May block while detect is behind; never with the trace locked (build's copy needs it).
  for (const SigMsg& m : pending_) to_detect_.push(m);
  pending_.clear();
}
void Pipeline::on_barrier(std::uint64_t token) {
  on_unlocked();
  to_detect_.push(SigMsg{SigMsg::Barrier, 0, token, nullptr, nullptr, 0, 0});
}
void Pipeline::on_clear() {
  on_unlocked();
  to_detect_.push(SigMsg{SigMsg::Clear, 0, 0, nullptr, nullptr, 0, 0});
}

void Pipeline::detect_loop() {
  struct PerThread {
    std::uint32_t thread = 0;
    std::vector<std::uint64_t> sigs, ops;  // last kWindow..2*kWindow ops of the thread
    std::vector<ContentHash> contents;
    std::uint64_t generation = 0;
    std::size_t new_ops = 0;
    std::size_t last_sent_first = SIZE_MAX;  // trace index of the last iteration sent to build
  };
  std::unordered_map<std::uint32_t, PerThread> threads;
  auto detect = [&](PerThread& pt) {
    pt.new_ops = 0;
    detections_.fetch_add(1, std::memory_order_relaxed);
    graph::IterationReport r = graph::detect_iterations(pt.sigs);
    {
      std::lock_guard<std::mutex> g(reason_mu_);
      last_reason_ = r.reason;
      last_periodic_ = r.periodic;
      last_any_ = true;
      last_thread_ = pt.thread;
    }
    if (!r.periodic) return;
    const graph::Segment& s = r.segments[static_cast<std::size_t>(r.last_steady())];
    const std::size_t first = pt.ops[s.begin];
    if (first == pt.last_sent_first) return;
    pt.last_sent_first = first;
    auto* w = new BuildWork;
    w->ops.assign(pt.ops.begin() + static_cast<long>(s.begin), pt.ops.begin() + static_cast<long>(s.end));
    w->contents.assign(pt.contents.begin() + static_cast<long>(s.begin), pt.contents.begin() + static_cast<long>(s.end));
    w->generation = pt.generation;
    w->thread = pt.thread;
    w->report = std::move(r);
    to_build_.push(BuildMsg{BuildMsg::Build, 0, w});
  };
  SigMsg m;
  while (to_detect_.pop(m)) {
    switch (m.kind) {
      case SigMsg::Ops: {
        std::unique_ptr<std::uint64_t[]> sigs(m.sigs);
        std::unique_ptr<ContentHash[]> contents(m.contents);
        ops_seen_.fetch_add(m.count, std::memory_order_relaxed);
        PerThread& pt = threads[m.thread];
        pt.thread = m.thread;
        pt.generation = m.generation;  // a clear() empties threads first: one generation per window
        for (std::uint32_t k = 0; k < m.count; ++k) {
          pt.sigs.push_back(sigs[k]);
          pt.contents.push_back(contents[k]);
          pt.ops.push_back(m.op + k);
          if (pt.sigs.size() > 2 * kWindow) {
            pt.sigs.erase(pt.sigs.begin(), pt.sigs.end() - static_cast<long>(kWindow));
            pt.contents.erase(pt.contents.begin(), pt.contents.end() - static_cast<long>(kWindow));
            pt.ops.erase(pt.ops.begin(), pt.ops.end() - static_cast<long>(kWindow));
          }
          // Re-detect once the thread's ops grew by half (amortised O(1) per op).
          if (++pt.new_ops >= std::max<std::size_t>(4096, pt.sigs.size() / 2)) detect(pt);
        }
        break;
      }
      case SigMsg::Barrier:
        for (auto& [th, pt] : threads)
          if (pt.new_ops != 0) detect(pt);
        to_build_.push(BuildMsg{BuildMsg::Barrier, m.op, nullptr});
        break;
      case SigMsg::Clear:  // recorder.clear(): forget everything, unpublish
        threads.clear();
        {
          std::lock_guard<std::mutex> g(reason_mu_);
          last_reason_ = "no ops recorded since the last clear()";
          last_periodic_ = last_any_ = false;
        }
        to_build_.push(BuildMsg{BuildMsg::Clear, 0, nullptr});
        break;
    }
  }
}

// Note [Reusing earlier builds]
// A training loop records the same step again and again, and detect sends a new iteration
// every few thousand ops. Its ops differ from an earlier one built only in storage ids, version
// counts, data pointers and sequence numbers (and the recording thread, which the published
// iteration takes from the new ops), which no part of the analysis depends on: the graph is
// keyed by (storage, version) pairs that map one to one, hashes and plan read metadata, and
// the plan breaks ties by first-touch order, never by raw storage id. Their
// structure key says so without copying them; build then republishes the analysis built for
// that key (which describes an earlier occurrence of the same step, whose trace it holds) with
// the new detection report. The republished iteration shares that analysis (graph, DAG and
// plan behind one shared_ptr): copying them took 23 us of resnet18's reuse once the step had
// evicted them, against 5.6 in cache (2026-11-30). Key and copy are taken under one hold of the
// trace lock, and the copy's external classification is the one the key hashed, so the key stored
// with an analysis describes the very ops it was built from, even if a clear() or a classification
// raced. Builds survive clear(): they are a cache keyed by content, not recorded data.
//
// Build keeps the analyses of the last kCachedBuilds distinct structures, most recently used
// first, not only the last one: a loop that alternates steps (training and evaluation, or a
// step that logs every N steps) reuses each step's analysis instead of building every switch
// afresh. The copy request carries all their keys (a handful of 16-byte compares).
//
// When the structure key is none of them but the wiring key (Note [Wiring key], Trace.h: the
// same ops on the same wiring, other scalars, as AdamW's every step) is a cached one's, build
// copies the ops as for a build, rebases that analysis's graph and plan onto the copy's
// storages, and hashes again the Merkle DAG's nodes and regions whose contents (the drain's)
// changed, and their consumers (graph::rebuild_iteration). The result replaces the entry it
// came from, so its trace, graph, DAG and plan all describe the new ops.
void Pipeline::build_loop() {
  // The analyses of the last kCachedBuilds structures built, most recently used first, each
  // with its two keys (Note [Reusing earlier builds]).
  struct Cached {
    ContentHash key, wiring;
    std::shared_ptr<const graph::Iteration> it;
  };
  std::vector<Cached> cache;
  std::vector<ContentHash> keys;  // cache's structure keys, for the copy request
  // The index of the first entry whose key (structure or wiring) is k, cache.size() if none.
  auto index_of = [&](ContentHash Cached::*which, const ContentHash& k) {
    return static_cast<std::size_t>(
        std::find_if(cache.begin(), cache.end(), [&](const Cached& c) { return c.*which == k; }) - cache.begin());
  };
  auto to_front = [&](std::size_t i) {
    std::rotate(cache.begin(), cache.begin() + static_cast<long>(i), cache.begin() + static_cast<long>(i) + 1);
  };
  auto ns = [](auto d) { return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()); };
  BuildMsg m;
  while (to_build_.pop(m)) {
    if (m.kind != BuildMsg::Build) {
      to_publish_.push(PublishMsg{m.kind == BuildMsg::Barrier ? PublishMsg::Barrier : PublishMsg::Clear,
                                  m.token, nullptr});
      continue;
    }
    std::unique_ptr<BuildWork> w(m.work);
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t cpu0 = thread_cpu_ns();
    const std::uint64_t faults0 = thread_minor_faults();
    const bool reuse = reuse_.load(std::memory_order_relaxed);
    keys.clear();
    if (reuse)
      for (const Cached& c : cache) keys.push_back(c.key);
    record::Recorder::CopyRequest req{w->ops};
    req.want_key = true;
    req.contents = w->contents;
    req.unless = keys;
    req.generation = w->generation;
    std::unique_ptr<record::Trace> spare = trace_pool_->take();  // Note [Recycled copies]
    // Emptied here, so that key_and_copy's own clear under the trace lock, which the drain
    // waits on, frees nothing.
    if (spare != nullptr) spare->clear_keeping_capacity();
    req.recycle = spare.get();
    record::Recorder::KeyedCopy kc = rec_.key_and_copy(req);
    const auto t_copied = std::chrono::steady_clock::now();
    if (!kc.copy) trace_pool_->give(std::move(spare));  // untouched
    if (kc.stale) continue;  // cleared since detection: the Clear behind this message unpublishes
    if (!kc.copy) {  // the key is one of the cache's
      const std::size_t hit_at = index_of(&Cached::key, kc.key);
      CRUCIBLE_ASSERT(hit_at < cache.size(), "key_and_copy skips the copy only for a cached key");
      to_front(hit_at);
      const graph::Iteration& hit = *cache.front().it;
      auto it = std::make_shared<graph::Iteration>(hit.analysis);
      it->trace = hit.trace;
      it->report = std::move(w->report);
      it->thread = w->thread;  // another thread may record the same step
      last_reuse_ns_.store(ns(std::chrono::steady_clock::now() - t0), std::memory_order_relaxed);
      reused_.fetch_add(1, std::memory_order_relaxed);
      to_publish_.push(PublishMsg{PublishMsg::Publish, 0, new std::shared_ptr<const graph::Iteration>(std::move(it))});
      continue;
    }
    if (spare != nullptr) recycled_.fetch_add(1, std::memory_order_relaxed);
    else spare = std::make_unique<record::Trace>();
    *spare = std::move(*kc.copy);  // the copy was made in spare's memory, if there was one
    std::shared_ptr<record::Trace> trace(spare.release(), ReturnToPool{trace_pool_});
    std::vector<std::size_t> local(trace->num_ops());
    for (std::size_t i = 0; i < local.size(); ++i) local[i] = i;
    // The copy holds exactly the requested ops, in order, when none was skipped as missing.
    const bool whole = trace->num_ops() == w->contents.size();
    const std::span<const ContentHash> contents =
        whole ? std::span<const ContentHash>(w->contents) : std::span<const ContentHash>{};
    std::shared_ptr<graph::Iteration> it;
    const std::size_t same_wiring = index_of(&Cached::wiring, kc.wiring_key);
    if (whole && reuse && same_wiring < cache.size()) {
      it = graph::rebuild_iteration(*cache[same_wiring].it, *trace, local, contents, kc.numbering, plan_);
      if (it) {
        it->trace = std::move(trace);
        it->report = std::move(w->report);
        last_rewire_ns_.store(ns(std::chrono::steady_clock::now() - t0), std::memory_order_relaxed);
        rewired_.fetch_add(1, std::memory_order_relaxed);
        cache[same_wiring].key = kc.key;  // the rewired analysis replaces the one it came from
        cache[same_wiring].it = it;
        to_front(same_wiring);
        to_publish_.push(
            PublishMsg{PublishMsg::Publish, 0, new std::shared_ptr<const graph::Iteration>(it)});
        continue;
      }
    }
    graph::BuildTimes parts;
    it = graph::build_iteration(
        *trace, std::move(local), plan_, contents,
        std::move(kc.numbering), &parts);  // numbers the copy's tensors (the structure key's pass)
    it->trace = std::move(trace);
    it->report = std::move(w->report);
    const std::uint64_t cpu1 = thread_cpu_ns();
    const auto t1 = std::chrono::steady_clock::now();
    last_build_ns_.store(ns(t1 - t0), std::memory_order_relaxed);
    last_copy_ns_.store(ns(t_copied - t0), std::memory_order_relaxed);
    last_build_cpu_ns_.store(cpu1 - cpu0, std::memory_order_relaxed);
    last_graph_ns_.store(parts.graph_ns, std::memory_order_relaxed);
    last_dag_ns_.store(parts.dag_ns, std::memory_order_relaxed);
    last_plan_ns_.store(parts.plan_ns, std::memory_order_relaxed);
    last_build_faults_.store(thread_minor_faults() - faults0, std::memory_order_relaxed);
    builds_.fetch_add(1, std::memory_order_relaxed);
    // Built afresh: the newest entry. A structure already cached (reuse off) is replaced, so the
    // cache never holds one key twice.
    std::size_t i = index_of(&Cached::key, kc.key);
    if (i == cache.size()) {
      if (cache.size() == kCachedBuilds) cache.pop_back();
      cache.emplace_back();
      i = cache.size() - 1;
    }
    cache[i] = Cached{kc.key, kc.wiring_key, it};
    to_front(i);
    cached_.store(cache.size(), std::memory_order_relaxed);
    to_publish_.push(PublishMsg{PublishMsg::Publish, 0, new std::shared_ptr<const graph::Iteration>(it)});
  }
}

// Note [Publishing under a mutex]
// The published iteration is a shared_ptr behind a mutex, swapped by publish and copied by
// latest(). It was a std::atomic<std::shared_ptr>, whose libstdc++ 12 implementation guards the
// pointer with a lock bit in the control-block word: load() takes that bit with acquire, reads
// the pointer and releases the bit with a relaxed fetch_sub (bits/shared_ptr_atomic.h). With no
// release, the reader's read of the pointer is not ordered before the next store's write of it
// (a data race by the memory model; on a weakly ordered CPU the read may return the new pointer
// with the old count), and TSan reports exactly that in the stress test's reader
// (google/sanitizers#1558 for the same report). Readers are rare (crucible.iteration(),
// compile()); a mutex costs them and publish next to nothing. The iteration replaced is freed
// after the lock is let go: its destructor frees a graph and hands its trace back to the pool.
std::shared_ptr<const graph::Iteration> Pipeline::latest() const {
  std::lock_guard<std::mutex> g(latest_mu_);
  return latest_;
}

void Pipeline::publish_loop() {
  auto publish = [this](std::shared_ptr<const graph::Iteration> it) {
    {
      std::lock_guard<std::mutex> g(latest_mu_);
      latest_.swap(it);
    }
    // `it` now holds the iteration replaced, freed here, outside the lock.
  };
  PublishMsg m;
  while (to_publish_.pop(m)) {
    if (m.kind == PublishMsg::Publish) {
      std::unique_ptr<std::shared_ptr<const graph::Iteration>> it(m.it);
      publish(std::move(*it));
      published_.fetch_add(1, std::memory_order_relaxed);
    } else if (m.kind == PublishMsg::Clear) {
      publish(nullptr);
    } else {
      published_token_.store(m.token, std::memory_order_release);
      published_token_.notify_all();
    }
  }
}

void Pipeline::flush() {
  static std::mutex flush_mu;  // tokens must reach publish in the order they are issued
  std::lock_guard<std::mutex> g(flush_mu);
  const std::uint64_t token = next_token_.fetch_add(1);
  rec_.flush_token(token);
  for (std::uint64_t seen = published_token_.load(std::memory_order_acquire); seen < token;
       seen = published_token_.load(std::memory_order_acquire))
    published_token_.wait(seen, std::memory_order_acquire);
}

std::string Pipeline::last_reason() const {
  std::lock_guard<std::mutex> g(reason_mu_);
  return last_reason_;
}

Pipeline::Detection Pipeline::last_detection() const {
  std::lock_guard<std::mutex> g(reason_mu_);
  return Detection{last_periodic_, last_any_, last_thread_, last_reason_};
}

PipelineStats Pipeline::stats() const {
  PipelineStats s;
  s.ops_seen = ops_seen_.load(std::memory_order_relaxed);
  s.detections = detections_.load(std::memory_order_relaxed);
  s.builds = builds_.load(std::memory_order_relaxed);
  s.reused = reused_.load(std::memory_order_relaxed);
  s.rewired = rewired_.load(std::memory_order_relaxed);
  s.cached = cached_.load(std::memory_order_relaxed);
  s.published = published_.load(std::memory_order_relaxed);
  s.last_build_ns = last_build_ns_.load(std::memory_order_relaxed);
  s.last_copy_ns = last_copy_ns_.load(std::memory_order_relaxed);
  s.last_build_cpu_ns = last_build_cpu_ns_.load(std::memory_order_relaxed);
  s.last_graph_ns = last_graph_ns_.load(std::memory_order_relaxed);
  s.last_dag_ns = last_dag_ns_.load(std::memory_order_relaxed);
  s.last_plan_ns = last_plan_ns_.load(std::memory_order_relaxed);
  s.last_reuse_ns = last_reuse_ns_.load(std::memory_order_relaxed);
  s.last_rewire_ns = last_rewire_ns_.load(std::memory_order_relaxed);
  s.recycled = recycled_.load(std::memory_order_relaxed);
  s.last_build_faults = last_build_faults_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace crucible::pipeline
