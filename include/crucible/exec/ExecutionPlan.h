// ExecutionPlan.h — the plan format: what runs, in which order, on which memory, for one
// recorded step. Built from Forge's IR002 (BuildPlan.h), checked by verify_plan
// (VerifyPlan.h), run by a Runner on a backend (Runner.h, Backend.h).
//
// Note [Plan layout]: flat tables indexed by 32-bit ids, no pointers between them, so a plan
// can be copied, compared and checked table by table.
//
//   kernels   one per IR002 kernel, in execution order; each runs a range of calls
//   calls     one per IR001 node that does work, in execution order; a VIEW node whose
//             outputs alias its input's storage does no work and has no call: its outputs are
//             tensors (views) like any other
//   args      the tensors of each call, inputs then outputs, with their schema positions
//   tensors   a slot, an element offset in it, sizes and strides (in `dims`), a dtype
//   slots     memory: one per storage the step touches —
//               Arena     produced and dead inside the step: an offset in the arena
//               Input     from outside (parameters, gradients, optimizer state, batch inputs):
//                         an input patch point, its memory bound by the caller each run
//               Output    produced inside the step and read after it (escaping): memory bound
//                         by the caller each run
//               Constant  a Python number as a 0-d tensor: written into the arena at its
//                         offset before each run (a patch point may change the value)
//   scalars   every call's non-tensor arguments (record::ScalarRecord), in call order
//   patches   scalars and constants the caller sets each run (a learning rate)
//
// A slot's lifetime is [first, last], the first and last call that touch it; an Arena slot's
// first call writes it (produces it). Note [Kernel lifetimes]: two Arena or Constant slots live
// in one kernel never overlap — a slot is placed as live from the first call of the kernel of
// its first call to the last call of the kernel of its last call — because a backend may run a
// kernel's calls fused, element by element (the CPU backend's generated loops): a slot an early
// call of a kernel reads must not share memory with one a later call of it writes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <utility>

#include "crucible/core/CKernel.h"
#include "crucible/core/Status.h"
#include "crucible/forge/Ir002.h"
#include "crucible/record/TraceRecord.h"

namespace crucible::exec {

inline constexpr std::uint32_t kNone = UINT32_MAX;

enum class SlotKind : std::uint8_t { Arena = 0, Input = 1, Output = 2, Constant = 3 };
const char* slot_kind_name(SlotKind k) noexcept;

struct Slot {
  SlotKind kind = SlotKind::Arena;
  std::int8_t dtype = -1;             // Constant: the value's dtype (c10 ordinal)
  std::uint32_t first = 0, last = 0;  // calls, inclusive
  std::uint32_t binding = kNone;      // Input: index in inputs; Output: index in outputs
  std::uint64_t bytes = 0;            // Arena, Constant: aligned size; Input, Output: storage size
  std::uint64_t offset = 0;           // Arena, Constant: offset in the arena
  std::uint64_t storage = 0;          // the recorded storage id (for messages)
  double value = 0;                   // Constant: the recorded value
};

// TensorRef::flags
inline constexpr std::uint8_t kWrappedNumber = 1;  // a Python number: type promotion treats it so

struct TensorRef {
  std::uint32_t slot = kNone;
  std::int8_t dtype = -1;
  std::uint8_t flags = 0;
  std::uint16_t ndim = 0;
  std::uint32_t dims = 0;       // sizes at dims[dims, dims + ndim), strides after them
  std::uint32_t value = kNone;  // the IR001 value (for messages)
  std::int64_t offset = 0;      // elements from the slot's start
};

struct Arg {
  std::uint32_t tensor = kNone;
  std::uint32_t arg_index = 0;   // schema argument (inputs) or return (outputs) position
  std::uint32_t list_index = 0;  // index inside a tensor list
};

struct Call {
  std::uint32_t node = 0;  // IR001 node
  std::uint32_t op = 0;    // index in op_names
  std::uint64_t schema_hash = 0;
  CKernel kind = CKernel::Opaque;
  record::Phase phase = record::Phase::Forward;
  bool grad_mode = false;                      // autograd's grad mode when it was recorded
  std::uint32_t in_begin = 0, in_count = 0;    // in args
  std::uint32_t out_begin = 0, out_count = 0;  // in args, after the inputs
  std::uint32_t scalar_begin = 0, scalar_count = 0;
};

struct Kernel {
  std::uint32_t group = 0;  // IR002 group
  forge::KernelTemplate kernel = forge::KernelTemplate::Opaque;
  const forge::NumericalRecipe* recipe = nullptr;
  std::uint32_t call_begin = 0, call_count = 0;
};

enum class PatchKind : std::uint8_t { Scalar = 0, Constant = 1 };
struct PatchPoint {
  PatchKind kind = PatchKind::Scalar;
  std::uint32_t index = 0;  // Scalar: in scalars (its bits are replaced); Constant: a slot
  std::string name;
};

struct ExecutionPlan {
  std::uint64_t alignment = 64;  // of every Arena and Constant offset; a power of two
  std::uint64_t arena_bytes = 0;
  std::vector<Kernel> kernels;
  std::vector<Call> calls;
  std::vector<Arg> args;
  std::vector<TensorRef> tensors;
  std::vector<std::int64_t> dims;
  std::vector<Slot> slots;
  std::vector<record::ScalarRecord> scalars;
  std::vector<std::string> op_names;
  std::vector<std::uint32_t> inputs;   // the Input slot of each input binding
  std::vector<std::uint32_t> outputs;  // the Output slot of each output binding
  std::vector<std::uint32_t> results;  // tensors of the values live after the step
  std::vector<PatchPoint> patches;
  std::uint32_t elided_views = 0;  // VIEW nodes that became tensors, not calls

