// Backend.h — what runs a plan's kernels: a backend (a struct of function slots, each required
// or optional with its default) and a provider (who performs one library call).
//
// A kernel of the plan is a sequence of calls, one per op. A backend may run a whole kernel its
// own way (generated code for a fused group); whatever it does not generate it runs as library
// calls, which go to the Provider: ATen on the PyTorch side (vessel/torch), reference kernels in
// tests. The null backend (NullBackend.h) runs every kernel as library calls: the skeleton a
// new backend copies.
//
// Threads: a Runner calls its backend and provider from the thread that called Runner::run, one
// call at a time; a backend that launches asynchronous work finishes it in `synchronize`.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "crucible/core/CKernel.h"
#include "crucible/core/Status.h"
#include "crucible/exec/ExecutionPlan.h"

namespace crucible::exec {

// One tensor of a call, resolved for this run.
struct TensorArg {
  void* data = nullptr;         // element 0 (slot base + offset)
  std::int8_t dtype = -1;       // c10 ordinal
  bool wrapped_number = false;  // a Python number as a 0-d tensor
  std::span<const std::int64_t> sizes;
  std::span<const std::int64_t> strides;  // in elements
  std::uint32_t arg_index = 0;            // schema argument / return position
  std::uint32_t list_index = 0;           // index inside a tensor list
  std::uint32_t tensor = kNone;           // the plan's tensor
};

// One library call: the op, its tensors (outputs already placed: the provider writes into
// them, it allocates nothing) and its scalar arguments for this run (patches applied).
//
// Note [Adopted results]: a provider whose operator can only allocate its results (an operator
// without an out= overload, or whose out= overload computes and then copies) may hand its own
// memory over for an output instead of copying into the placed one: `adoptable(runner, k)` says
// whether output k may be adopted (its slot is in the arena, or an output binding of a run whose
// caller allows it, RunArgs::outputs_may_move, and this call writes it first, so no call before
// read the placed memory), and `adopt(runner, k, data, before, after)` makes the
// memory holding output k's element 0 at `data` (valid from `before` bytes below it to `after`
// bytes from it, laid out with output k's recorded sizes and strides) the slot's for the rest of
// this run; it returns false, changing nothing, when that memory does not hold the slot's
// tensors where the plan puts them. The provider keeps the memory alive until the call runs
// again.
// Later calls (and generated kernels) see the slot there; the next run starts from the arena.
// A provider that says a call `allocates` (Provider::allocates) gets no arena memory for the
// outputs of it the runner lets it adopt: their data is null, and should ATen's memory not fit
// after all, `place(runner, k)` gives output k memory of its own (the runner allocates it on the
// first such run and keeps it) to copy the result into.
struct LibraryCall {
  const ExecutionPlan* plan = nullptr;
  std::uint32_t call = 0;  // index in plan->calls
  std::string_view op;     // "aten::addmm"
  std::uint64_t schema_hash = 0;
  CKernel kind = CKernel::Opaque;
  bool grad_mode = false;
  std::span<const TensorArg> inputs;
  std::span<const TensorArg> outputs;
  std::span<const record::ScalarRecord> scalars;
  void* runner = nullptr;  // for adoptable/adopt; null: no adoption
  bool (*adoptable)(void* runner, std::uint32_t output) = nullptr;
  bool (*adopt)(void* runner, std::uint32_t output, void* data, std::uint64_t before,
                std::uint64_t after) = nullptr;
  // Element 0 of output k in memory of its own when the runner placed it none (its data is
  // null); null when that memory cannot be had.
  void* (*place)(void* runner, std::uint32_t output) = nullptr;
};

struct Provider {
  void* self = nullptr;
  // Required. Performs the call, or says why it cannot (an op it does not know).
  Status (*call)(void* self, const LibraryCall& call) = nullptr;
  // Optional; default: never. Whether call `call` of `plan` computes its results in memory of
  // its own and hands over every one the runner lets it adopt (Note [Adopted results]): the
  // runner then places those outputs no arena memory. Asked once per call, before any run.
  bool (*allocates)(void* self, const ExecutionPlan& plan, std::uint32_t call) = nullptr;
  // Optional; default: nothing. Nothing reads call `call`'s results any more this run (each of
  // them is in an Arena slot past its last use): memory the provider handed over for them may
  // go (so memory ATen allocates later in the run can take its place).
  void (*release)(void* self, std::uint32_t call) = nullptr;
};

// What a backend's run_kernel gets: the kernel and a way to run any of its calls as a library
// call through the provider.
struct KernelLaunch {
  const ExecutionPlan* plan = nullptr;
  std::uint32_t kernel = 0;                       // index in plan->kernels
  std::span<void* const> tensor_data;             // element 0 of every plan tensor, this run
  std::span<const record::ScalarRecord> scalars;  // every scalar of the plan, this run
  void* runner = nullptr;
  Status (*library_call)(void* runner, std::uint32_t call) = nullptr;
};

struct Backend {
  std::string_view name;  // required: "null", "cpu", ...
  void* self = nullptr;   // the backend's own state, passed to every slot
  // Optional; default: nothing to prepare. Called once per Runner before any run: compile the
  // kernels the backend generates, refuse a plan it cannot run.
  Status (*prepare)(void* self, const ExecutionPlan& plan) = nullptr;
  // Optional; default: host memory (std::aligned_alloc). The arena, once per Runner; nullptr
  // when it cannot be had.
  void* (*alloc_arena)(void* self, std::uint64_t bytes, std::uint64_t alignment) = nullptr;
  // Optional; default: std::free. Given what alloc_arena returned.
  void (*free_arena)(void* self, void* arena) = nullptr;
  // Optional; default: every call of the kernel as a library call, in order.
  Status (*run_kernel)(void* self, const KernelLaunch& launch) = nullptr;
  // Optional; default: nothing (host execution is synchronous). Called at the end of each run.
  Status (*synchronize)(void* self) = nullptr;
  // Optional; default: the plan's own (plan_memory_use). Called once after prepare: how the
  // backend touches memory (Note [Memory use], ExecutionPlan.h), from which the Runner places
  // its arena. An untouched slot's tensors have no memory (null in KernelLaunch::tensor_data).
  Status (*memory_use)(void* self, const ExecutionPlan& plan, MemoryUse& use) = nullptr;
};

// The defaults of the optional slots, for a backend to call from its own (the null backend
// names each one).
Status default_prepare(void* self, const ExecutionPlan& plan);
void* default_alloc_arena(void* self, std::uint64_t bytes, std::uint64_t alignment);
void default_free_arena(void* self, void* arena);
Status default_run_kernel(void* self, const KernelLaunch& launch);
Status default_synchronize(void* self);
Status default_memory_use(void* self, const ExecutionPlan& plan, MemoryUse& use);

// The backend with every empty optional slot set to its default, or an error naming a required
// slot that is empty.
Result<Backend> with_defaults(Backend backend);

}  // namespace crucible::exec
