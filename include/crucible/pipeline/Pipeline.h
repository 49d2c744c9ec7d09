// Pipeline.h — the background stages behind a Recorder: drain -> detect -> build -> publish.
//
// Threads (each stage one thread; SPSC Channels between them, consumers park when idle):
//   drain    the Recorder's own drain thread; as a DrainSink it computes each new op's
//            signature and content (record::op_content) while the op is in cache, and sends
//            each drained batch's (thread, first op, signatures, contents) to detect;
//   detect   keeps each recording thread's signatures, runs the IterationDetector when enough
//            new ops arrived (or at a barrier), and sends the latest steady iteration's op
//            range to build when it is a new one;
//   build    copies those ops out of the trace and builds TraceGraph, MerkleDag, MemoryPlan,
//            unless they have the structure key (Trace.h) of one of the last kCachedBuilds
//            structures it built: then that analysis describes them exactly, and build
//            republishes it under the new detection report without copying (a training loop
//            repeats one step: see Note [Reusing earlier builds]); when only their wiring key
//            matches (scalars changed: AdamW), it rebases that graph and plan onto the new copy
//            and hashes again only what changed in the Merkle DAG;
//   publish  swaps the result into the published shared_ptr under a mutex that latest() takes
//            to copy it (Note [Publishing under a mutex], Pipeline.cpp).
// flush() is exact: it returns once every op recorded before the call has gone through all
// four stages and whatever iteration they complete is published.
//
// Detection looks at the last kWindow ops of a thread (65536; iterations longer than half of
// that are not found and the report says so).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "crucible/graph/Analysis.h"
#include "crucible/pipeline/Channel.h"
#include "crucible/record/Recorder.h"

namespace crucible::pipeline {

struct PipelineStats {
  std::uint64_t ops_seen = 0;        // signatures received by detect
  std::uint64_t detections = 0;      // detector runs
  std::uint64_t builds = 0;          // iterations built (copied and analysed)
  std::uint64_t reused = 0;          // iterations whose structure key matched a cached build
  std::uint64_t rewired = 0;         // iterations whose wiring key alone matched: DAG rebuilt
  std::uint64_t cached = 0;          // analyses build keeps for reuse (at most kCachedBuilds)
  std::uint64_t published = 0;       // iterations published
  // The last build: wall time from taking the ops out of the trace to a built iteration, the
  // part of it spent on their structure key and copy, and the build thread's CPU time over the
  // same span (on a busy machine the wall time includes waiting for a core; CPU time does not).
  std::uint64_t last_build_ns = 0;
  std::uint64_t last_copy_ns = 0;
  std::uint64_t last_build_cpu_ns = 0;
  // The rest of the last build's wall time, by part (graph::BuildTimes): the dataflow graph, the
  // Merkle DAG and the memory plan.
  std::uint64_t last_graph_ns = 0;
  std::uint64_t last_dag_ns = 0;
  std::uint64_t last_plan_ns = 0;
  // The last iteration handled by reuse: wall time from taking its ops to a publishable
  // iteration (structure key over the ops in the trace, and a new Iteration sharing the cached analysis).
  std::uint64_t last_reuse_ns = 0;
  // The last iteration handled by a rewire: wall time from taking its ops to a built iteration
  // (both keys, the copy, graph and plan rebased, the Merkle DAG's changes hashed).
  std::uint64_t last_rewire_ns = 0;
  // Copies made into the memory of an earlier copy no iteration used any more (Note [Recycled
  // copies], Pipeline.cpp), and the minor page faults the build thread took during the last
  // build (Linux; 0 elsewhere): each first touch of fresh memory, about a microsecond on a VM.
  std::uint64_t recycled = 0;
  std::uint64_t last_build_faults = 0;
};

class Pipeline final : public record::DrainSink {
 public:
  struct TracePool;  // internal: spare traces for the build's copies (Note [Recycled copies])
  static constexpr std::size_t kWindow = 65536;
  // How many analyses (of distinct structures) build keeps for reuse: a training step, an
  // evaluation step and a variant step (logging every N steps) each keep theirs.
  static constexpr std::size_t kCachedBuilds = 4;
  // Traces of earlier copies kept for the next copies to reuse (Note [Recycled copies]), and
  // the largest kept: a spare holding more memory than this is freed instead.
  static constexpr std::size_t kSpareTraces = 2;
  static constexpr std::size_t kMaxSpareBytes = std::size_t{64} << 20;