  // Accessors for a plan verify_plan accepted (its ranges are in bounds).
  std::span<const std::int64_t> sizes(const TensorRef& t) const {
    return std::span<const std::int64_t>(dims).subspan(t.dims, t.ndim);
  }
  std::span<const std::int64_t> strides(const TensorRef& t) const {
    return std::span<const std::int64_t>(dims).subspan(t.dims + t.ndim, t.ndim);
  }
  std::span<const Arg> inputs_of(const Call& c) const {
    return std::span<const Arg>(args).subspan(c.in_begin, c.in_count);
  }
  std::span<const Arg> outputs_of(const Call& c) const {
    return std::span<const Arg>(args).subspan(c.out_begin, c.out_count);
  }
  std::span<const record::ScalarRecord> scalars_of(const Call& c) const {
    return std::span<const record::ScalarRecord>(scalars).subspan(c.scalar_begin, c.scalar_count);
  }
};

// One line per kernel, call and slot: what a plan holds, for messages and debugging.
std::string describe(const ExecutionPlan& plan);

// Per call, the first and last call of its kernel (Note [Kernel lifetimes]); calls no kernel
// covers are their own span.
std::vector<std::pair<std::uint32_t, std::uint32_t>> kernel_spans(const ExecutionPlan& plan);

// Note [Memory use]: the plan's own placement serves any backend — a slot is live over whole
// kernels (Note [Kernel lifetimes]) and every slot has memory. A backend that has prepared
// knows better: which calls it runs together, element by element (a generated loop's), and
// which Arena slots it never touches in memory (values its generated code keeps in registers:
// a fused chain's intermediates). The Runner places its own arena from that.
struct MemoryUse {
  // Per call, the first and last call it runs together with (each call inside its span).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> spans;
  // Per slot (or empty: none): an Arena slot no call reads or writes in memory gets none.
  std::vector<bool> untouched;
  // Per call (or empty: every call): the backend runs it only as a library call, through the
  // provider — never by code of its own, which would need its outputs in placed memory.
  std::vector<bool> library_only;
};
// The plan's own memory use: kernel_spans, every slot touched.
MemoryUse plan_memory_use(const ExecutionPlan& plan);

struct ArenaLayout {
  std::vector<std::uint64_t> offsets;  // per slot: an Arena or Constant slot's offset, else 0
  std::vector<bool> placed;            // per slot: has memory in the arena
  std::vector<std::pair<std::uint32_t, std::uint32_t>> live;  // per slot: first and last call placed for
  std::uint64_t arena_bytes = 0;
};
// Whether `use` fits `plan`: one span per call holding its call, flags of the plan's lengths (or
// none), untouched slots Arena slots only.
Status check_memory_use(const ExecutionPlan& plan, const MemoryUse& use);

// Arena and Constant slots (but untouched ones) placed by the graph stage's planner, each live
// from the first call of its first call's span (a Constant: from the first call, it is written
// before the run) to the last call of its last call's span, at the plan's alignment. Errors:
// check_memory_use's.
Result<ArenaLayout> place_arena(const ExecutionPlan& plan, const MemoryUse& use);

}  // namespace crucible::exec
