// Backend.cpp — the defaults of a backend's optional slots, and with_defaults().
#include "crucible/exec/Backend.h"

#include <cstdlib>
#include <string>

namespace crucible::exec {

Status default_prepare(void*, const ExecutionPlan&) { return ok_status(); }

void* default_alloc_arena(void*, std::uint64_t bytes, std::uint64_t alignment) {
  // aligned_alloc wants a size that is a multiple of the alignment, and some memory even for an
  // empty arena so that every run has a base to offset from.
  const std::uint64_t a = alignment < sizeof(void*) ? sizeof(void*) : alignment;
  const std::uint64_t size = bytes == 0 ? a : (bytes + a - 1) / a * a;
  return std::aligned_alloc(static_cast<std::size_t>(a), static_cast<std::size_t>(size));
}

void default_free_arena(void*, void* arena) { std::free(arena); }

Status default_run_kernel(void*, const KernelLaunch& launch) {
  const Kernel& k = launch.plan->kernels[launch.kernel];
  for (std::uint32_t c = k.call_begin; c < k.call_begin + k.call_count; ++c)
    if (Status st = launch.library_call(launch.runner, c); !st.ok()) return st;
  return ok_status();
}

Status default_synchronize(void*) { return ok_status(); }

Status default_memory_use(void*, const ExecutionPlan& plan, MemoryUse& use) {
  use = plan_memory_use(plan);
  return ok_status();
}

Result<Backend> with_defaults(Backend b) {
  if (b.name.empty())
    return invalid_input("a backend without a name", "set Backend::name (\"null\", \"cpu\", ...)");
  if (b.prepare == nullptr) b.prepare = default_prepare;
  if (b.alloc_arena == nullptr) b.alloc_arena = default_alloc_arena;
  if (b.free_arena == nullptr) b.free_arena = default_free_arena;
  if (b.run_kernel == nullptr) b.run_kernel = default_run_kernel;
  if (b.synchronize == nullptr) b.synchronize = default_synchronize;
  if (b.memory_use == nullptr) b.memory_use = default_memory_use;
  return b;
}

}  // namespace crucible::exec
