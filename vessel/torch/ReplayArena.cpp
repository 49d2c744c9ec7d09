// ReplayArena.cpp — see ReplayArena.h.
#include "ReplayArena.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <numeric>

#include "AllocationTags.h"
#include "absl/container/flat_hash_map.h"

namespace crucible::vessel {

namespace {
constexpr std::size_t kAlign = 64;  // PyTorch's CPU allocator aligns to 64 bytes as well
std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The lowest offset where `size` bytes miss every (offset, end) range in `busy` (sorted here).
std::int64_t first_fit(std::vector<std::pair<std::int64_t, std::int64_t>>& busy, std::int64_t size) {
  std::sort(busy.begin(), busy.end());
  std::int64_t off = 0;
  for (const auto& b : busy) {
    if (b.first >= off + size) break;
    off = std::max(off, b.second);
  }
  return off;
}
}  // namespace

struct AllocLog {
  std::mutex mu;  // a logged block may be freed on another thread
  std::vector<std::size_t> sizes;
  std::vector<std::int64_t> alloc_ev, free_ev;  // event numbers; free_ev -1 while alive
  std::vector<std::uint32_t> alloc_call, free_call;  // Note [One arena]: where the Runner was
  std::atomic<std::uint32_t> position{0};            // Note [Run position]; 0 outside exec runs
  std::int64_t ev = 0;
  bool open = true;  // closed when the run ends: later frees belong to escaping blocks
  std::size_t live = 0, peak = 0;
};

struct AllocScope::Mode {
  enum Kind { Log, Serve } kind;
  Mode* outer = nullptr;  // the scope this one hides
  std::shared_ptr<AllocLog> log;
  ArenaPlan* arena = nullptr;
  std::size_t next = 0;
  bool mismatch = false;
  // Serve: arena blocks alive now, by offset (an arena block's only name), and how many have
  // been freed, which must follow the profiled order exactly.
  absl::flat_hash_map<const unsigned char*, std::size_t> live_at;
  std::size_t next_free = 0;
  std::uint32_t position = 0;          // Note [Run position]
  std::vector<std::size_t> exec_live;  // served blocks alive in the exec arena (Note [One arena])
};

namespace {
thread_local AllocScope::Mode* t_mode = nullptr;

// A profiled block. Its DataPtr's context is its data pointer (raw_allocate requires that),
// so blocks are found by address.
struct Tracked {
  c10::DataPtr base;
  std::shared_ptr<AllocLog> log;
  std::size_t idx;
  std::size_t bytes;
};
std::mutex g_blocks_mu;
absl::flat_hash_map<void*, Tracked*> g_tracked;                // profiled blocks, by address
std::vector<std::pair<const unsigned char*, const unsigned char*>> g_arenas;  // live arena buffers
c10::DeleterFnPtr g_base_raw_deleter = nullptr;

// Every block the wrapper hands out with a context equal to its data goes through here when
// freed raw (raw_deallocate): a profiled block is logged and freed by its base DataPtr, an
// arena block is left alone, a tagged block (Note [Allocation tags]) goes back through its
// header, anything else is the base allocator's.
void arena_delete(void* ptr);

void wrapper_delete(void* ptr) {
  if (ptr == nullptr) return;
  Tracked* t = nullptr;
  bool in_arena = false;
  {
    std::lock_guard<std::mutex> g(g_blocks_mu);
    auto it = g_tracked.find(ptr);
    if (it != g_tracked.end()) {
      t = it->second;
      g_tracked.erase(it);
    } else {
      const auto* p = static_cast<const unsigned char*>(ptr);
      for (const auto& a : g_arenas) in_arena |= p >= a.first && p < a.second;
    }
  }
  if (in_arena) {  // an arena block freed raw (raw_deallocate)
    arena_delete(ptr);
    return;
  }
  if (t == nullptr) {
    if (detail::free_if_tagged(ptr)) return;  // a tagged block freed raw (Note [Allocation tags])
    if (g_base_raw_deleter != nullptr) g_base_raw_deleter(ptr);
    return;
  }
  {
    std::lock_guard<std::mutex> g(t->log->mu);
    if (t->log->open) {
      t->log->free_ev[t->idx] = t->log->ev++;
      t->log->free_call[t->idx] = t->log->position.load(std::memory_order_relaxed);
      t->log->live -= t->bytes;
    }
  }
  delete t;  // frees the block through the original allocator's deleter
}

void unregister_arena(unsigned char* p) {  // one registration (the same exec arena may have two)
  std::lock_guard<std::mutex> g(g_blocks_mu);
  auto it = std::find_if(g_arenas.begin(), g_arenas.end(), [p](const auto& a) { return a.first == p; });
  if (it != g_arenas.end()) g_arenas.erase(it);
}

void free_arena(void* p) {
  unregister_arena(static_cast<unsigned char*>(p));
  std::free(p);
}

// The arena owns the memory; freeing a block only moves the run's bookkeeping on. A block
// freed outside its run (it outlived it) changes nothing: that run already found it alive at
// its end and retired the arena, whose memory then stays allocated for good.
void arena_delete(void* ptr) {
  AllocScope::Mode* m = t_mode;
  if (m == nullptr || m->kind != AllocScope::Mode::Serve || m->arena == nullptr) return;
  const ArenaPlan& a = *m->arena;
  const auto* p = static_cast<const unsigned char*>(ptr);
  auto it = m->live_at.find(p);
  if (it == m->live_at.end()) {
    const auto* base = a.buffer.get();
    const bool ours = (base != nullptr && p >= base && p < base + a.arena_bytes) ||
                      (a.exec_base != nullptr && p >= a.exec_base && p < a.exec_base + a.exec_bytes);
    if (ours) m->mismatch = true;
    return;
  }
  const std::size_t idx = it->second;
  m->live_at.erase(it);
  if (!a.in_exec.empty() && a.in_exec[idx]) std::erase(m->exec_live, idx);
  if (m->next_free >= a.free_order.size() || a.free_order[m->next_free] != idx) m->mismatch = true;
  ++m->next_free;
}

class Wrapper final : public c10::Allocator {
 public:
  explicit Wrapper(c10::Allocator* base) : base_(base) {}

#if CRUCIBLE_ALLOCATOR_CONST_ALLOCATE
  c10::DataPtr allocate(std::size_t n) const override { return route(n); }
#else
  c10::DataPtr allocate(std::size_t n) override { return route(n); }
#endif
#if CRUCIBLE_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  // raw_allocate needs data == context: true of every block the wrapper hands out (the
  // base's own, tagged, arena and profiled blocks), and raw frees come to wrapper_delete.
  c10::DeleterFnPtr raw_deleter() const override { return &wrapper_delete; }

