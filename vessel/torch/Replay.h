// Replay.h — crucible.compile's native side: capture a call of a training step, turn two
// captured calls into an ExecutionPlan, and run that plan from one C++ call.
//
// Capture: while a call of the step runs, the recording fallback (and the unboxed kernels)
// append every recorded op — the one op level of Note [One op level] — with its real
// arguments and results to a per-thread Capture.
//
// Form: a capture with every tensor named by where it comes from: a step argument (patch
// point), the output of an earlier op (a slot), a view of either, or an external — a tensor
// no recorded op produced (parameter, buffer, gradient, optimizer state, constant). Scalars
// are constants. Gradients the autograd engine stored into a parameter's .grad (not an op)
// are read after the call and become grad bindings.
//
// Plan: two forms of the same signature must agree op by op: the same ops, the same wiring,
// the same scalars, and the same external tensors (or, for tensors Python makes afresh each
// call, equal values). Anything that differs has no known source, and the plan is refused
// with the op, the argument and both values. See misc/CRUCIBLE.md, "Replay".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace crucible::vessel {

// Starts capturing the calling thread's ops (turns recording on for the thread; with
// capture_only the ops are not also written to the trace rings). Throws if a capture is
// already active on this thread.
// Note [Warnings of a plan run] (Replay.cpp): the warnings ATen's kernels gave during a plan
// run, handed over after it (before its error when it raised). The Python extension's sink warns
// in Python as eager's binding does; it may throw (a warning a filter made an error) unless
// `run_failed`. Without a sink they go to the thread's warning handler (stderr by default).
struct RunWarning {
  bool deprecation = false;  // DeprecationWarning, else UserWarning
  std::string message;       // as eager's binding words it (the C++ location added unless verbatim)
};
using WarningSink = void (*)(const std::vector<RunWarning>& warnings, bool run_failed);
void set_warning_sink(WarningSink sink);

// Whether the calling thread's last plan run raised because the plan's guard failed (a
// persistent tensor or a .grad changed; nothing ran), and clears it. crucible.compile asks it
// when a run raises, instead of reading the message.
bool take_guard_failure();

void capture_start(bool capture_only);
// Closes the innermost mark the capture_mark op opened (backward() or an optimizer step
// returned).
void capture_mark_end();
// Stops capturing and restores the thread's recording state. The capture waits for
// capture_finish (the crucible::capture_finish op, which receives the call's tensors).
void capture_stop();
// Drops a stopped capture that will not be finished (the step raised).
void capture_discard();

// A finished capture's form: its ops and its content hash (the plan it would give).
struct FormInfo {
  std::size_t ops = 0;
  std::string hash;  // hex of the content hash (no data pointers)
};
FormInfo form_info(std::int64_t form);
void form_release(std::int64_t form);

// A known source of a scalar that changes between calls: the value Python's replica of a
// recognized optimizer's arithmetic gives for the argument `arg` of op `op` ("aten::addcdiv_",
// "value") in one call. Sources come as lists in a fixed order (one entry per parameter and
// formula); a plan run takes the list's values for the coming call.
struct ScalarSource {
  std::string op;
  std::string arg;
  double value = 0;
  // The data pointer of the tensor the source belongs to (its parameter, or Adam's
  // exp_avg_sq), 0 for none: a source only feeds an op that reads that tensor (directly or
  // through the op that produced an input), so two groups that happen to share a learning
  // rate while the plan is built never feed each other's ops.
  std::uintptr_t anchor = 0;
};

// Builds (or fetches from the cache) the plan of two forms of one call signature, given the
// scalar sources' values during each of the two calls (empty when there are none). A scalar
// that differs between the forms becomes a patch point when a source feeding that op and
// argument gives both values bit for bit; otherwise this throws std::runtime_error saying
// which op and argument differ. `runs_on` names what runs the plan's ops ("replay",
// "cpu/bitwise", ...: Note [Exec replay]); plans are shared only between callers that name the
// same, so one caller's exec stage never replaces another's.
std::int64_t plan_build(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                        const std::vector<ScalarSource>& sources_b, const std::string& runs_on = "");
// Note [Size families] (Replay.cpp): the plan of one captured call at new sizes of a whole-step
// plan's signature (another sequence length, a short last batch), built without a second
// capture: the call must repeat the plan's form op for op, wiring, scalars and persistent
// tensors alike, every integer it differs in explained by the argument sizes that differ (a
// view's [4, S, 64], an arange(S)), sizes 0 and 1 never taken for one another; the plan's patch
// points stay patch points. Throws std::runtime_error with the first difference otherwise.
std::int64_t plan_build_like(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources,
                             const std::string& runs_on = "");
