// ExecReplay.h — the exec stage on recorded steps, inside the _crucible_exec module: a step's
// ops planned the whole way (trace -> IR001 -> Forge's front end -> IR002 -> ExecutionPlan) and
// a Runner over them on the null backend or Mimic's CPU backend, library calls through the ATen
// provider; and crucible.compile's plans run through it (Note [Exec replay], ReplayPlan.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "AtenProvider.h"
#include "crucible/exec/BuildPlan.h"
#include "crucible/exec/Runner.h"
#include "crucible/mimic/CpuBackend.h"
#include "crucible/record/Trace.h"

namespace crucible::vessel {

struct ExecStep {
  forge::ExprPool pool;
  exec::SteppedPlan sp;
  AtenProvider provider;
  std::unique_ptr<mimic::CpuBackend> cpu;  // backend "cpu": Mimic's generated kernels
  std::unique_ptr<exec::Runner> runner;
  std::size_t recomputed = 0;  // values computed again in the backward (Note [Rematerialization])

  // Generated calls over all kernels (0 on the null backend).
  std::uint32_t generated_calls() const;
};

// What to plan and how.
struct ExecStepOptions {
  std::string rules_dir, hardware = "cpu-avx2";
  std::string backend = "null";  // "null" or "cpu"
  // Storages whose values Python holds after the step (the loss, gradients): they escape
  // beside the IR's live-out values.
  std::vector<std::uint64_t> escaping;
  // The caller knows everything Python can see after the step: a value of a storage the step
  // makes escapes only when that storage is in `escaping` (by default also every value no node
  // reads: a layer norm's mean, AccumulateGrad's copy of a gradient the caller binds uncopied),
  // so the others stay in the arena and the nodes only they need are removed (forge::dce).
  bool exact_escaping = false;
  // Scalars set each run: the Double scalar argument `arg` of the op recorded at trace index
  // `trace_op`, and the Python numbers (wrapped 0-d tensors) in storage `storage` the plan
  // holds as constants (one it binds as an input is written in place by its caller). The
  // plan's patch points come in this order: scalar ones, then constant ones that exist;
  // `constant_patched` says which did.
  struct ArgPatch {
    std::size_t trace_op = 0;
    std::uint32_t arg = 0;
  };
  std::vector<ArgPatch> scalar_patches;
  std::vector<std::uint64_t> constant_patches;
  bool memory_only_cache = false;  // the cpu backend's kernels stay out of the disk cache
  // The cpu backend's numerics="fast" (Note [Fast numerics], CpuBackend.cpp); else bit-exact.
  bool fast = false;
};

// Plans ops `ops` of `t`. Errors: the rules, IR001, the front end, build_plan, a patch that
// names no Double argument of a planned call, the backend, the Runner. `scalar_patch_of`: per
// scalar patch point of the plan, which of options.scalar_patches it is (one op computed twice,
// Note [Rematerialization], has its argument patched in both calls).
Result<std::unique_ptr<ExecStep>> plan_exec_step(const record::Trace& t, std::span<const std::size_t> ops,
                                                 const ExecStepOptions& options,
                                                 std::vector<bool>* constant_patched = nullptr,
                                                 std::vector<std::uint32_t>* scalar_patch_of = nullptr);

// Note [Exec replay]: runs crucible.compile's plan `plan` (a whole-step plan) through the exec
// stage on `backend`, its captured call being ops [begin, end) of `t`; `arg_storages` are the
// storage ids of the call's tensor arguments. Returns "" or why it cannot (also kept as the
// plan's exec_note): the plan keeps running its ATen ops then. `form`: the captured call's form
// when it is not the plan's own (a call recorded after the plan was built, which plan_update
// found to repeat it: its externals name the storages of its trace ops); -1 for the plan's.
std::string attach_exec(std::int64_t plan, const record::Trace& t, std::size_t begin, std::size_t end,
                        const std::vector<std::uint64_t>& arg_storages, const ExecStepOptions& options,
                        std::int64_t form = -1);

// Note [Bound exec plans] (ExecReplay.cpp): the exec stage of plan `bound` (bound to new sizes,
// Note [Bound sizes]) from the exec stages of plans `plan_a` and `plan_b` at the two sizes its
// binding was made from: their exec plan with every integer evaluated at the bound sizes, the
// arena placed again. Returns "" or why not (the plan keeps running its ATen ops then).
std::string bind_exec(std::int64_t bound, std::int64_t plan_a, std::int64_t plan_b);

}  // namespace crucible::vessel
