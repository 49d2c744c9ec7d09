// WorkerPool.cpp — see WorkerPool.h.
#include "crucible/mimic/WorkerPool.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

namespace crucible::mimic {

struct WorkerPool::State {
  std::mutex job_mu;  // one job at a time
  std::mutex mu;
  std::condition_variable wake, done;
  std::uint64_t generation = 0;  // bumped per job; a worker runs each generation once
  unsigned parts = 0, remaining = 0;
  const std::function<void(unsigned)>* part = nullptr;
  std::vector<std::thread> workers;
  pid_t pid = getpid();  // a forked child has no workers: it runs every part itself
};

WorkerPool& WorkerPool::shared(unsigned threads) {
  static WorkerPool* pool = new WorkerPool(std::clamp(threads, 1u, 256u));
  return *pool;
}

WorkerPool::WorkerPool(unsigned threads) : s_(new State), threads_(threads) {
  for (unsigned id = 1; id < threads; ++id) s_->workers.emplace_back([this, id] { work(id); });
  for (std::thread& t : s_->workers) t.detach();
}

void WorkerPool::work(unsigned id) {
  std::uint64_t seen = 0;
  while (true) {
    const std::function<void(unsigned)>* part = nullptr;
    {
      std::unique_lock<std::mutex> l(s_->mu);
      s_->wake.wait(l, [&] { return s_->generation != seen; });
      seen = s_->generation;
      if (id >= s_->parts) continue;  // this job has fewer parts than workers
      part = s_->part;
    }
    (*part)(id);
    std::lock_guard<std::mutex> l(s_->mu);
    if (--s_->remaining == 0) s_->done.notify_one();
  }
}

void WorkerPool::run(unsigned parts, const std::function<void(unsigned)>& part) {
  parts = std::clamp(parts, 1u, threads_);
  if (parts == 1 || getpid() != s_->pid) {
    for (unsigned i = 0; i < parts; ++i) part(i);
    return;
  }
  std::lock_guard<std::mutex> job(s_->job_mu);
  {
    std::lock_guard<std::mutex> l(s_->mu);
    s_->part = &part;
    s_->parts = parts;
    s_->remaining = parts - 1;
    ++s_->generation;
  }
  s_->wake.notify_all();
  part(0);
  std::unique_lock<std::mutex> l(s_->mu);
  s_->done.wait(l, [&] { return s_->remaining == 0; });
}

}  // namespace crucible::mimic
