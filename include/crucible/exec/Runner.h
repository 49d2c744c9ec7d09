// Runner.h — runs a verified execution plan on a backend, once per step, allocating nothing
// (but memory for a result a provider said it would hand over and could not: made on the first
// run that needs it, kept for the next).
//
// Runner::make verifies the plan, fills the backend's default slots, lets it prepare, places
// the arena for how the backend uses memory (Note [Memory use], ExecutionPlan.h) and allocates
// it once. Each run binds the step's memory from outside (one base pointer per
// Input and per Output binding), writes the Constant slots (patched or recorded), applies the
// scalar patches to its copy of the scalars, and runs the kernels in order.
//
// Threads: a Runner is not shared between threads while it runs: run() uses its own tensor and
// scalar tables. Two Runners of one plan may run at once on different threads (each has its
// own arena), as far as their backend and provider allow.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/exec/Backend.h"
#include "crucible/exec/ExecutionPlan.h"

namespace crucible::exec {

struct RunArgs {
  std::span<void* const> inputs;   // base of each input binding's storage (plan.inputs order)
  std::span<void* const> outputs;  // memory of each output binding, at least its slot's bytes
  // One per patch point (plan.patches order), or empty to run the recorded values: a Scalar
  // patch's new ScalarRecord::bits; a Constant patch's value as IEEE-754 double bits.
  std::span<const std::uint64_t> patches;
  // Note [Adopted results]: output bindings may be adopted too (a provider's own memory takes the
  // place of the bound one); the caller reads where each output ended up from output_data().
  bool outputs_may_move = false;
  // Optional: told where the run is (Note [Run position]): before each kernel (its first call,
  // kernel_start true; a non-ok Status stops the run before the kernel), before each library
  // call, and after each kernel (its last call, before the releases that follow it).
  Status (*at_call)(void* observer, std::uint32_t call, bool kernel_start) = nullptr;
  void* observer = nullptr;
};

// A placed slot's memory in a Runner's arena and the calls it is live over, inclusive (span
// ends: Note [Memory use]): outside them the bytes are free for others (Note [One arena],
// vessel/torch/ReplayArena.h).
struct ArenaUse {
  std::uint64_t offset = 0, bytes = 0;
  std::uint32_t first = 0, last = 0;
};

class Runner {
 public:
  // The plan must outlive the Runner. Errors: a plan verify_plan refuses, a backend without a
  // required slot, a provider without its call, the backend's prepare, an arena that cannot be
  // had.
  static Result<std::unique_ptr<Runner>> make(const ExecutionPlan& plan, Backend backend,
                                              Provider provider);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // One step. Errors: bindings or patches of the wrong count or null, a provider or backend
  // error (named with the kernel and call). A run that fails part way leaves what it wrote.
  Status run(const RunArgs& args);

  // The arena this Runner placed (Note [Memory use]).
  std::uint64_t arena_bytes() const { return arena_bytes_; }
  // The slot's offset in this Runner's arena, or nullopt for a slot without memory there (not
  // an Arena or Constant slot, or one the backend never touches).
  std::optional<std::uint64_t> slot_offset(std::uint32_t slot) const {
    if (slot >= placed_.size() || !placed_[slot]) return std::nullopt;
    return offsets_[slot];
  }
  // Every placed slot's bytes and calls (Note [One arena]).
  std::vector<ArenaUse> arena_uses() const;
  void* arena_data() const { return arena_; }
  std::size_t calls() const { return plan_.calls.size(); }
  // A fresh arena for the runs to come; the old one stays allocated, never reused, until the
  // Runner goes (memory placed in its free space may still be held: whoever holds it keeps the
  // Runner, Note [One arena]). Errors: the memory cannot be had.
  Status renew_arena();
  // After a run: where each output binding's memory is (the bound memory, or an adopted one).
  void* output_data(std::uint32_t binding) const { return slot_base_[plan_.outputs[binding]]; }
  std::string_view backend_name() const { return backend_.name; }

 private:
  Runner(const ExecutionPlan& plan, Backend backend, Provider provider);
  static Status library_call(void* self, std::uint32_t call);
  // Note [Adopted results] (Backend.h), for the call library_call is running.
  static bool adoptable(void* self, std::uint32_t output);
  static bool adopt(void* self, std::uint32_t output, void* data, std::uint64_t before,
                    std::uint64_t after);
  static void* place(void* self, std::uint32_t output);
  void point_slot(std::uint32_t slot, void* base);  // the slot and its tensors at `base`

  const ExecutionPlan& plan_;
  Backend backend_;
  Provider provider_;
  void* arena_ = nullptr;
  std::uint64_t arena_bytes_ = 0;
  std::vector<std::uint64_t> offsets_;  // per slot, in this Runner's arena
  std::vector<bool> placed_;            // per slot: has memory in the arena
  std::vector<std::pair<std::uint32_t, std::uint32_t>> live_;  // per slot: calls placed for
  std::vector<void*> old_arenas_;       // renewed away from: never reused, freed with the Runner
  Status (*at_call_)(void*, std::uint32_t, bool) = nullptr;  // this run's RunArgs observer
  void* observer_ = nullptr;
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  // Per slot placed no memory for a provider that allocates: memory of its own, made the first
  // time ATen's did not fit (place).
  std::vector<std::unique_ptr<void, FreeDeleter>> spill_;
  // Per kernel: the calls whose results are all dead once it has run (Provider::release).
  std::vector<std::vector<std::uint32_t>> release_after_;
  std::vector<void*> slot_base_;               // this run's base of every slot
  std::vector<void*> tensor_data_;             // this run's element 0 of every tensor
  std::vector<record::ScalarRecord> scalars_;  // this run's scalars
  std::vector<TensorArg> call_args_;
  std::uint32_t current_call_ = 0;                       // the call library_call runs
  bool outputs_may_move_ = false;                        // this run's RunArgs::outputs_may_move
  std::vector<std::vector<std::uint32_t>> slot_tensors_;  // per slot: its tensors
  std::vector<std::uint64_t> slot_extent_;                // per slot: bytes its tensors reach
};

}  // namespace crucible::exec
