// ReplayArena.h — the static arena of an ExecutionPlan (Replay.cpp).
//
// A plan runs the same kernels in the same order every time, so the calling thread asks the
// CPU allocator for the same sizes in the same order every time. The first run of a plan is
// profiled: every allocation of the calling thread is logged with when it was made and when
// it was freed. From that log each allocation gets an offset in one arena (greedy, largest
// first, blocks whose lifetimes overlap never overlap in memory); allocations still alive when
// the run ends (returned tensors, gradients bound to .grad) escape and keep coming from the
// normal allocator. Later runs are served from the arena by sequence number, with no
// allocator call at all; a request whose size differs from the profile turns the arena off
// for the rest of that run and for the plan (counted: nothing is wrong, it is only slower).
//
// The arena works through a wrapper installed once as PyTorch's CPU allocator: a thread not
// running a plan pays one thread-local check per allocation and gets the original allocator.
// Allocations of intra-op worker threads are not the calling thread's and are not touched.
//
// Note [One arena]: a plan that runs through the exec stage has two arenas, the Runner's (its
// slots, each live over a range of calls) and this one (ATen's own allocations inside the run:
// results of the calls the ATen provider lets allocate, their workspaces). The second mostly
// lives in the gaps of the first: a block ATen takes during call 40 and frees after call 52
// can sit in bytes no slot uses from call 40 to 52. So the profiled run also notes the call the
// Runner is at for every allocation and free (Note [Run position]: the Runner says where it
// is through RunArgs::at_call), and the planner places each block first in the Runner's
// arena, clear of every slot live over its calls (widened to whole kernels) and of every block
// live beside it, and only what does not fit in a buffer of its own. Serving such a block is
// safe only if it is gone by the time a slot may reuse its bytes: each kernel start checks that
// every exec-placed block the profile freed before that call is freed (else the run stops with
// an error, before anything writes there: loud, though the step has then run part way); a block
// served at another call than profiled comes from the allocator instead; one still alive after
// the run retires both arenas (the Runner takes a fresh one, the old memory is never freed); and
// a plan whose exec stage is replaced or dropped plans its arena again (exec_changed). A block
// another thread frees is not seen by this thread's scope: it counts as still held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crucible::vessel {

struct AllocLog;  // one profiled run (ReplayArena.cpp)

struct ArenaPlan {
  std::vector<std::size_t> sizes;     // requested bytes, in request order
  std::vector<std::int64_t> offsets;  // -1: escapes the run (or empty): normal allocator
  std::size_t arena_bytes = 0;        // the arena's size
  std::size_t lower_bound = 0;        // most bytes (64-aligned) live at once: no arena can be smaller
  std::size_t escaping = 0;           // allocations that outlive the run
  std::size_t served = 0;             // allocations that come from the arena
  std::vector<std::size_t> free_order;    // arena blocks in the order the profiled run freed them
  std::vector<std::size_t> frees_before;  // per allocation: arena blocks freed before it was made
  std::unique_ptr<unsigned char, void (*)(void*)> buffer{nullptr, nullptr};
  // Note [One arena]: blocks placed in the exec Runner's arena (their offsets are in it).
  std::vector<std::uint8_t> in_exec;          // per allocation
  std::vector<std::uint32_t> alloc_call;      // per allocation: the call it was made at
  std::vector<std::uint32_t> free_call;       // per allocation: the call it was freed at
  unsigned char* exec_base = nullptr;
  std::size_t exec_bytes = 0;
  std::size_t exec_served = 0;                // allocations served from the exec arena
  std::shared_ptr<void> exec_keep;            // keeps the exec arena's owner alive
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> exec_registered{nullptr, nullptr};
};

// The exec Runner's arena as Note [One arena] plans into it.
struct ExecArena {
  struct Use {
    std::uint64_t offset = 0, bytes = 0;
    std::uint32_t first = 0, last = 0;  // calls, inclusive
  };
  unsigned char* base = nullptr;
  std::size_t bytes = 0;
  std::uint32_t calls = 0;
  std::vector<Use> uses;
  std::shared_ptr<void> keep;  // owns the Runner (so the memory outlives the plan's arena)
};

// Thread-local allocation mode for the duration of a scope. Only one per thread at a time.
class AllocScope {
 public:
  struct Mode;  // ReplayArena.cpp
  // Logs every allocation of this thread into `log` (see finish_profile).
  static AllocScope profile(std::shared_ptr<AllocLog> log);
  // Serves this thread's allocations from `arena` by sequence number.
  static AllocScope serve(ArenaPlan& arena);
  AllocScope(AllocScope&& o) noexcept;
  AllocScope(const AllocScope&) = delete;
  AllocScope& operator=(const AllocScope&) = delete;
  ~AllocScope();
  // Serve mode: did a request differ from the profile? (the rest came from the allocator)
  bool mismatched() const;
  // Serve mode: is an arena block still referenced (it would outlive the run)?
  bool arena_blocks_alive() const;
  std::size_t requests() const;

 private:
  explicit AllocScope(std::unique_ptr<Mode> m);
  std::unique_ptr<Mode> mode_;
};

// Installs the wrapper allocator (once per process). Returns "" or why it cannot (another
// allocator with a higher priority owns the CPU slot).
std::string ensure_arena_allocator();
// Around fork() (AllocationTags.cpp): the child must inherit neither the install mutex nor the
// blocks' (taken by every raw free through the wrapper) locked. Install, then blocks.
void lock_arena_for_fork();
void unlock_arena_after_fork();

std::shared_ptr<AllocLog> new_alloc_log();
// After a run left an arena block alive: the arena is never reused or freed again.
void retire_arena(ArenaPlan& arena);
// Closes the log (later frees are escapes'); returns how many allocations it holds.
std::size_t close_log(AllocLog& log);
// Closes the log and plans the arena from it; with `exec`, blocks go into its free space first
// (Note [One arena]).
ArenaPlan finish_profile(AllocLog& log, const ExecArena* exec = nullptr);
// Note [Run position]: where the exec Runner is in the run under this thread's scope (a call;
// kernel_start: before a kernel). Returns "" or why the run must stop before the kernel.
std::string arena_at_call(std::uint32_t call, bool kernel_start);
// Peak bytes live on the profiled thread during the logged scope (64-aligned sizes).
std::size_t log_peak(const AllocLog& log);

}  // namespace crucible::vessel
