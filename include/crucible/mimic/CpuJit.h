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
#include <optional>
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

// Note [Vector math]: softmax and log_softmax are ATen's bits only with ATen's own exp and log
// (SLEEF's 1-ulp vector functions, which are not correctly rounded, misc/ATEN_ORDER.md 4.2), at
// the vector width ATen's softmax kernel runs at on this host. Mimic does not carry them: the
// host that has them (the Vessel, from the libtorch it runs in) gives their addresses once per
// process, and generated code calls them as crucible_vexp_f32 / _f64 and crucible_vlog_f32 /
// _f64, each over one vector of vector_bytes. Without them such kernels are not generated.
struct VectorMath {
  std::string name;            // what they compute ("sleef_u10/AVX512"): part of each program using them
  unsigned vector_bytes = 0;   // 64 or 32
  void* exp_f32 = nullptr;     // <vector_bytes/4 x float> -> same
  void* exp_f64 = nullptr;     // <vector_bytes/8 x double> -> same
  void* log_f32 = nullptr;
  void* log_f64 = nullptr;
};

// Gives the process its vector math. Errors: a width other than 32 or 64 bytes, a null
// function, a width this host's CPU lacks, or other functions than a previous call gave (one
// set per process: compiled kernels call them by name).
Status set_vector_math(const VectorMath& m);
// The process's vector math, if given.
std::optional<VectorMath> vector_math();
// Why the host has none to give (a CPU capability whose kernels use other functions, a
// library that does not export them): said when a softmax is not generated. Empty: not said.
void set_no_vector_math(std::string why);
std::string no_vector_math();

// The kernel for `program` under `recipe` (its text) on this host. `disk` may be null (no
// second level). Errors: the code generator's or the JIT's. A disk entry that cannot be
// written is not an error (the kernel runs; the next process compiles it again): it is counted
// in `stats` with its reason.
Result<std::shared_ptr<const CompiledPointwise>> get_pointwise(const PointwiseProgram& program,
                                                               std::string_view recipe,
                                                               const ObjectCache* disk,
                                                               CacheStats* stats);

}  // namespace crucible::mimic
