// NullBackend.cpp — every kernel a sequence of library calls. A new backend starts as a copy of
// this file: each slot below is where its own work goes (prepare compiles the kernels it
// generates, run_kernel launches them and sends the rest to launch.library_call).
#include "crucible/exec/NullBackend.h"

namespace crucible::exec {
namespace {

Status null_prepare(void* self, const ExecutionPlan& plan) { return default_prepare(self, plan); }

void* null_alloc_arena(void* self, std::uint64_t bytes, std::uint64_t alignment) {
  return default_alloc_arena(self, bytes, alignment);
}

void null_free_arena(void* self, void* arena) { default_free_arena(self, arena); }

Status null_run_kernel(void* self, const KernelLaunch& launch) {
  return default_run_kernel(self, launch);  // each call through the provider, in order
}

Status null_synchronize(void* self) { return default_synchronize(self); }

// Every call runs alone, each in memory: the plan's own placement.
Status null_memory_use(void* self, const ExecutionPlan& plan, MemoryUse& use) {
  return default_memory_use(self, plan, use);
}

}  // namespace

Backend null_backend() {
  Backend b;
  b.name = "null";
  b.prepare = null_prepare;
  b.alloc_arena = null_alloc_arena;
  b.free_arena = null_free_arena;
  b.run_kernel = null_run_kernel;
  b.synchronize = null_synchronize;
  b.memory_use = null_memory_use;
  return b;
}

}  // namespace crucible::exec
