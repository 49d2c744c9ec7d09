// AllocationTags.cpp — see AllocationTags.h, Note [Allocation tags].
#include "AllocationTags.h"

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "Capture.h"
#include "ReplayArena.h"

namespace crucible::vessel::detail {
namespace {

constexpr std::size_t kHeader = sizeof(TagHeader);
// The smallest page: a header never lies on a page its data is not on.
constexpr std::uintptr_t kPage = 4096;

// The check word's key (TagHeader::check = key ^ data address), random per process: tensor
// data written just before an untagged block cannot match it except by chance (2^-64 per raw
// free). Made in tagging_acquire, before any block is tagged, never first inside a deleter.
std::uint64_t check_key() {
  static const std::uint64_t key = [] {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd() ^ 0x43727563'69626c65ULL;
  }();
  return key;
}

// Ids come in blocks per thread, so allocating threads share one atomic once per 1024 ids.
constexpr std::uint64_t kIdBlock = 1024;
std::atomic<std::uint64_t> g_next_id{1};
constinit thread_local std::uint64_t t_id_next = 0;
constinit thread_local std::uint64_t t_id_end = 0;

std::atomic<int> g_recording_threads{0};
std::atomic<bool> g_tags_made{false};  // set once the key exists: before, no block is tagged
std::atomic<std::uint64_t> g_raw_frees{0};
std::mutex g_mu;
// Leaked, like every global a thread may reach during static destruction.
std::string& unavailable() {
  static std::string* s = new std::string(
      "storages are named by the weak-reference table: no thread has enabled recording yet");
  return *s;
}

}  // namespace

std::uint64_t fresh_storage_id() {
  if (t_id_next == t_id_end) {
    t_id_next = g_next_id.fetch_add(kIdBlock, std::memory_order_relaxed);
    t_id_end = t_id_next + kIdBlock;
  }
  return t_id_next++;
}

void tagged_delete(void* data) {
  auto* h = reinterpret_cast<TagHeader*>(static_cast<char*>(data) - kHeader);
  // The header sits just after the previous block's bytes: a check word that does not match
  // means something overran into it, and its deleter pointer must not be called.
  if (__atomic_load_n(&h->check, __ATOMIC_RELAXED) !=
      (check_key() ^ reinterpret_cast<std::uintptr_t>(data))) {
    std::fprintf(
        stderr,
        "crucible: the allocation header before %p is corrupted (a write overran the block "
        "before it); aborting instead of calling its deleter\n",
        data);
    std::abort();
  }
  const c10::DeleterFnPtr deleter = h->deleter;
  void* ctx = h->ctx;
  // A stale header must never match: the base allocator may hand this address out again.
  __atomic_store_n(&h->check, std::uint64_t{0}, __ATOMIC_RELAXED);
  if (deleter != nullptr) deleter(ctx);
}

c10::DataPtr tagged_allocate(c10::Allocator& base, std::size_t n) {
  if (n > SIZE_MAX - 2 * kHeader) return base.allocate(n);  // the base refuses it; untagged
  c10::DataPtr inner = base.allocate(n + 2 * kHeader);
  char* b = static_cast<char*>(inner.get());
  if (b == nullptr) return inner;
  // The data starts at least a header's length into its page (see the Note): one header in
  // front, or two when one would put the data at a page's start.
  char* data = b + kHeader;
  if (reinterpret_cast<std::uintptr_t>(data) % kPage < kHeader) data += kHeader;
  const c10::Device device = inner.device();
  auto* h = reinterpret_cast<TagHeader*>(data - kHeader);
  h->id = fresh_storage_id();
  h->deleter = inner.get_deleter();
  h->ctx = inner.release_context();
  __atomic_store_n(&h->check, check_key() ^ reinterpret_cast<std::uintptr_t>(data),
                   __ATOMIC_RELAXED);
  return c10::DataPtr(data, data, &tagged_delete, device);
}

// Reads the 64 bytes before a pointer that may belong to any allocator: inside the pointer's
// own page (mapped), but not memory the sanitizers see as this block's.
__attribute__((no_sanitize("address", "thread", "undefined"))) bool free_if_tagged(void* data) {
  const auto a = reinterpret_cast<std::uintptr_t>(data);
  if (!g_tags_made.load(std::memory_order_acquire)) return false;  // no block was ever tagged
  if (data == nullptr || a % kPage < kHeader) return false;
  const auto* h = reinterpret_cast<const TagHeader*>(a - kHeader);
  if (__atomic_load_n(&h->check, __ATOMIC_RELAXED) != (check_key() ^ a)) return false;
  tagged_delete(data);
  g_raw_frees.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t tagged_raw_frees() { return g_raw_frees.load(std::memory_order_relaxed); }

bool tagging() { return g_recording_threads.load(std::memory_order_relaxed) > 0; }

void tagging_acquire() {
  std::lock_guard<std::mutex> g(g_mu);
  static const bool once = [] {
    (void)check_key();  // here, not first inside a deleter (random_device may throw)
    g_tags_made.store(true, std::memory_order_release);
    // A forked child (DataLoader workers) keeps only the forking thread, and that one stops
    // recording there (Note [Forked children], Dispatch.cpp): nothing records, nothing tags.
    // The mutexes a concurrent enable(), plan install or raw free may hold are taken around the
    // fork, so the child never inherits them locked.
    pthread_atfork(
        [] {
          g_mu.lock();
          lock_arena_for_fork();
        },
        [] {
          unlock_arena_after_fork();
          g_mu.unlock();
        },
        [] {
          stop_recording_in_forked_child();
          g_recording_threads.store(0, std::memory_order_relaxed);
          unlock_arena_after_fork();
          g_mu.unlock();
        });
    return true;
  }();
  (void)once;
  const std::string why = ensure_arena_allocator();
  unavailable() = why.empty() ? "" : "storages are named by the weak-reference table: " + why;
  g_recording_threads.fetch_add(1, std::memory_order_relaxed);
}

void tagging_release() { g_recording_threads.fetch_sub(1, std::memory_order_relaxed); }

std::string tagging_unavailable() {
  std::lock_guard<std::mutex> g(g_mu);
  return unavailable();
}

}  // namespace crucible::vessel::detail