// Note [Size families]: the plan of form b from two captured calls of one size family at
// different sizes (the first call of each of two sizes, before either has a plan): b must
// repeat a at its own sizes as plan_build_like's call repeats its plan; scalars that differ and
// are fed by a source become patch points.
std::int64_t plan_build_pair(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                             const std::vector<ScalarSource>& sources_b, const std::string& runs_on = "");
void plan_release(std::int64_t plan);

// Note [Sync-point execution] (Sync.cpp). A sync-point plan: built like plan_build, except
// that a scalar or tensor Python makes anew each call with another value is taken from the
// call (its Python runs) instead of refusing the plan; only structural differences (other
// ops, other wiring) refuse it.
std::int64_t plan_build_sync(std::int64_t form_a, std::int64_t form_b, const std::vector<ScalarSource>& sources_a,
                             const std::vector<ScalarSource>& sources_b);
// Whether a captured call took the same path as a plan's (or as another captured call): the
// same ops and wiring, whatever scalars and Python-made tensors it had. A sync-point step keeps
// a plan per path it takes (the crucible::sync_start op gets them all).
// Note [Size families] for a sync-point plan: the plan of one captured call at new sizes, which
// must repeat the plan at its own sizes as plan_build_like's does; what the plan takes from
// each call stays taken from each call.
std::int64_t plan_build_sync_like(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources);
bool plan_same_path(std::int64_t plan, std::int64_t form);
bool forms_same_path(std::int64_t form_a, std::int64_t form_b);
// During a sync-point call (begun by the crucible::sync_start op): the optimizer with index
// `tag` is about to step; if the plan's next ops are that step's and may run natively, runs
// them (the sources' values in `scalars`) and returns true; else false (the step runs eagerly
// and its ops are matched). guards_ok: per plan the call got, whether the optimizers' state
// still is what it was recorded from (the step runs eagerly where the current plan's is not).
// With `external` (the caller has its own plan of that optimizer's step, Note [Optimizer
// plans] in Sync.cpp): where the stretch may run natively and nothing after it reads what it
// makes, the call is suspended instead and 2 returned; the caller runs the step, then
// sync_resume. Returns 0 (run it eagerly), 1 (ran natively) or 2. `scalars` is asked only when
// the stretch runs here.
int sync_optimizer(std::int64_t tag, const std::function<std::vector<double>()>& scalars,
                   const std::vector<bool>& guards_ok, bool external);
// Resumes the call sync_optimizer suspended, the step's stretch done (`native`: by a plan).
void sync_resume(bool native);
// Excludes (paused) or readmits the recording key on the calling thread; returns whether it
// was excluded. Python's own reads during a sync-point call (the optimizer sources' step
// counters) are not the step's ops.
bool sync_set_paused(bool paused);
struct SyncResult {
  bool matched = false;       // every op of the call matched the plan
  std::string why;            // the first mismatch
  std::size_t plan_ops = 0, matched_ops = 0, native_ops = 0, native_segments = 0;
  std::vector<std::string> eager_stretches;  // why a backward() or step() of the call ran eagerly
  std::size_t variant = 0;                   // the plan (of those sync_start got) the call ended on
  std::size_t switches = 0;                  // times it moved to another plan at a branch
  bool stale = false;                        // an optimizer step ran eagerly: its plan's guard failed
};
// Ends the thread's sync-point call (also after the step raised).
SyncResult sync_end();
// Arena on (the default; planned on the next run) or off.
void plan_set_arena(std::int64_t plan, bool on);
// Why the plan does not run through the exec stage (Note [Exec replay]), when the reason is not
// the exec stage's own (its module or rules are missing): plan_info's exec_note.
void plan_set_exec_note(std::int64_t plan, const std::string& note);