  // Attaches to `rec` (which must outlive the pipeline) and starts detect, build, publish.
  explicit Pipeline(record::Recorder& rec, graph::PlanOptions plan = {});
  ~Pipeline() override;
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The latest published iteration, or nullptr. Any thread (Note [Publishing under a mutex]).
  std::shared_ptr<const graph::Iteration> latest() const;
  // Why nothing is published yet (the detector's last reason), for error messages.
  std::string last_reason() const;
  // The detector's last look at a recording thread's ops: whether it found them periodic, and
  // its reason. Not periodic while an iteration is published: the ops recorded since that
  // iteration (on that thread) are not a loop, and latest() is older than them.
  struct Detection {
    bool periodic = false;
    bool any = false;  // false: nothing detected since the pipeline began or the last clear()
    std::uint32_t thread = 0;
    std::string reason;
  };
  Detection last_detection() const;
  void flush();
  PipelineStats stats() const;
  // Whether build may reuse a cached analysis, whole or rewired (on by default); off, every
  // iteration is built from scratch (for measuring builds, and for comparing the two).
  void set_reuse(bool on) { reuse_.store(on, std::memory_order_relaxed); }
  const graph::PlanOptions& plan_options() const { return plan_; }

  // DrainSink (drain thread).
  void on_ops(const record::Trace& t, std::uint64_t generation, std::uint32_t thread, std::size_t first,
              std::size_t count) override;
  void on_unlocked() override;
  void on_barrier(std::uint64_t token) override;
  void on_clear() override;

 private:
  struct SigMsg {
    enum Kind : std::uint8_t { Ops, Barrier, Clear } kind;
    std::uint32_t thread;
    std::uint64_t op;     // trace index of the first op (Ops) or token (Barrier)
    // Ops, each an array of count owned by the message (new[]), computed while the ops are in
    // cache: their signatures (detection) and their record::op_content (the Merkle DAG's local
    // hashes and the structure key).
    std::uint64_t* sigs;
    ContentHash* contents;
    std::uint32_t count;  // Ops: how many
    std::uint64_t generation;  // Ops: the trace generation the indices belong to
  };
  struct BuildWork {  // one iteration to build
    std::vector<std::size_t> ops;          // trace indices
    std::vector<ContentHash> contents;     // op_content of each
    std::uint64_t generation = 0;
    std::uint32_t thread = 0;              // the recording thread (not part of the structure key)
    graph::IterationReport report;
  };
  struct BuildMsg {
    enum Kind : std::uint8_t { Build, Barrier, Clear } kind;
    std::uint64_t token;
    BuildWork* work;  // owned by the message (Build)
  };
  struct PublishMsg {
    enum Kind : std::uint8_t { Publish, Barrier, Clear } kind;
    std::uint64_t token;
    std::shared_ptr<const graph::Iteration>* it;  // owned by the message (Publish)
  };
  void detect_loop();
  void build_loop();
  void publish_loop();

  record::Recorder& rec_;
  const graph::PlanOptions plan_;
  std::vector<SigMsg> pending_;  // drain thread: messages made under the trace lock, sent after it
  Channel<SigMsg> to_detect_{1 << 12};  // one message per drained batch (<= 256 ops)
  Channel<BuildMsg> to_build_{64};
  Channel<PublishMsg> to_publish_{64};
  mutable std::mutex latest_mu_;  // guards latest_ (Note [Publishing under a mutex])
  std::shared_ptr<const graph::Iteration> latest_;
  std::atomic<std::uint64_t> next_token_{1};
  std::atomic<std::uint64_t> published_token_{0};
  std::atomic<bool> reuse_{true};
  std::atomic<std::uint64_t> ops_seen_{0}, detections_{0}, builds_{0}, reused_{0}, rewired_{0},
      published_{0}, last_build_ns_{0}, last_copy_ns_{0}, last_build_cpu_ns_{0}, last_reuse_ns_{0},
      last_rewire_ns_{0}, cached_{0}, last_graph_ns_{0}, last_dag_ns_{0}, last_plan_ns_{0}, recycled_{0},
      last_build_faults_{0};
  std::shared_ptr<TracePool> trace_pool_;
  mutable std::mutex reason_mu_;
  std::string last_reason_ = "no ops recorded yet";
  bool last_periodic_ = false, last_any_ = false;  // under reason_mu_, as last_thread_
  std::uint32_t last_thread_ = 0;
  std::thread detect_, build_, publish_;
};

}  // namespace crucible::pipeline