 private:
  c10::DataPtr route(std::size_t n) const {
    AllocScope::Mode* m = t_mode;
    if (m == nullptr) {
      // Tag only while this wrapper is PyTorch's allocator: raw frees come back to the current
      // allocator, and only this one knows a tagged block (Note [Allocation tags]).
      if (n != 0 && detail::tagging() && c10::GetCPUAllocator() == this)
        return detail::tagged_allocate(*base_, n);
      return base_->allocate(n);
    }
    return route_scoped(*m, n);
  }

  // Under an AllocScope (a compiled step's profiling run or its arena): out of line, so the
  // path every other allocation takes, recorded or not, spans few code lines.
  [[gnu::noinline]] c10::DataPtr route_scoped(AllocScope::Mode& mode, std::size_t n) const {
    AllocScope::Mode* m = &mode;
    if (m->kind == AllocScope::Mode::Log) {
      AllocLog& log = *m->log;
      c10::DataPtr b = base_->allocate(n);
      void* data = b.get();
      std::lock_guard<std::mutex> g(log.mu);
      const std::size_t idx = log.sizes.size();
      log.sizes.push_back(n);
      log.alloc_ev.push_back(log.ev++);
      log.free_ev.push_back(-1);
      log.alloc_call.push_back(log.position.load(std::memory_order_relaxed));
      log.free_call.push_back(UINT32_MAX);
      if (data == nullptr) return b;  // an empty block: nothing to place
      auto* t = new Tracked{std::move(b), m->log, idx, aligned(n)};
      log.live += t->bytes;
      log.peak = std::max(log.peak, log.live);
      {
        std::lock_guard<std::mutex> gb(g_blocks_mu);
        g_tracked[data] = t;
      }
      return c10::DataPtr(data, data, &wrapper_delete, c10::Device(c10::DeviceType::CPU));
    }
    ArenaPlan& a = *m->arena;
    const std::size_t idx = m->next++;
    if (m->mismatch || idx >= a.sizes.size() || a.sizes[idx] != n) {
      m->mismatch = true;
      return base_->allocate(n);
    }
    const std::int64_t off = a.offsets[idx];
    if (off < 0) return base_->allocate(n);
    // Every block the profile freed before this one was allocated must be free now (in the
    // profiled order): then no live block shares these bytes.
    if (m->next_free != a.frees_before[idx]) {
      m->mismatch = true;
      return base_->allocate(n);
    }
    const bool in_exec = !a.in_exec.empty() && a.in_exec[idx];
    // Note [One arena]: at another call than profiled, slots may be using those bytes.
    if (in_exec && m->position != a.alloc_call[idx]) {
      m->mismatch = true;
      return base_->allocate(n);
    }
    unsigned char* p = (in_exec ? a.exec_base : a.buffer.get()) + off;
    m->live_at[p] = idx;
    if (in_exec) m->exec_live.push_back(idx);
    return c10::DataPtr(p, p, &arena_delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* base_;
};

std::mutex g_allocator_install_mu;
Wrapper* g_wrapper = nullptr;
}  // namespace

void lock_arena_for_fork() {
  g_allocator_install_mu.lock();
  g_blocks_mu.lock();
}
void unlock_arena_after_fork() {
  g_blocks_mu.unlock();
  g_allocator_install_mu.unlock();
}

std::string ensure_arena_allocator() {
  std::lock_guard<std::mutex> g(g_allocator_install_mu);
  if (g_wrapper != nullptr) {
    if (c10::GetCPUAllocator() != g_wrapper)
      return "another library replaced PyTorch's CPU allocator after Crucible's arena wrapper was installed";
    return "";
  }
  c10::Allocator* base = c10::GetCPUAllocator();
  g_base_raw_deleter = base->raw_deleter();
  auto* w = new Wrapper(base);  // leaked: tensors may be freed during static destruction
  // c10's allocator table is read with plain loads by threads already allocating: the wrapper's
  // fields and g_base_raw_deleter must be visible before its pointer is (weakly ordered CPUs).
  std::atomic_thread_fence(std::memory_order_release);
  c10::SetCPUAllocator(w, /*priority=*/1);
  if (c10::GetCPUAllocator() != w) {
    c10::SetCPUAllocator(base, 0);
    return "another CPU allocator with a higher priority is installed; the plan runs without its arena";
  }
  g_wrapper = w;
  return "";
}

std::shared_ptr<AllocLog> new_alloc_log() { return std::make_shared<AllocLog>(); }

std::size_t log_peak(const AllocLog& log) { return log.peak; }

std::size_t close_log(AllocLog& log) {
  std::lock_guard<std::mutex> g(log.mu);
  log.open = false;
  return log.sizes.size();
}

std::string arena_at_call(std::uint32_t call, bool kernel_start) {
  AllocScope::Mode* m = t_mode;
  if (m == nullptr) return "";
  if (m->kind == AllocScope::Mode::Log) {
    m->log->position.store(call, std::memory_order_relaxed);
    return "";
  }
  m->position = call;
  if (!kernel_start || m->arena == nullptr) return "";
  for (std::size_t idx : m->exec_live)
    if (m->arena->free_call[idx] < call) {
      m->mismatch = true;
      return "memory ATen took during call " + std::to_string(m->arena->alloc_call[idx]) +
             " of the compiled step (placed in the exec arena's free bytes, Note [One arena]) is still "
             "held at call " + std::to_string(call) + ", where the plan uses those bytes again; the run "
             "stopped before overwriting it. Run the step with crucible.compile(..., arena=False)";
    }
  return "";
}

ArenaPlan finish_profile(AllocLog& log, const ExecArena* exec) {
  close_log(log);
  std::lock_guard<std::mutex> g(log.mu);
  ArenaPlan a;
  const std::size_t n = log.sizes.size();
  a.sizes = log.sizes;
  a.offsets.assign(n, -1);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) {
    if (log.sizes[i] == 0) continue;
    if (log.free_ev[i] < 0) {
      ++a.escaping;
      continue;
    }
    order.push_back(i);
  }
  // Note [One arena]: first into the exec Runner's arena, largest first, clear of the slots live
  // over the block's calls and of the blocks placed there live beside it.
  std::vector<std::size_t> own;
  std::vector<std::int64_t> exec_offs(n, -1);
  a.in_exec.assign(n, 0);
  if (exec != nullptr && exec->base != nullptr && exec->bytes > 0) {
    std::vector<std::size_t> cand = order;
    std::stable_sort(cand.begin(), cand.end(), [&](std::size_t x, std::size_t y) {
      return aligned(log.sizes[x]) > aligned(log.sizes[y]);
    });
    std::vector<std::size_t> placed;
    std::vector<std::pair<std::int64_t, std::int64_t>> busy;
    for (std::size_t i : cand) {
      const std::uint32_t c0 = log.alloc_call[i], c1 = log.free_call[i];
      const auto size = static_cast<std::int64_t>(aligned(log.sizes[i]));
      if (c1 == UINT32_MAX || c0 > c1 || c1 >= exec->calls) {
        own.push_back(i);
        continue;
      }
      busy.clear();
      for (const ExecArena::Use& u : exec->uses)
        if (u.first <= c1 && c0 <= u.last)
          busy.emplace_back(static_cast<std::int64_t>(u.offset), static_cast<std::int64_t>(aligned(u.offset + u.bytes)));
      for (std::size_t j : placed)
        if (log.alloc_ev[j] < log.free_ev[i] && log.alloc_ev[i] < log.free_ev[j])
          busy.emplace_back(exec_offs[j], exec_offs[j] + static_cast<std::int64_t>(aligned(log.sizes[j])));
      const std::int64_t off = first_fit(busy, size);
      if (off + size > static_cast<std::int64_t>(exec->bytes)) {
        own.push_back(i);
        continue;
      }
      exec_offs[i] = off;
      a.in_exec[i] = 1;
      placed.push_back(i);
    }
    std::sort(own.begin(), own.end());
    a.exec_served = placed.size();
  } else {
    own = order;
  }
  // Lower bound: the most bytes live at once among the blocks this arena's buffer will hold.
  {
    std::vector<std::pair<std::int64_t, std::int64_t>> ev;  // (event, +bytes / -bytes)
    for (std::size_t i : own) {
      ev.emplace_back(log.alloc_ev[i], static_cast<std::int64_t>(aligned(log.sizes[i])));
      ev.emplace_back(log.free_ev[i], -static_cast<std::int64_t>(aligned(log.sizes[i])));
    }
    std::sort(ev.begin(), ev.end());
    std::int64_t live = 0, peak = 0;
    for (const auto& e : ev) peak = std::max(peak, live += e.second);
    a.lower_bound = static_cast<std::size_t>(peak);
  }
  // Greedy placement, lowest offset that fits, in three orders (largest first; allocation
  // order; longest-lived first); the smallest arena wins.
  auto place = [&](const std::vector<std::size_t>& ord, std::vector<std::int64_t>& offs) {
    std::size_t bytes = 0;
    std::vector<std::size_t> placed;
    std::vector<std::pair<std::int64_t, std::int64_t>> busy;  // (offset, end) of conflicting blocks
    for (std::size_t i : ord) {
      const std::int64_t size = static_cast<std::int64_t>(aligned(log.sizes[i]));
      busy.clear();
      for (std::size_t j : placed)
        if (log.alloc_ev[j] < log.free_ev[i] && log.alloc_ev[i] < log.free_ev[j])
          busy.emplace_back(offs[j], offs[j] + static_cast<std::int64_t>(aligned(log.sizes[j])));
      const std::int64_t off = first_fit(busy, size);
      offs[i] = off;
      bytes = std::max(bytes, static_cast<std::size_t>(off + size));
      placed.push_back(i);
    }
    return bytes;
  };
  std::vector<std::vector<std::size_t>> orders(3, own);
  std::stable_sort(orders[0].begin(), orders[0].end(), [&](std::size_t x, std::size_t y) {
    return aligned(log.sizes[x]) > aligned(log.sizes[y]);
  });
  std::stable_sort(orders[2].begin(), orders[2].end(), [&](std::size_t x, std::size_t y) {
    return log.free_ev[x] - log.alloc_ev[x] > log.free_ev[y] - log.alloc_ev[y];
  });
  a.arena_bytes = SIZE_MAX;
  for (const auto& ord : orders) {
    std::vector<std::int64_t> offs(n, -1);
    const std::size_t bytes = place(ord, offs);
    if (bytes < a.arena_bytes) {
      a.arena_bytes = bytes;
      a.offsets = std::move(offs);
    }
    if (a.arena_bytes == a.lower_bound) break;
  }
  if (own.empty()) a.arena_bytes = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (a.in_exec[i]) a.offsets[i] = exec_offs[i];
  a.served = order.size();
  a.alloc_call = log.alloc_call;
  a.free_call = log.free_call;
  {
    std::vector<std::size_t> by_free = order;
    std::sort(by_free.begin(), by_free.end(), [&](std::size_t x, std::size_t y) { return log.free_ev[x] < log.free_ev[y]; });
    a.free_order = by_free;
    a.frees_before.assign(n, 0);
    std::vector<std::int64_t> free_evs;
    for (std::size_t i : by_free) free_evs.push_back(log.free_ev[i]);
    for (std::size_t i : order)
      a.frees_before[i] = static_cast<std::size_t>(
          std::lower_bound(free_evs.begin(), free_evs.end(), log.alloc_ev[i]) - free_evs.begin());
  }
  if (a.arena_bytes > 0) {
    void* p = std::aligned_alloc(kAlign, a.arena_bytes);
    if (p == nullptr) {  // no memory for the arena: serve nothing from it
      a.offsets.assign(n, -1);
      a.in_exec.assign(n, 0);
      a.served = a.exec_served = 0;
    } else {
      std::lock_guard<std::mutex> gb(g_blocks_mu);
      g_arenas.emplace_back(static_cast<unsigned char*>(p), static_cast<unsigned char*>(p) + a.arena_bytes);
    }
    a.buffer = std::unique_ptr<unsigned char, void (*)(void*)>(static_cast<unsigned char*>(p), &free_arena);
  }
  if (a.exec_served > 0) {  // raw frees of blocks in it come to arena_delete (wrapper_delete)
    a.exec_base = exec->base;
    a.exec_bytes = exec->bytes;
    a.exec_keep = exec->keep;
    {
      std::lock_guard<std::mutex> gb(g_blocks_mu);
      g_arenas.emplace_back(exec->base, exec->base + exec->bytes);
    }
    a.exec_registered = std::unique_ptr<unsigned char, void (*)(unsigned char*)>(exec->base, &unregister_arena);
  }
  return a;
}

// Scopes nest (a plan run inside an allocation measurement): each restores the one it hid.
AllocScope::AllocScope(std::unique_ptr<Mode> m) : mode_(std::move(m)) {
  mode_->outer = t_mode;
  t_mode = mode_.get();
}
AllocScope::AllocScope(AllocScope&& o) noexcept : mode_(std::move(o.mode_)) {}
AllocScope::~AllocScope() {
  if (mode_ != nullptr && t_mode == mode_.get()) t_mode = mode_->outer;
}

AllocScope AllocScope::profile(std::shared_ptr<AllocLog> log) {
  auto m = std::make_unique<Mode>();
  m->kind = Mode::Log;
  m->log = std::move(log);
  return AllocScope(std::move(m));
}

AllocScope AllocScope::serve(ArenaPlan& arena) {
  auto m = std::make_unique<Mode>();
  m->kind = Mode::Serve;
  m->arena = &arena;
  return AllocScope(std::move(m));
}

bool AllocScope::mismatched() const { return mode_ != nullptr && mode_->mismatch; }
bool AllocScope::arena_blocks_alive() const { return mode_ != nullptr && !mode_->live_at.empty(); }

void retire_arena(ArenaPlan& a) {
  // A block is still referenced: the memory must never be reused nor freed. Forget the
  // buffer (it stays registered, so raw frees of its blocks stay no-ops) and serve nothing.
  (void)a.buffer.release();
  // The exec Runner's arena likewise: its owner is never destroyed (the Runner, when it runs on,
  // takes a fresh arena: settle_arena in Replay.cpp).
  (void)a.exec_registered.release();
  if (a.exec_keep != nullptr) (void)new std::shared_ptr<void>(std::move(a.exec_keep));
  a.offsets.assign(a.offsets.size(), -1);
  a.in_exec.assign(a.in_exec.size(), 0);
  a.served = a.exec_served = 0;
}
std::size_t AllocScope::requests() const { return mode_ != nullptr ? mode_->next : 0; }

}  // namespace crucible::vessel