// Bytes the calling thread allocates through PyTorch's CPU allocator between start and stop:
// (peak live bytes, 64-aligned; number of allocations). For comparing an eager step with a
// plan's arena.
void alloc_measure_start();
std::pair<std::size_t, std::size_t> alloc_measure_stop();
// Does a newly captured form repeat the plan's (the same ops, wiring, scalars and persistent
// tensors; at patch points, the sources' values for that call)? "" when it does, else the
// first difference (a verification call uses this).
std::string plan_check(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources);
// After the guard saw the step's state change, a call captured since is compared with the
// plan. Accepted: (1) scalars that moved and are fed by a source (a new learning rate: the
// SGD step -lr, AdamW's 1 - lr*weight_decay, Adam's step size), which become patch points —
// later changes of that hyperparameter need no update; (2) persistent tensors that are other
// objects with the same metadata (a loaded optimizer state, a replaced parameter), which the
// plan binds instead. Returns "" (with how many patch points were added and tensors rebound)
// or the first other difference, with the plan unchanged.
std::string plan_update(std::int64_t plan, std::int64_t form, const std::vector<ScalarSource>& sources,
                        std::size_t* added, std::size_t* rebound);

struct PlanInfo {
  std::size_t ops = 0;             // kernel calls per run
  std::size_t slots = 0;           // intermediate tensors
  std::size_t externals = 0;       // persistent tensors bound in place
  std::size_t constants = 0;       // tensors Python made afresh each call with equal values
  std::size_t views = 0;           // views rebuilt from their base each run
  std::size_t grad_bindings = 0;   // .grad fields set after each run
  std::vector<std::string> grad_checks;  // per parameter: .grad before a run must be "none", "any" or the "accumulate" target
  std::size_t args = 0;            // tensor patch points
  std::size_t outputs = 0;
  std::string arena;               // "ready", "unplanned" or "off: why"
  std::size_t arena_bytes = 0;     // static arena of the plan's intermediates
  std::size_t arena_lower_bound = 0;
  std::size_t arena_served = 0;    // allocations per run served from the arena
  std::size_t arena_in_exec = 0;   // of them, placed in the exec arena's free bytes (Note [One arena])
  std::size_t arena_escaping = 0;  // allocations per run that outlive it (outputs, .grad)
  std::uint64_t arena_runs = 0, arena_mismatches = 0;
  std::size_t patches = 0;         // scalar patch points
  std::size_t sources = 0;         // scalar sources a run takes
  std::uint64_t runs = 0;
  std::string hash;
  double build_ms = 0;
  std::vector<std::string> op_names;  // per kernel call, "aten::addmm (forward)"
  // per kernel call, its results' sizes: where the plan has a sibling (Note [Size families]),
  // each size that differs from the sibling's as a function of the varying argument sizes S0,
  // S1, ... ("[4*S0, 64]"; "8208?" where no fit explains it), else as recorded
  std::vector<std::string> shapes;
  std::vector<std::string> constant_uses;  // where each constant is first read, and what it is
  std::vector<std::string> value_reads;    // .item() outside the optimizer: Python saw a tensor's value
  bool sync = false;                       // a sync-point plan (plan_build_sync)
  std::vector<std::string> segments;       // its backward()/step() stretches: "native" or why not
  std::size_t live_args = 0, live_exts = 0;  // scalars and tensors taken from each call
  // Note [Exec replay] (ReplayPlan.h): the exec stage's backend the plan runs on ("" when it
  // runs its ops itself), what that plan holds, and why a plan asked to run there does not.
  std::string exec, exec_numerics, exec_summary, exec_note;
  std::size_t exec_kernels = 0, exec_calls = 0, exec_generated_calls = 0;
  std::vector<std::string> exec_generated_ops;  // per generated call, its operator
};
PlanInfo plan_info(std::int64_t plan);

// Counters over all plans.
struct ReplayCounters {
  std::uint64_t captures = 0, forms = 0, plan_builds = 0, plan_cache_hits = 0, runs = 0;
};
ReplayCounters replay_counters();

}  // namespace crucible::vessel
