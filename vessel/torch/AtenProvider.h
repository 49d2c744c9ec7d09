// AtenProvider.h — the exec stage's library calls performed by ATen (Note [ATen provider],
// AtenProvider.cpp): a plan's call, whose tensors the runner has placed, becomes one call of the
// recorded operator on tensors that wrap that memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <exception>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "crucible/core/Status.h"
#include "crucible/exec/Backend.h"

namespace crucible::vessel {

struct AtenProviderStats {
  std::uint64_t calls = 0;
  std::uint64_t in_place = 0;  // the operator writes its own arguments (add_, an out= overload)
  std::uint64_t out_variant = 0;  // a functional operator run through its out= overload
  std::uint64_t functional = 0;  // the functional operator ran (no out= overload, or one not worth it)
  std::uint64_t copied = 0;      // results of those copied into the placed memory (not adopted)
  std::uint64_t allocations = 0;  // empty, new_empty_strided...: placed memory, nothing to run
  std::uint64_t reused = 0;   // calls whose argument stack was kept from the call's previous run
  std::uint64_t adopted = 0;  // results whose own memory became their slot's (no copy)
  std::uint64_t placed_late = 0;  // results the runner gave memory only when ATen's did not fit
  // out= calls that raised where the functional operator then ran (Note [Wrong out= kernels])
  std::uint64_t out_failed = 0;
};

class AtenProvider {
 public:
  AtenProvider();
  ~AtenProvider();
  AtenProvider(const AtenProvider&) = delete;
  AtenProvider& operator=(const AtenProvider&) = delete;

  // The exec::Provider over this object; it must outlive every Runner given it.
  exec::Provider provider();
  // Performs one call, or says why it cannot (an operator this torch lacks, an argument the
  // trace does not hold in full, ATen's own error).
  Status call(const exec::LibraryCall& c);
  // Whether every call of `plan` can be performed as far as its records go: its operator
  // exists and each argument that is not a tensor comes back from its records (a string known
  // only by its hash may not). Checked before a plan runs, so that it is refused when built
  // instead of failing at its first run.
  Status check_arguments(const exec::ExecutionPlan& plan);
  // exec::Provider::allocates: the call runs its functional operator and hands its results over
  // (no out= overload, or one with no CPU kernel of its own, or a result the plan does not place).
  bool allocates(const exec::ExecutionPlan& plan, std::uint32_t call);
  const AtenProviderStats& stats() const { return stats_; }
  // The exception ATen raised in the last failed call (an index out of range: c10::IndexError),
  // null when the last failure was the provider's own; taking it clears it. A caller that
  // speaks to Python rethrows it, so the user gets eager's error type and message.
  std::exception_ptr take_error() { return std::exchange(error_, nullptr); }
  // The storage of a result the runner adopted (Note [Adopted results]) whose memory starts at
  // `base`; an empty Storage when none does.
  c10::Storage adopted_storage(const void* base) const;
  // Lets go of every adopted result (their memory is freed unless someone else holds it): for a
  // caller whose run is over and who took the outputs it needs.
  void release_adopted();

  struct Resolved;
  struct CallCache;

 private:
  Result<const Resolved*> resolve(std::string_view op);
  // Inside a catch handler: keeps the exception (take_error) and says which op failed how.
  Status failure(std::string_view op);
  // Calls the operator on a built argument stack; `outs`: the placed results by return position.
  // `placed`: the placed results in the call's output order.
  Status invoke(const exec::LibraryCall& c, const Resolved& rop, std::vector<c10::IValue> stack,
                const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& placed,
                std::vector<at::Tensor>* keep, bool* out_proven);
  std::unordered_map<std::string, std::unique_ptr<Resolved>> ops_;
  // Per call of the last plan: its operator and its last argument stack (Note [ATen provider]).
  const exec::ExecutionPlan* cache_plan_ = nullptr;
  std::vector<std::unique_ptr<CallCache>> cache_;
  AtenProviderStats stats_;
  std::exception_ptr error_;
};

}  // namespace crucible::vessel
