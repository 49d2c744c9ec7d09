// CpuJit.h — compiled pointwise kernels for this process: the kernel cache's first level (in
// memory, graph::KernelCache) over its second (ObjectCache on disk) over the code generator,
// and the ORC JIT that links the objects into the process.
//
// Threads: get_pointwise may be called from any thread. Lookups in memory share a lock;
// loading or compiling a missing kernel holds one process-wide mutex (two threads wanting the
// same new kernel compile it once). Kernels stay loaded for the life of the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "crucible/core/Status.h"
#include "crucible/mimic/CpuCodegen.h"
#include "crucible/mimic/ObjectCache.h"
#include "crucible/mimic/PointwiseProgram.h"

namespace crucible::mimic {

struct CompiledPointwise {
  ContigFn contig = nullptr;
  StridedFn strided = nullptr;
  ContigFn contig_fused = nullptr;  // a program with AddScaled/SubScaled/Lerp only
  std::string key;  // the cache key's text
};

// Where each kernel a caller asked for came from, and what it cost.
struct CacheStats {
  std::uint32_t memory_hits = 0;
  std::uint32_t disk_hits = 0;
  std::uint32_t compiled = 0;
  std::uint32_t disk_rejected = 0;        // bad entries removed and compiled again
  double compile_seconds = 0;             // code generation, LLVM included
  double load_seconds = 0;                // reading and linking objects (disk hits and fresh ones)
  std::uint32_t disk_write_failures = 0;  // compiled kernels that could not be stored
  std::string last_disk_problem;          // why the last entry was rejected or not stored
};

// The kernel for `program` under `recipe` (its text) on this host. `disk` may be null (no
// second level). Errors: the code generator's or the JIT's. A disk entry that cannot be
// written is not an error (the kernel runs; the next process compiles it again): it is counted
// in `stats` with its reason.
Result<std::shared_ptr<const CompiledPointwise>> get_pointwise(const PointwiseProgram& program,
                                                               std::string_view recipe,
                                                               const ObjectCache* disk,
                                                               CacheStats* stats);

}  // namespace crucible::mimic
