// KernelCache.h — compiled artefacts keyed by (content hash, target/recipe hash).
//
// Threads: any number of readers call find() concurrently with one writer calling insert()
// (more writers are also safe, they serialise). A reader sees either the state before an insert
// or after it, never a torn entry: entries are immutable once inserted and published under a
// reader/writer lock (readers share it, a writer holds it alone for one hash-map insert,
// ~100 ns). Values are shared_ptr<const V>, so a reader keeps its value alive even if the entry
// is later replaced.
//
// The lock prefers writers: once a writer waits, new readers queue behind it. glibc's default
// rwlock (what std::shared_mutex is on Linux) prefers readers: three readers looking up in a
// loop on two cores keep it shared almost always, and an insert can wait tens of seconds.
#pragma once

#include <pthread.h>

#include <memory>
#include <mutex>
#include <shared_mutex>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/ContentHash.h"

namespace crucible::graph {

struct KernelKey {
  ContentHash content;  // what is computed (a MerkleDag node or region hash)
  ContentHash target;   // for which target and numerical recipe
  bool operator==(const KernelKey&) const = default;
  template <class H>
  friend H AbslHashValue(H h, const KernelKey& k) {
    return H::combine(std::move(h), k.content.lo, k.content.hi, k.target.lo, k.target.hi);
  }
};

// A pthread rwlock set to prefer writers (non-recursive: a thread must not take the shared
// lock twice), with the names std::shared_lock / std::unique_lock use.
class WriterPreferringRwLock {
 public:
  WriterPreferringRwLock() {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &a);
    pthread_rwlockattr_destroy(&a);
  }
  ~WriterPreferringRwLock() { pthread_rwlock_destroy(&lock_); }
  WriterPreferringRwLock(const WriterPreferringRwLock&) = delete;
  WriterPreferringRwLock& operator=(const WriterPreferringRwLock&) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

template <class V>
class KernelCache {
 public:
  std::shared_ptr<const V> find(const KernelKey& k) const {
    std::shared_lock<WriterPreferringRwLock> lock(mu_);
    auto it = map_.find(k);
    return it == map_.end() ? nullptr : it->second;
  }
  // Inserts or replaces; returns true if the key was new.
  bool insert(const KernelKey& k, std::shared_ptr<const V> v) {
    std::unique_lock<WriterPreferringRwLock> lock(mu_);
    return map_.insert_or_assign(k, std::move(v)).second;
  }
  std::size_t size() const {
    std::shared_lock<WriterPreferringRwLock> lock(mu_);
    return map_.size();
  }

 private:
  mutable WriterPreferringRwLock mu_;
  absl::flat_hash_map<KernelKey, std::shared_ptr<const V>> map_;
};

}  // namespace crucible::graph
