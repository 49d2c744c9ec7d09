// Dispatch.h — the PyTorch Vessel's dispatcher side (libcrucible_dispatch.so).
//
// A boxed fallback on one dispatch key sees every op the calling thread dispatches while the
// key is in its thread-local included set: forward ops above Autograd, backward ops from the
// autograd engine (whose GraphTask carries the TLS to its workers), optimizer ops, factory
// functions. See misc/CRUCIBLE.md, Note [One op level], for which ops are recorded.
//
// The key: DispatchKey::Crucible when the PyTorch headers have it (patches/), else
// DispatchKey::TESTING_ONLY_GenericMode, which stock PyTorch leaves unregistered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <c10/core/Storage.h>

#include "crucible/core/Status.h"

namespace crucible::vessel {

// Registers the fallback (once per process) and, with unboxed_kernels, a typed recording
// kernel for each hot op (Unboxed.cpp), which records the same bytes faster. Refuses with a
// clear error if another library already registered a fallback on the key.
Status install(bool unboxed_kernels = true);
// Instead of install(), for a benchmark: kernels on the key that record nothing, only exclude
// the key and redispatch (Note [Key floor], Dispatch.cpp). Refused after install(), and
// install() is refused after it.
Status install_key_floor();
// The rung the typed kernels run at (Note [Ablation build], Capture.h): "full" except in an
// ablation build whose install() read CRUCIBLE_VESSEL_ABLATE.
const char* ablation_name();
// Whether this build has the ablation switches (-DCRUCIBLE_VESSEL_ABLATION=ON).
bool has_ablation_switches();
std::size_t unboxed_kernel_count();  // 0 until installed with unboxed kernels
// Composite ops the key falls through (Unboxed.cpp, Note [Composite fallthroughs]); 0 until
// installed.
std::size_t composite_fallthrough_count();
bool installed();
// Whether install_key_floor() installed the key's kernels in this process (then nothing records).
bool key_floor_installed();
// Name of the key in use ("Crucible" or "TESTING_ONLY_GenericMode").
const char* dispatch_key_name();

// Recording on/off for the calling thread (a thread-local dispatch key toggle). Turning it on
// in a forked child throws (Note [Forked children]).
void set_enabled(bool on);
bool is_enabled();

// Note [Forked children] (Dispatch.cpp): whether this process is a fork of one that loaded
// Crucible (watch_forks() registers the handler that says so; call it once, at load).
bool forked_child();
void watch_forks();
// The error for what a forked child cannot do ("crucible: <what> in a forked process: ...").
std::string forked_child_error(const std::string& what);

// Module scope of the calling thread (forward pre/post hooks call these). push_module_id
// returns the scope depth before the push; pop_modules_to(depth) goes back to it, dropping
// whatever a forward that raised left above it (the outermost scope, 0, always stays).
std::size_t push_module_id(std::uint32_t module_id);
void pop_modules_to(std::size_t depth);
// pop_modules_to(depth) if the scope at `depth` is `module_id` (a call of that module that
// never returned); else nothing.
void pop_modules_to_if(std::size_t depth, std::uint32_t module_id);

// Crucible's id of a storage (the same id recorded tensor metadata carries).
std::uint64_t storage_id(const c10::Storage& s);
// How new storages are named: "allocation tags" (Note [Allocation tags]), or why the
// weak-reference table names them all.
std::string storage_id_scheme();
// For tests: does the storage's memory carry its id? How many raw frees were of tagged blocks?
bool storage_is_tagged(const c10::Storage& s);
std::uint64_t tagged_raw_frees();

// Counters (all threads) of what the fallback saw but did not record, for stats().
struct SkipCounters {
  std::uint64_t internal = 0;   // ops called from inside another op's kernel
  std::uint64_t decomposed = 0; // composite ops recorded as the ops they decompose into
  std::uint64_t profiler = 0;   // profiler::_record_function_* markers
};
SkipCounters skip_counters();

}  // namespace crucible::vessel
