// WorkerPool.h — the CPU backend's threads for one large generated loop (Note [Split loops],
// CpuBackend.cpp): a process-wide pool of parked workers that run the parts of one job while the
// calling thread runs the first.
#pragma once

#include <cstdint>
#include <functional>

namespace crucible::mimic {

class WorkerPool {
 public:
  // The process's pool, started on first use with `threads` - 1 workers (later calls with
  // another count get the pool as it is); never destroyed (a worker may be parked at exit).
  static WorkerPool& shared(unsigned threads);
  unsigned threads() const { return threads_; }
  // Runs part(i) for i in [0, parts) (parts <= threads()): part 0 on the calling thread, the
  // others on workers; returns when all are done. One job at a time: a second caller waits. In
  // a forked child (the workers stayed in the parent) every part runs on the calling thread.
  void run(unsigned parts, const std::function<void(unsigned)>& part);

 private:
  explicit WorkerPool(unsigned threads);
  void work(unsigned id);
  struct State;
  State* s_;
  unsigned threads_;
};

}  // namespace crucible::mimic
