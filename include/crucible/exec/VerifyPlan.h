// VerifyPlan.h — the invariants every execution plan keeps, checked before anything runs.
//
// verify_plan checks, in O(size log size):
//   * tables: every id in range (kernels' call ranges, calls' arg and scalar ranges, args'
//     tensors, tensors' slots and dims, bindings, results, patches), kernels covering the calls
//     in order, each call's op name present;
//   * memory: the alignment a power of two; every Arena and Constant slot aligned, not empty and
//     inside arena_bytes; no two of them live at one call overlapping (graph::overlapping_pair);
//     every tensor's elements inside its slot (offset and strides included, dtype known);
//   * order: every call that touches a slot lies inside the slot's lifetime; an Arena slot is
//     first touched by a call that writes it (produced before it is read), and an Output slot
//     is written before it is read; Input and Constant slots are ready before the first call;
//   * bindings: each Input and Output slot bound exactly once, each binding naming a slot of its
//     kind; each patch naming a scalar or a Constant slot, once.
// The error names the first broken invariant, where (kernel, call and op, slot and storage) and
// what should hold. A plan that fails is never run.
#pragma once

#include "crucible/core/Status.h"
#include "crucible/exec/ExecutionPlan.h"

namespace crucible::exec {

Status verify_plan(const ExecutionPlan& plan);

}  // namespace crucible::exec
